"""Predictions from a checkpoint alone, on raw rows or on images: the path Python, serving and the
export's check share.

```python
from src.predict import Predictor

predictor = Predictor.from_checkpoint("logs/penguins/version_0/checkpoints/last.ckpt")
predictor.predict(pandas.read_csv("new_penguins.csv"))  # a DataFrame: row, prediction, probabilities
Predictor.from_checkpoint("logs/images/version_0/checkpoints/last.ckpt").predict(["cat.png"])  # path, ...
```

Raw rows go through the checkpoint's own fitted preprocessing (:mod:`src.data.preprocessing`); other items
(images) through what the run's DataModule says its run fitted to read them (:class:`ItemReading`); then
the model's ``predict_step``, then :func:`prediction_frame`, which names each class by its label.
``python -m src.cli predict`` runs the same pieces under the Trainer.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd
import torch

from src.checkpoints import load_model, resolve
from src.data.preprocessing import CellReport, Location, Preprocessor, preprocessing_of
from src.errors import UserInputError

if TYPE_CHECKING:  # Lightning is imported when a model is loaded
    from lightning import LightningModule


@runtime_checkable
class ItemReading(Protocol):
    """How a run of items other than a table's rows (images, say) reads new ones: what its DataModule's
    ``reading_of(checkpoint, path)`` gives back (:class:`ReadsItems`)."""

    #: class labels in class-id order; ``None`` for regression
    labels: Any

    def stack(self, items: Sequence[Any], names: Sequence[str] | None = None) -> torch.Tensor:
        """Items → one tensor of them, each read as the run read its own; ``names`` say what each is in a
        sentence (a file: its path)."""
        ...

    def graph(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` behind the run's fitted input transform: stacked items in, the model's output out;
        its ``normalize(items)`` gives the model's input alone."""
        ...


@runtime_checkable
class ReadsItems(Protocol):
    """A DataModule class that says how its runs read new items (images): :class:`Predictor` asks it."""

    @classmethod
    def reading_of(cls, checkpoint: dict[str, Any], path: str) -> ItemReading:
        """What the checkpoint's run fitted to read new items; one sentence when it carries none."""
        ...


def reading_of(checkpoint: dict[str, Any], path: str) -> "Preprocessor | ItemReading":
    """What a checkpoint's run fitted to read new inputs: its DataModule's own reading (:class:`ReadsItems`),
    else a table's fitted preprocessing. The DataModule's class is the one its carried config names, which
    :func:`src.checkpoints.load_model` has checked."""
    data = (checkpoint.get("config") or {}).get("data") or {}
    found = resolve(data["class_path"]) if isinstance(data.get("class_path"), str) else None
    if isinstance(found, type) and isinstance(found, ReadsItems):
        return found.reading_of(checkpoint, path)
    return preprocessing_of(checkpoint, path)


def beside_the_run(ckpt_path: str | Path) -> Path:
    """Where ``predict`` writes when given no ``--output``: ``predictions.csv`` in the run folder of the
    checkpoint (``<run>/checkpoints/x.ckpt`` → ``<run>/predictions.csv``), else beside the checkpoint."""
    folder = Path(ckpt_path).resolve().parent
    return (folder.parent if folder.name == "checkpoints" else folder) / "predictions.csv"


def prediction_frame(
    outputs: dict[str, torch.Tensor], labels: Sequence[Any] | None, index: Sequence[Any] | pd.Index
) -> pd.DataFrame:
    """``predict_step`` outputs of all items → one line per item.

    Columns: what each item is (``index``'s name: ``row`` for a table's rows, ``path`` for image files),
    ``prediction`` (``preds``: the class label of the class id ``predict_step`` chose, or the value in the
    target's units), and for classification (the outputs hold ``probs``) one ``probability(<label>)``
    column per class; classes are named by ``labels``, or numbered from 0 when there are none. The choice
    of class is ``predict_step``'s alone (a threshold of yours there is the one that answers); outputs
    with ``probs`` and no ``preds`` get the probability columns only.
    """
    name = index.name if isinstance(index, pd.Index) and index.name is not None else "row"
    frame = pd.DataFrame({name: np.asarray(index)})
    if "probs" not in outputs:
        frame["prediction"] = outputs["preds"].float().cpu().numpy()
        return frame
    probs = outputs["probs"].float().cpu().numpy()  # (N, K)
    names = list(labels) if labels is not None else list(range(probs.shape[1]))
    if "preds" in outputs:  # (N,) class ids
        frame["prediction"] = np.asarray(names, dtype=object)[outputs["preds"].cpu().numpy().astype(np.int64)]
    # one block of columns, not one insert per class: a vocabulary has a hundred
    columns = pd.DataFrame(probs, columns=[f"probability({label})" for label in names])
    return pd.concat([frame, columns], axis=1)


