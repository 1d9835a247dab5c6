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

from src.checkpoints import check_names, load_checkpoint, resolve
from src.data.preprocessing import CellReport, Location, Preprocessor, preprocessing_of
from src.errors import UserInputError

if TYPE_CHECKING:  # the tasks import Lightning; prediction_frame and a table's predict need neither
    from src.models import BaseTask


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
    ``prediction`` (the class label, or the value in the target's units), and for classification (the
    outputs hold ``probs``) one ``probability(<label>)`` column per class; classes are named by
    ``labels``, or numbered from 0 when there are none.
    """
    name = index.name if isinstance(index, pd.Index) and index.name is not None else "row"
    frame = pd.DataFrame({name: np.asarray(index)})
    if "probs" not in outputs:
        frame["prediction"] = outputs["preds"].float().cpu().numpy()
        return frame
    probs = outputs["probs"].float().cpu().numpy()  # (N, K)
    names = list(labels) if labels is not None else list(range(probs.shape[1]))
    frame["prediction"] = np.asarray(names, dtype=object)[probs.argmax(axis=1)]
    # one block of columns, not one insert per class: a vocabulary has a hundred
    columns = pd.DataFrame(probs, columns=[f"probability({label})" for label in names])
    return pd.concat([frame, columns], axis=1)


class Predictor:
    """A trained model with its fitted preprocessing: raw rows in, labelled predictions out.

    Args:
        model: The trained task (any :class:`src.models.BaseTask`).
        preprocessor: The preprocessing fitted in the same run.
        batch_size: Rows per forward pass.
    """

    def __init__(self, model: "BaseTask", preprocessor: Preprocessor, batch_size: int = 8192) -> None:
        self.model = model.eval()
        self.preprocessor = preprocessor
        self.batch_size = batch_size

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, model_class: "type[BaseTask] | None" = None, batch_size: int = 8192
    ) -> "Predictor":
        """Load a checkpoint as data (``weights_only=True``) and rebuild its model on the CPU.

        ``model_class`` is read from the checkpoint when left out, for the project's own classes; a
        class of yours must be passed in, so that a checkpoint never chooses what code to import
        (:func:`src.checkpoints.check_names`).
        """
        checkpoint = load_checkpoint(path)
        named = {f"{model_class.__module__}.{model_class.__qualname__}"} if model_class else set()
        check_names(checkpoint, path, named)
        hparams = dict(checkpoint.get("hyper_parameters", {}))
        model_class = model_class or _model_class(hparams.get("_class_path"), str(path))
        try:
            # Lightning's loader rebuilds the net from the config it was saved as; compiling pays off in
            # training, not in a forward pass per request
            model = model_class.load_from_checkpoint(path, map_location="cpu", compile_net=False)
        except UserInputError:
            raise
        except (
            TypeError,
            RuntimeError,
            ValueError,
        ) as err:  # other arguments, or other weights, than the class has
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserInputError(
                f"checkpoint {str(path)!r} does not fit {model_class.__name__} ({first.rstrip('.')}); "
                "pass the model_class it was trained with."
            ) from err
        return cls(model, preprocessing_of(checkpoint, str(path)), batch_size)

    def encode(
        self, frame: pd.DataFrame, source: str = "the rows", report: CellReport | None = None
    ) -> torch.Tensor:
        """Raw rows → the ``(N, F)`` float32 matrix the net reads, by the one rule for every cell
        (:mod:`src.data.preprocessing`): the cells it read otherwise than written are counted into
        ``report``, or logged as one warning naming ``source`` when there is none."""
        return torch.from_numpy(self.preprocessor.transform(frame, Location(source), report=report))

    @torch.inference_mode()
    def outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Encoded rows ``(N, F)`` → the model's ``predict_step`` outputs for all of them, ``batch_size``
        rows per forward pass (the server calls this on the rows of several requests at once)."""
        batches = x.split(self.batch_size) or (x,)  # an empty frame still gives its (empty) columns
        outputs = [self.model.predict_step((batch,), i) for i, batch in enumerate(batches)]
        return {key: torch.cat([o[key] for o in outputs]) for key in outputs[0]}

    def predict(
        self, frame: pd.DataFrame, source: str = "the rows", report: CellReport | None = None
    ) -> pd.DataFrame:
        """One line per row of ``frame``, in order (see :func:`prediction_frame`); ``row`` is its index.

        Pass a :class:`src.data.preprocessing.CellReport` to get the per-column counts of cells read as
        missing or as another category back (``report.columns``) instead of the logged warning.
        """
        outputs = self.outputs(self.encode(frame, source, report))
        return prediction_frame(outputs, self.preprocessor.labels, frame.index.to_numpy())


def _model_class(class_path: Any, path: str) -> "type[BaseTask]":
    """The task class a checkpoint names, which :func:`check_names` has already found trusted."""
    if not isinstance(class_path, str):
        raise UserInputError(
            f"checkpoint {path!r} does not name its model class; pass model_class=YourTask to "
            "from_checkpoint."
        )
    from src.models import BaseTask

    found = resolve(class_path)
    if not (isinstance(found, type) and issubclass(found, BaseTask)):
        raise UserInputError(
            f"checkpoint {path!r} names {class_path!r}, which is not a task of this project."
        )
    return found
