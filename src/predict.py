"""Predictions on raw rows from a checkpoint alone: the path that ``predict``, Python and serving share.

```python
from src.predict import Predictor

predictor = Predictor.from_checkpoint("logs/penguins/version_0/checkpoints/last.ckpt")
predictor.predict(pandas.read_csv("new_penguins.csv"))  # a DataFrame: row, prediction, probabilities
```

Raw rows go through the checkpoint's own fitted preprocessing (:mod:`src.data.preprocessing`), then
the model's ``predict_step``, then :func:`prediction_frame`, which names each class by its label.
``python -m src.cli predict`` runs the same three pieces under the Trainer.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from src.checkpoints import load_model
from src.data.preprocessing import CellReport, Location, Preprocessor, preprocessing_of

if TYPE_CHECKING:  # Lightning is imported when a model is loaded; prediction_frame needs none
    from lightning import LightningModule


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
    """A trained model with its fitted preprocessing: raw rows in, labelled predictions out.

    Args:
        model: The trained LightningModule, whose ``predict_step`` answers (the shipped tasks', or yours).
        preprocessor: The preprocessing fitted in the same run.
        batch_size: Rows per forward pass.
        device: Where the model runs: ``auto`` is the GPU when one is present, else the CPU.
    """

    def __init__(
        self,
        model: "LightningModule",
        preprocessor: Preprocessor,
        batch_size: int = 8192,
        device: str | torch.device = "auto",
    ) -> None:
        self.device = torch.device(accelerator(device))
        self.model = model.eval().to(self.device)
        self.preprocessor = preprocessor
        self.batch_size = batch_size

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        model_class: "type[LightningModule] | None" = None,
        batch_size: int = 8192,
        device: str | torch.device = "auto",
    ) -> "Predictor":
        """The checkpoint's model (:func:`src.checkpoints.load_model`: read as data, its names checked, its
        class the one it names or ``model_class``) with its fitted preprocessing, on ``device``."""
        model, checkpoint = load_model(path, model_class)
        return cls(model, preprocessing_of(checkpoint, str(path)), batch_size, device)

    def encode(
        self, frame: pd.DataFrame, source: str | Location = "the rows", report: CellReport | None = None
    ) -> torch.Tensor:
        """Raw rows → the ``(N, F)`` float32 matrix the net reads, by the one rule for every cell
        (:mod:`src.data.preprocessing`): the cells it read otherwise than written are counted into
        ``report``, or logged as one warning naming ``source`` when there is none."""
        where = Location(source) if isinstance(source, str) else source
        return torch.from_numpy(self.preprocessor.transform(frame, where, report=report))

    @torch.inference_mode()
    def outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Encoded rows ``(N, F)`` → the model's ``predict_step`` outputs for all of them, ``batch_size``
        rows per forward pass (the server calls this on the rows of several requests at once)."""
        batches = x.split(self.batch_size) or (x,)  # an empty frame still gives its (empty) columns
        outputs = [
            self.model.predict_step((batch.to(self.device, non_blocking=True),), i)
            for i, batch in enumerate(batches)
        ]
        return {key: torch.cat([o[key] for o in outputs]).cpu() for key in outputs[0]}

    def predict(
        self, frame: pd.DataFrame, source: str | Location = "the rows", report: CellReport | None = None
    ) -> pd.DataFrame:
        """One line per row of ``frame``, in order (see :func:`prediction_frame`); ``row`` is its index.

        Pass a :class:`src.data.preprocessing.CellReport` to get the per-column counts of cells read as
        missing or as another category back (``report.columns``) instead of the logged warning.
        """
        outputs = self.outputs(self.encode(frame, source, report))
        return prediction_frame(outputs, self.preprocessor.labels, frame.index.to_numpy())