def accelerator(device: str | torch.device) -> str | torch.device:
    """``auto``: the GPU when one is present, else the CPU; any other device as given."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class Predictor:
    """A trained model with what its run fitted to read new data: raw rows of a table, or images, in;
    labelled predictions out. Every way of predicting outside the Trainer (Python, the server, the export's
    check) goes through it, and it through the model's own ``predict_step``.

    Args:
        model: The trained LightningModule, whose ``predict_step`` answers (the shipped tasks', or yours).
        reading: What the same run fitted to read its inputs: a table's
            :class:`~src.data.preprocessing.Preprocessor`, or an :class:`ItemReading` (images).
        batch_size: Rows (or items) per forward pass; left out, 8192 rows or 256 items.
        device: Where the model runs: ``auto`` is the GPU when one is present, else the CPU.
    """

    def __init__(
        self,
        model: "LightningModule",
        reading: "Preprocessor | ItemReading",
        batch_size: int | None = None,
        device: str | torch.device = "auto",
    ) -> None:
        self.device = torch.device(accelerator(device))
        self.model = model.eval().to(self.device)
        self.reading = reading
        #: items: the module an exported graph holds (stacked items in, the run's input transform, the net)
        self.graph: Any = None
        if not isinstance(reading, Preprocessor):
            self.graph = reading.graph(self.model).to(self.device).eval()
        self.batch_size = batch_size or (8192 if self.graph is None else 256)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        model_class: "type[LightningModule] | None" = None,
        batch_size: int | None = None,
        device: str | torch.device = "auto",
    ) -> "Predictor":
        """The checkpoint's model (:func:`src.checkpoints.load_model`: read as data, its names checked, its
        class the one it names or ``model_class``) with what its run fitted to read inputs, on ``device``."""
        model, checkpoint = load_model(path, model_class)
        return cls(model, reading_of(checkpoint, str(path)), batch_size, device)

    @property
    def preprocessor(self) -> Preprocessor:
        """A table's fitted preprocessing (one sentence for an image model's predictor)."""
        if not isinstance(self.reading, Preprocessor):
            raise UserInputError("this model reads images, not a table's rows; give it images.")
        return self.reading

    @property
    def preprocessing(self) -> ItemReading:
        """How a run of items (images) reads new ones (one sentence for a table's)."""
        if isinstance(self.reading, Preprocessor):
            raise UserInputError("this model reads a table's rows, not images; give it rows.")
        return self.reading

    @property
    def reads_rows(self) -> bool:
        """Whether the model reads a table's rows (else items, such as images)."""
        return isinstance(self.reading, Preprocessor)

    @property
    def labels(self) -> list[Any] | None:
        """The class labels in class-id order; ``None`` for regression."""
        return self.reading.labels

    def encode(
        self, frame: pd.DataFrame, source: str | Location = "the rows", report: CellReport | None = None
    ) -> torch.Tensor:
        """Raw rows → the ``(N, F)`` float32 matrix the net reads, by the one rule for every cell
        (:mod:`src.data.preprocessing`): the cells it read otherwise than written are counted into
        ``report``, or logged as one warning naming ``source`` when there is none."""
        where = Location(source) if isinstance(source, str) else source
        return torch.from_numpy(self.preprocessor.transform(frame, where, report=report))

    def read(self, items: Sequence[Any], names: Sequence[str] | None = None) -> torch.Tensor:
        """Items (images: files, their bytes, Pillow images → uint8 ``(N, H, W, C)``), each read as the run
        read its own; ``names`` say what each is in a sentence (a file: its path)."""
        return self.preprocessing.stack(items, names)

    @torch.inference_mode()
    def outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Encoded rows ``(N, F)``, or uint8 pixels ``(N, H, W, C)``, → the model's ``predict_step`` outputs
        for all of them, ``batch_size`` per forward pass (the server calls this on the inputs of several
        requests at once)."""
        batches = x.split(self.batch_size) or (x,)  # an empty frame still gives its (empty) columns
        outputs = [
            self.model.predict_step((self._net_input(batch.to(self.device, non_blocking=True)),), i)
            for i, batch in enumerate(batches)
        ]
        return {key: torch.cat([o[key] for o in outputs]).cpu() for key in outputs[0]}

    def _net_input(self, batch: torch.Tensor) -> torch.Tensor:
        """Items are transformed per batch, as the run transformed its own; rows are encoded already."""
        return batch if self.graph is None else self.graph.normalize(batch)

    def predict(
        self,
        items: "pd.DataFrame | Sequence[Any]",
        source: str | Location = "the rows",
        report: CellReport | None = None,
    ) -> pd.DataFrame:
        """One line per row (or image) of ``items``, in order (see :func:`prediction_frame`).

        A table's rows: ``row`` is the frame's index; pass a :class:`src.data.preprocessing.CellReport` to
        get the per-column counts of cells read as missing or as another category back
        (``report.columns``) instead of the logged warning. Images: ``path`` when all are files (as
        ``predict``'s CSV file), else ``row``, their positions.
        """
        if isinstance(items, pd.DataFrame) and isinstance(self.reading, Preprocessor):
            outputs = self.outputs(self.encode(items, source, report))
            return prediction_frame(outputs, self.labels, items.index.to_numpy())
        if isinstance(items, pd.DataFrame):  # rows that the run's own reading stacks (arrays)
            x = self.read(items, [source if isinstance(source, str) else source.what])
            index = pd.Index(items.index.to_numpy(), name="row")
            return prediction_frame(self.outputs(x), self.labels, index)
        files = all(isinstance(item, str | Path) for item in items)
        index = pd.Index(
            [str(i) for i in items] if files else range(len(items)), name="path" if files else "row"
        )
        return prediction_frame(self.outputs(self.read(items)), self.labels, index)
