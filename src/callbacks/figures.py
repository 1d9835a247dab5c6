"""Pictures of the validation errors for TensorBoard's Images tab, drawn off the training path."""

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from matplotlib.figure import Figure
from sklearn.metrics import ConfusionMatrixDisplay
from torch.utils.tensorboard import SummaryWriter
from torchmetrics.aggregation import CatMetric
from torchmetrics.classification import MulticlassConfusionMatrix
from typing_extensions import override

from src.callbacks.dashboard import logging_step, tensorboard_writer
from src.errors import UserInputError

DPI = 100


@dataclass
class _Epoch:
    """What one validation epoch leaves to draw: (K, K) counts, or (N,) predictions and targets."""

    epoch: int
    step: int
    counts: torch.Tensor | None = None
    preds: torch.Tensor | None = None
    target: torch.Tensor | None = None
    labels: list[str] | None = None
    drawn: bool = False


class ValidationFigures(Callback):
    """The confusion matrix (classification) or predicted against true values (regression).

    Reads the ``{"preds", "target"}`` dict that ``validation_step`` returns, as the metrics see it:
    ``(B, K)`` scores for classification, ``(B,)`` values in the target's units for regression; a module
    whose ``validation_step`` returns no such dict gets one line saying so, and no figures. Class names
    come from the DataModule's ``label_names`` when it has them. The
    counts accumulate on the device; the only host transfer is at the end of the validation epoch.

    Drawn on every n-th epoch's validation, and always on the first and the last validation of a fit
    (also when it resumes, or when early stopping or a stop signal ends it). Drawing (matplotlib, PNG
    encoding) runs on a background thread, one figure at a time, so the next training steps do not
    wait for it; the fit ends only once every figure is written.

    Tags: ``val/confusion_matrix`` (image) and ``val/confusion_counts`` (the same counts as a text table),
    or ``val/predicted_vs_true`` (image).

    Args:
        every_n_epochs: Draw on every n-th validation epoch (and on the first and the last).
        image_size: Width and height of the images, in pixels.
        max_points: Regression: at most this many validation rows (the first ones) in the scatter plot.
    """

    def __init__(self, every_n_epochs: int = 5, image_size: int = 480, max_points: int = 2000) -> None:
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
        self._collecting = False
        self._latest: _Epoch | None = None
        self._pending: list[Future[None]] = []
        self._painter: ThreadPoolExecutor | None = None
        self._drew = False  # whether this run has drawn a figure yet
        self._told = False  # whether the module was told what this callback needs

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # every epoch is collected (a confusion-matrix update per batch, on the device): the last one
        # is drawn at the fit's end, and which one is last is known only then
        self._collecting = not trainer.sanity_checking
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
        if not self._collecting:
            return
        if not (isinstance(outputs, Mapping) and "preds" in outputs and "target" in outputs):
            if not self._told:
                self._told = True
                rank_zero_info(
                    f"ValidationFigures draws from the {{'preds', 'target'}} dict validation_step returns; "
                    f"{type(pl_module).__name__}.validation_step returns none, so no figures are drawn."
                )
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
        if not self._collecting:
            return
        # compute() runs on every process: it gathers the other processes' counts or values
        latest = _Epoch(trainer.current_epoch, logging_step(trainer))
        if self._confusion is not None and self._confusion.update_called:
            # copies: the thread draws them while the next epoch updates the metric's own tensors
            latest.counts = self._confusion.compute().cpu().clone()  # (K, K): rows true, columns predicted
            latest.labels = _label_names(trainer, len(latest.counts))
        elif self._preds.update_called:
            latest.preds = self._preds.compute().cpu().clone()
            latest.target = self._target.compute().cpu().clone()
        else:
            return
        self._latest = latest
        # a fit draws its first validation (also after a resume) and every n-th epoch; a validate run its one
        first = not self._drew
        if trainer.state.fn != TrainerFn.FITTING or first or latest.epoch % self.every_n_epochs == 0:
            self._draw_later(trainer, latest)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the fit's last validation epoch, whatever ended the fit
        if self._latest is not None and not self._latest.drawn:
            self._draw_later(trainer, self._latest)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # before Lightning closes the loggers: every figure is written, and a drawing error is raised here
        self._finish(drawn=True)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # a failed run: figures not begun are dropped and the one being drawn is waited for (an error of
        # its own would only hide the run's), so that nothing writes into a run folder being removed
        self._finish(drawn=False)

    def _finish(self, drawn: bool) -> None:
        pending, self._pending = self._pending, []
        errors = []
        for future in pending:
            if not drawn:
                future.cancel()
            if not future.cancelled() and (error := future.exception()) is not None:  # waits for it
                errors.append(error)
        if self._painter is not None:
            self._painter.shutdown()
            self._painter = None
        self._latest = None
        self._drew = False
        if errors and drawn:  # once nothing is drawing any more
            raise errors[0]

    def _draw_later(self, trainer: L.Trainer, epoch: _Epoch) -> None:
        epoch.drawn = self._drew = True
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        if self._painter is None:
            self._painter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="validation-figures")
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending.append(self._painter.submit(self._draw, writer, epoch))

    def _draw(self, writer: SummaryWriter, epoch: _Epoch) -> None:
        figure = self._figure()
        ax = figure.axes[0]
        if epoch.counts is not None:
            labels = epoch.labels or [str(k) for k in range(len(epoch.counts))]
            # scikit-learn's display takes the counts as numpy (torchmetrics' own plot hands matplotlib a
            # tensor, which numpy 2 warns about); it writes each count into its cell
            ConfusionMatrixDisplay(epoch.counts.numpy(), display_labels=labels).plot(
                ax=ax, colorbar=False, xticks_rotation="vertical" if len(labels) > 6 else "horizontal"
            )
            writer.add_text("val/confusion_counts", _markdown_table(epoch.counts, labels), epoch.step)
            tag = "val/confusion_matrix"
        else:
            assert epoch.preds is not None
            assert epoch.target is not None
            _scatter(ax, epoch.target, epoch.preds)
            tag = "val/predicted_vs_true"
        ax.set_title(f"validation, epoch {epoch.epoch}")
        writer.add_figure(tag, figure, epoch.step, close=False)

    def _figure(self) -> Figure:
        # a bare Figure, not pyplot: no global state, no display backend, safe on a thread of its own
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
    labels = getattr(datamodule, "label_names", None)
    if not isinstance(labels, list | tuple) or len(labels) != count:
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
