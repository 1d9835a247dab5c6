"""Pictures of the validation errors, drawn once per validation epoch for TensorBoard's Images tab."""

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from matplotlib.figure import Figure
from sklearn.metrics import ConfusionMatrixDisplay
from torchmetrics.aggregation import CatMetric
from torchmetrics.classification import MulticlassConfusionMatrix
from typing_extensions import override

from src.callbacks.dashboard import logging_step, tensorboard_writer
from src.data import TabularDataModule
from src.errors import UserInputError

DPI = 100


class ValidationFigures(Callback):
    """The confusion matrix (classification) or predicted against true values (regression).

    Reads the ``{"preds", "target"}`` dict that ``validation_step`` returns, as the metrics see it:
    ``(B, K)`` scores for classification, ``(B,)`` values in the target's units for regression. The
    counts accumulate on the device; the only host transfer is at the end of the validation epoch.

    Tags: ``val/confusion_matrix`` (image) and ``val/confusion_counts`` (the same counts as a text table),
    or ``val/predicted_vs_true`` (image).

    Args:
        every_n_epochs: Draw on every n-th validation epoch.
        image_size: Width and height of the images, in pixels.
        max_points: Regression: at most this many validation rows (the first ones) in the scatter plot.
    """

    def __init__(self, every_n_epochs: int = 1, image_size: int = 480, max_points: int = 2000) -> None:
        for name, value in {"every_n_epochs": every_n_epochs, "image_size": image_size}.items():
            if value < 1:
                raise UserInputError(f"ValidationFigures {name}={value} must be at least 1.")
        self.every_n_epochs = every_n_epochs
        self.image_size = image_size
        self.max_points = max_points
        self._confusion: MulticlassConfusionMatrix | None = None
        self._preds = CatMetric(nan_strategy="disable")  # "disable": a NaN check would sync per step
        self._target = CatMetric(nan_strategy="disable")
        self._points = 0
        self._drawing = False

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._drawing = not trainer.sanity_checking and trainer.current_epoch % self.every_n_epochs == 0
        self._points = 0
        for metric in (self._confusion, self._preds, self._target):
            if metric is not None:
                metric.reset()

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self._drawing or not isinstance(outputs, Mapping):
            return
        preds, target = outputs["preds"], outputs["target"]
        if preds.ndim == 2:  # (B, K) scores
            if self._confusion is None:
                # validate_args=False: the range checks would sync the host on every batch
                self._confusion = MulticlassConfusionMatrix(preds.shape[1], validate_args=False)
            self._confusion.to(preds.device).update(preds, target)
        elif self._points < self.max_points:
            keep = self.max_points - self._points  # a slice length from Python ints: no sync
            self._preds.to(preds.device).update(preds[:keep])
            self._target.to(preds.device).update(target[:keep])
            self._points += min(keep, len(preds))

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._drawing:
            return
        # compute() runs on every process: it gathers the other processes' counts or values
        if self._confusion is not None and self._confusion.update_called:
            counts = self._confusion.compute()  # (K, K): rows true, columns predicted
        elif self._preds.update_called:
            preds, target = self._preds.compute().cpu(), self._target.compute().cpu()  # (N,) each
            counts = None
        else:
            return
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        step = logging_step(trainer)
        figure = self._figure()
        ax = figure.axes[0]
        if counts is not None:
            # scikit-learn's display takes the counts as numpy (torchmetrics' own plot hands matplotlib a
            # tensor, which numpy 2 warns about); it writes each count into its cell
            labels = _label_names(trainer, len(counts))
            ConfusionMatrixDisplay(counts.cpu().numpy(), display_labels=labels).plot(
                ax=ax, colorbar=False, xticks_rotation="vertical" if len(labels) > 6 else "horizontal"
            )
            writer.add_text("val/confusion_counts", _markdown_table(counts, labels), step)
            tag = "val/confusion_matrix"
        else:
            _scatter(ax, target, preds)
            tag = "val/predicted_vs_true"
        ax.set_title(f"validation, epoch {trainer.current_epoch}")
        writer.add_figure(tag, figure, step, close=False)

    def _figure(self) -> Figure:
        # a bare Figure, not pyplot: no global state, no display backend
        inches = self.image_size / DPI
        figure = Figure(figsize=(inches, inches), dpi=DPI, layout="constrained")
        figure.add_subplot()
        return figure


def _scatter(ax: Any, target: torch.Tensor, preds: torch.Tensor) -> None:
    ax.scatter(target.numpy(), preds.numpy(), s=8, alpha=0.5)
    low, high = min(target.min(), preds.min()).item(), max(target.max(), preds.max()).item()
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = true")
    ax.set_xlabel("true value")
    ax.set_ylabel("predicted value")
    ax.legend(loc="upper left")


def _label_names(trainer: L.Trainer, count: int) -> list[str]:
    """The class labels as the data writes them (``MALE``, ``Gentoo``), or class ids when unknown."""
    datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning at run time
    labels = datamodule.label_names if isinstance(datamodule, TabularDataModule) else None
    if labels is None or len(labels) != count:
        return [str(k) for k in range(count)]
    return [str(label) for label in labels]


def _markdown_table(counts: torch.Tensor, labels: list[str]) -> str:
    """(K, K) counts as a Markdown table, true class per row, predicted class per column."""
    rows = counts.cpu().tolist()
    # a label is data: escape what Markdown would read as a cell border or emphasis
    labels = [label.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_") for label in labels]
    header = "| true \\ predicted | " + " | ".join(labels) + " |"
    rule = "|---" * (len(rows) + 1) + "|"
    body = [
        f"| {label} | " + " | ".join(str(n) for n in row) + " |"
        for label, row in zip(labels, rows, strict=True)
    ]
    return "\n".join([header, rule, *body])
