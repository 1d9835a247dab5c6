"""Predictions from a checkpoint alone, on raw rows or images: ``Predictor.from_checkpoint(p).predict(df)``.
Inputs go through what the run fitted to read them (:class:`ItemReading`), ``predict_step``, then
:func:`prediction_frame`, as ``python -m src.cli predict`` does under the Trainer."""

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd
import torch

from src.checkpoints import load_model, resolve
from src.errors import UserInputError

if TYPE_CHECKING:  # Lightning is imported when a model is loaded
    from lightning import LightningModule


@runtime_checkable
class ItemReading(Protocol):
    """How a run reads new items (rows, images), as its DataModule's ``reading_of`` gives it."""

    #: class labels in class-id order; ``None`` for regression
    labels: Any
    #: the target columns when there are several, one prediction each; ``None`` for one target
    target_names: Sequence[str] | None

    def stack(self, items: Any, names: Sequence[str] | None = None, report: Any = None) -> torch.Tensor:
        """Items (a DataFrame of rows, a list of images) → one tensor, read as the run read its own."""
        ...

    def graph(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` behind the run's fitted input transform; ``normalize(items)`` is the model's input."""
        ...


@runtime_checkable
class ReadsItems(Protocol):
    """A DataModule class that says how its runs read new items: :class:`Predictor` asks it."""

    @classmethod
    def reading_of(cls, checkpoint: dict[str, Any], path: str) -> ItemReading:
        """What the checkpoint's run fitted to read new items; one sentence when it carries none."""
        ...


def reading_of(checkpoint: dict[str, Any], path: str) -> ItemReading:
    """What a checkpoint's run fitted to read new inputs, from the DataModule its config names."""
    data = (checkpoint.get("config") or {}).get("data") or {}
    found = resolve(data["class_path"]) if isinstance(data.get("class_path"), str) else None
    if not (isinstance(found, type) and isinstance(found, ReadsItems)):
        raise UserInputError(
            f"checkpoint {path!r} names no DataModule that says how to read new inputs (one with a "
            "reading_of classmethod); predict with python -m src.cli predict, under its DataModule."
        )
    return found.reading_of(checkpoint, path)


def beside_the_run(ckpt_path: str | Path) -> Path:
    """``predictions.csv`` in the checkpoint's run folder, else beside the checkpoint."""
    folder = Path(ckpt_path).resolve().parent
    return (folder.parent if folder.name == "checkpoints" else folder) / "predictions.csv"


def prediction_frame(
    outputs: dict[str, torch.Tensor],
    labels: Sequence[Any] | None,
    index: Sequence[Any] | pd.Index,
    targets: Sequence[str] | None = None,
) -> pd.DataFrame:
    """``predict_step`` outputs of all items → one line per item, after ``index``'s (``row``, ``path``).

    ``probs`` ``(N, K)`` (and ``preds`` ``(N,)`` class ids) give ``prediction``, the chosen class's label, and
    ``probability(<label>)`` columns; else ``preds`` ``(N,)`` is ``prediction``, any other ``(N,)`` output
    its key's column, an ``(N, K)`` one ``<key>(<label or 0..K-1>)``; several ``targets``: :func:`per_target`.
    """
    name = index.name if isinstance(index, pd.Index) and index.name is not None else "row"
    frame = pd.DataFrame({name: np.asarray(index)})
    if targets is not None:
        return pd.concat([frame, per_target(outputs, labels, targets)], axis=1)
    count = len(frame)
    for key, value in outputs.items():
        if value.ndim not in (1, 2) or len(value) != count:
            raise UserInputError(
                f"predict_step returned {key!r} of shape {tuple(value.shape)} for {count} items; each value "
                "of its dict must be (N,) or (N, K), one row per item, to become columns of the predictions."
            )
    probs, preds = outputs.get("probs"), outputs.get("preds")
    classes = probs is not None and probs.ndim == 2 and (preds is None or preds.ndim == 1)
    chosen: list[pd.DataFrame] = []  # ``prediction``, first after the index
    columns: list[pd.DataFrame] = []
    for key, value in outputs.items():
        # float32 in the file whatever the model's precision (numpy has no bfloat16)
        array = (value.float() if value.is_floating_point() else value).cpu().numpy()
        if array.dtype == np.bool_:
            array = array.astype(np.int64)  # 0/1 in the file, not True/False
        names = _names(labels, array.shape[1]) if array.ndim == 2 else []
        if classes and key == "probs":
            columns.append(pd.DataFrame(array, columns=[f"probability({label})" for label in names]))
        elif classes and key == "preds":  # (N,) class ids → their labels
            classes_of = _names(labels, probs.shape[1]) if probs is not None else []
            picked = np.asarray(classes_of, dtype=object)[array.astype(np.int64)]
            chosen.append(pd.DataFrame({"prediction": picked}))
        elif key == "preds" and array.ndim == 1:  # a value in the target's units (or a class id)
            chosen.append(pd.DataFrame({"prediction": array.astype(np.float32)}))
        elif array.ndim == 1:
            columns.append(pd.DataFrame({key: array}))
        else:  # one block of columns, not one insert per entry: a vocabulary has a hundred
            columns.append(pd.DataFrame(array, columns=[f"{key}({label})" for label in names]))
    return pd.concat([frame, *chosen, *columns], axis=1)


def _names(labels: Sequence[Any] | None, k: int) -> list[Any]:
    """The names of an ``(N, K)`` output's entries: the data's ``labels`` when there are K, else 0 … K-1."""
    return list(labels) if labels is not None and len(labels) == k else list(range(k))


def per_target(
    outputs: dict[str, torch.Tensor], labels: Sequence[Any] | None, targets: Sequence[str]
) -> pd.DataFrame:
    """``(N, K)`` outputs of several targets → ``prediction(<target>)`` (a label as written, ``labels[k]``
    negative first, or a value), then ``probability(<target>)`` (of the positive value) columns."""
    columns: dict[str, np.ndarray] = {}
    if "preds" in outputs:
        preds = outputs["preds"].cpu()  # (N, K): 0/1 per label, or values
        for k, target in enumerate(targets):
            column = preds[:, k]
            columns[f"prediction({target})"] = (
                np.asarray(labels[k], dtype=object)[column.numpy().astype(np.int64)]
                if labels is not None
                else column.float().numpy()
            )
    if "probs" in outputs:
        probs = outputs["probs"].float().cpu().numpy()  # (N, K): each label's positive value
        columns.update({f"probability({target})": probs[:, k] for k, target in enumerate(targets)})
    return pd.DataFrame(columns)


def accelerator(device: str | torch.device) -> str | torch.device:
    """``auto``: the GPU when one is present, else the CPU; any other device as given."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class Predictor:
    """A trained model with what its run fitted to read new data: raw rows or images in, labelled
    predictions (its own ``predict_step``'s) out; every way of predicting outside the Trainer uses it.

    Args:
        model: The trained LightningModule, whose ``predict_step`` answers.
        reading: What the same run fitted to read its inputs (:class:`ItemReading`).
        batch_size: Items per forward pass.
        device: Where the model runs: ``auto`` is the GPU when one is present, else the CPU.
    """

    def __init__(
        self,
        model: "LightningModule",
        reading: ItemReading,
        batch_size: int = 1024,
        device: str | torch.device = "auto",
    ) -> None:
        self.device = torch.device(accelerator(device))
        self.model = model.eval().to(self.device)
        self.reading = reading
        #: what an exported graph holds: stacked items in, the run's input transform, the model
        self.graph: Any = reading.graph(self.model).to(self.device).eval()
        self.batch_size = batch_size

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        model_class: "type[LightningModule] | None" = None,
        batch_size: int = 1024,
        device: str | torch.device = "auto",
    ) -> "Predictor":
        """The checkpoint's model (:func:`src.checkpoints.load_model`) and reading, on ``device``."""
        model, checkpoint = load_model(path, model_class)
        return cls(model, reading_of(checkpoint, str(path)), batch_size, device)

    @property
    def labels(self) -> list[Any] | None:
        """The class labels in class-id order (several targets: each one's two); ``None`` for regression."""
        return self.reading.labels

    @property
    def target_names(self) -> Sequence[str] | None:
        """The data's target columns when it has several, one prediction each; ``None`` for one."""
        return self.reading.target_names

    def read(self, items: Any, names: Sequence[str] | None = None, report: Any = None) -> torch.Tensor:
        """Items (a DataFrame of rows; images) → one tensor (:meth:`ItemReading.stack`)."""
        return (
            self.reading.stack(items, names, report)
            if report is not None
            else self.reading.stack(items, names)
        )

    @torch.inference_mode()
    def outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Stacked items (:meth:`read`) → the ``predict_step`` outputs, ``batch_size`` per forward pass."""
        batches = x.split(self.batch_size) or (x,)  # an empty frame still gives its (empty) columns
        outputs = [
            self.model.predict_step((self.graph.normalize(batch.to(self.device, non_blocking=True)),), i)
            for i, batch in enumerate(batches)
        ]
        return {key: torch.cat([o[key] for o in outputs]).cpu() for key in outputs[0]}

    def predict(
        self, items: "pd.DataFrame | Sequence[Any]", source: str = "the rows", report: Any = None
    ) -> pd.DataFrame:
        """One line per row (or image) of ``items``, in order (:func:`prediction_frame`)."""
        if isinstance(items, pd.DataFrame):
            index = pd.Index(items.index.to_numpy(), name="row")
            outputs = self.outputs(self.read(items, [source], report))
            return prediction_frame(outputs, self.labels, index, self.target_names)
        files = all(isinstance(item, str | Path) for item in items)
        index = pd.Index(
            [str(i) for i in items] if files else range(len(items)), name="path" if files else "row"
        )
        return prediction_frame(self.outputs(self.read(items)), self.labels, index)
