"""Pictures of the validation errors for TensorBoard's Images tab, drawn off the training thread."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.tensorboard import SummaryWriter
from torchmetrics.aggregation import CatMetric, MinMetric
from torchmetrics.classification import MulticlassConfusionMatrix, MultilabelConfusionMatrix
from typing_extensions import override

from src.errors import UserInputError
from src.extras.figures import drawing
from src.extras.figures.drawing import Drawn
from src.extras.loggers import BestEpoch, last_by_cap, logging_step, tensorboard_writer
from src.extras.pacing import Pace
from src.extras.painter import Painter

#: ``draw_in="auto"``'s longest fit drawn on a thread, in epochs: a handful of figures, which a worker
#: process's start would outlast
THREAD_EPOCHS = 10

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn, on the worker when there is one
    from matplotlib.figure import Figure


@dataclass
class _Epoch:
    """What one validation epoch leaves to draw: (K, K) counts of one class of K, (K, 2, 2) counts of K
    labels, or (N,) or (N, K) predictions and targets; ``labels`` names the classes, labels or outputs."""

    epoch: int
    step: int
    counts: np.ndarray | None = None
    preds: np.ndarray | None = None
    target: np.ndarray | None = None
    labels: list[str] | None = None
    drawn: bool = False
    #: its figure once drawn and written under ``val/``: the best epoch's is written again, not redrawn
    drawing: Drawn | None = None


class ValidationFigures(Callback):
    """The confusion matrix (classification) or predicted against true values (regression).

    Reads the ``{"preds", "target"}`` dict that ``validation_step`` returns, as the metrics see it, and
    tells the task by their shapes: ``(B, K)`` scores against ``(B,)`` class ids, one class of K: the
    KxK confusion matrix; ``(B, K)`` scores (probabilities, or logits, as torchmetrics reads them) against
    ``(B, K)`` targets that are all 0 or 1, K labels: one 2x2 matrix per label (predicted 1 where the
    probability is above 0.5); ``(B,)`` or ``(B, K)`` values against targets of the same shape (K outputs):
    predicted against true, a panel per output. A module whose ``validation_step`` returns no such dict,
    or other shapes, gets one line saying so, and no figures. Classes, labels and outputs are named by the
    DataModule's ``label_names`` when it has as many. The counts accumulate on the device; the only host
    transfer is at the end of the validation epoch.

    Drawn on every n-th epoch's validation, on the first and the last of a fit (also when it resumes, or
    when early stopping or a stop signal ends it), and at the fit's end for its best epoch by the
    monitored value (the best checkpoint's): ``summary/…`` tags in the run folder, at that epoch's step; a
    best epoch already drawn (a one-epoch fit's) is written again, not redrawn. Drawing (matplotlib,
    imported with the first figure: :mod:`src.extras.figures.drawing`) runs on a background thread, or a
    worker process (:class:`~src.extras.painter.Painter`), one figure at a time, so the training does not
    wait for it; the pixels are written from a thread of this process. The fit ends only once every figure
    is written. The last epoch by the fit's cap is drawn at its own validation, so that the fit's end has
    only the best epoch's left to draw.

    Tags: ``val/confusion_matrix`` (image) and ``val/confusion_counts`` (the same counts as a text table:
    true class by predicted class, or per label its four counts), or ``val/predicted_vs_true`` (image);
    ``summary/…`` for the best epoch's.

    Args:
        every_n_epochs: Draw on every n-th validation epoch (and on the first and the last) while the
            drawing takes at most ``max_share`` of the fit's time (on short epochs some are left out).
        image_size: Width and height of the regression's image, in pixels; the confusion matrix is
            sized to its class count instead.
        max_points: Regression: at most this many validation rows (the first ones) in the scatter plot.
        draw_in: ``thread`` (a background thread of this process, whose drawing holds the training
            interpreter's lock while it runs), ``process`` (a worker process, which never does; it starts
            with the first figure, about a second, and ends with the fit), or ``auto``: a process for a fit
            of more than :data:`THREAD_EPOCHS` epochs (``max_epochs``), a thread otherwise.
        max_share: The most of the fit's time that drawing may take, from the request to the written
            figure (:class:`~src.extras.pacing.Pace`); ``None``: no limit.
    """

    def __init__(
        self,
        every_n_epochs: int = 5,
        image_size: int = 480,
        max_points: int = 2000,
        draw_in: Literal["auto", "process", "thread"] = "auto",
        max_share: float | None = 0.05,
    ) -> None:
        for name, value in {"every_n_epochs": every_n_epochs, "image_size": image_size}.items():
            if value < 1:
                raise UserInputError(f"ValidationFigures {name}={value} must be at least 1.")
        self.every_n_epochs = every_n_epochs
        self.image_size = image_size
        self.max_points = max_points
        self._confusion: MulticlassConfusionMatrix | None = None
        self._label_counts: MultilabelConfusionMatrix | None = None  # (K, 2, 2), when the targets are (B, K)
        self._binary = MinMetric(nan_strategy="disable")  # 1 while every (B, K) target seen is 0 or 1
        self._preds = CatMetric(nan_strategy="disable")  # "disable": a NaN check would sync per step
        self._target = CatMetric(nan_strategy="disable")
        self._points = 0
        self._collecting = False
        self._latest: _Epoch | None = None
        self._best = BestEpoch()
        self._pace = Pace(max_share, "ValidationFigures")
        if draw_in not in ("auto", "process", "thread"):
            raise UserInputError(
                f"ValidationFigures draw_in={draw_in!r} is not 'auto', 'process' or 'thread'."
            )
        self.draw_in = draw_in
        self._painter = Painter("validation-figures", processes=draw_in == "process")
        self._drew = False  # whether this run has drawn a figure yet
        self._told = False  # whether the module was told what this callback needs

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # every epoch is collected (a confusion-matrix update per batch, on the device): the best one
        # is drawn at the fit's end, and which one is best is known only then
        self._collecting = not trainer.sanity_checking
        self._points = 0
        for metric in (self._confusion, self._label_counts, self._binary, self._preds, self._target):
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
            self._tell(
                f"ValidationFigures draws from the {{'preds', 'target'}} dict validation_step returns; "
                f"{type(pl_module).__name__}.validation_step returns none, so no figures are drawn."
            )
            return
        preds, target = outputs["preds"], outputs["target"]
        if preds.ndim == 2 and target.ndim == 1:  # (B, K) scores of one class of K
            if self._confusion is None:
                # validate_args=False: the range checks would sync the host on every batch
                self._confusion = MulticlassConfusionMatrix(preds.shape[1], validate_args=False)
            self._confusion.to(preds.device).update(preds, target)
            return
        if preds.shape != target.shape or preds.ndim not in (1, 2):
            self._tell(
                f"ValidationFigures draws (B, K) scores against (B,) classes, or preds against targets of "
                f"their own (B,) or (B, K) shape; {type(pl_module).__name__}.validation_step returns preds "
                f"{tuple(preds.shape)} and target {tuple(target.shape)}, so no figures are drawn."
            )
            return
        if preds.ndim == 2:  # (B, K) against (B, K): K labels when every target is 0 or 1, else K values
            if self._label_counts is None:
                self._label_counts = MultilabelConfusionMatrix(preds.shape[1], validate_args=False)
            self._binary.to(preds.device).update(((target == 0) | (target == 1)).all().float())
            # the scores as they are: torchmetrics reads them as its multi-label metrics do (probabilities
            # when all lie in [0, 1], else logits, decided on the device; then 0/1 at 0.5)
            self._label_counts.to(preds.device).update(preds, (target > 0.5).long())
        if self._points < self.max_points:  # the values, for a scatter plot of (B,) or (B, K) outputs
            keep = self.max_points - self._points  # a slice length from Python ints: no sync
            self._preds.to(preds.device).update(preds[:keep].float())
            self._target.to(preds.device).update(target[:keep].float())
            self._points += min(keep, len(preds))

    def _tell(self, sentence: str) -> None:
        """What this callback cannot draw for the module, once per run."""
        if not self._told:
            self._told = True
            rank_zero_info(sentence)

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._collecting:
            return
        # compute() runs on every process: it gathers the other processes' counts or values
        latest = _Epoch(trainer.current_epoch, logging_step(trainer))
        if self._confusion is not None and self._confusion.update_called:
            # copies: the thread draws them while the next epoch updates the metric's own tensors
            latest.counts = (
                self._confusion.compute().cpu().numpy().copy()
            )  # (K, K): rows true, columns predicted
            latest.labels = _label_names(trainer, len(latest.counts))
        elif (
            self._label_counts is not None
            and self._label_counts.update_called
            and bool(self._binary.compute() > 0)  # every target of the epoch 0 or 1: K labels
        ):
            latest.counts = self._label_counts.compute().cpu().numpy().copy()  # (K, 2, 2)
            latest.labels = _label_names(trainer, len(latest.counts))
        elif self._preds.update_called:
            latest.preds = self._preds.compute().cpu().numpy().copy()  # (N,) or (N, K)
            latest.target = self._target.compute().cpu().numpy().copy()
            if latest.preds.ndim == 2:
                latest.labels = _label_names(trainer, latest.preds.shape[1])
        else:
            return
        self._latest = latest
        # a fit draws its first validation (also after a resume) and every n-th epoch; a validate run its one
        first = not self._drew
        if (
            trainer.state.fn != TrainerFn.FITTING
            or first
            or (latest.epoch % self.every_n_epochs == 0 and self._pace.due(trainer))
            or last_by_cap(trainer)  # drawn now, not after the training
        ):
            self._draw_later(trainer, latest, "val")

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the epoch's values are in callback_metrics from here on
        if self._collecting and self._latest is not None and trainer.state.fn == TrainerFn.FITTING:
            self._best.offer(trainer, self._latest)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the fit's last validation epoch, whatever ended the fit, and its best one
        if self._latest is not None and not self._latest.drawn:
            self._draw_later(trainer, self._latest, "val")
        if self._best.kept is not None and self._best.kept.drawn:
            self._write_again(trainer, self._best.kept, "summary")
        elif self._best.kept is not None:
            self._draw_later(trainer, self._best.kept, "summary", self._best.title(trainer))
        self._best = BestEpoch()
        self._pace.reset()

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.draw_in == "auto":  # a few figures: a thread; a long fit's many: a process
            epochs = trainer.max_epochs
            self._painter.processes = stage == "fit" and (epochs is None or not 0 <= epochs <= THREAD_EPOCHS)

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
        self._latest = None
        self._best = BestEpoch()
        self._drew = False
        self._painter.finish(drawn)

    def _draw_later(self, trainer: L.Trainer, epoch: _Epoch, group: str, title: str | None = None) -> None:
        self._drew = True
        epoch.drawn = epoch.drawn or group == "val"
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        what = (group, title or f"validation, epoch {epoch.epoch}", epoch.counts, epoch.labels, epoch.preds)
        start = self._pace.start()

        def write(drawn: Drawn) -> None:  # on the painter's thread, once drawn: the drawing's time is known
            _write(writer, epoch.step, drawn)
            self._pace.ran(start)
            if group == "val":
                epoch.drawing = drawn

        if self._painter.processes:
            self._painter.submit(drawing.validation, *what, epoch.target, None, self.image_size, then=write)
        else:
            self._painter.submit(self._draw, *what, epoch.target, then=write)

    def _write_again(self, trainer: L.Trainer, epoch: _Epoch, group: str) -> None:
        """An epoch already drawn (a one-epoch fit's first, last and best) written under ``group`` as well,
        once its drawing is written: drawn once."""
        writer = tensorboard_writer(trainer)

        def write() -> None:
            if writer is not None and epoch.drawing is not None:  # None: its drawing failed or was left out
                _write(writer, epoch.step, epoch.drawing, group)

        self._painter.after(write)

    def _draw(
        self,
        group: str,
        title: str,
        counts: np.ndarray | None,
        labels: list[str] | None,
        preds: np.ndarray | None,
        target: np.ndarray | None,
    ) -> Drawn:
        return drawing.validation(group, title, counts, labels, preds, target, figure=self._figure())

    def _figure(self) -> "Figure":
        return drawing.new_figure(self.image_size)


def _write(writer: SummaryWriter, step: int, drawn: Drawn, group: str | None = None) -> None:
    """``drawn``'s image and texts at ``step``, under their own tags, or the same names in ``group``."""

    def tag(name: str) -> str:  # "val/confusion_matrix" in group "summary": "summary/confusion_matrix"
        return name if group is None else f"{group}/{name.split('/', 1)[1]}"

    for name, text in drawn.texts.items():
        writer.add_text(tag(name), text, step)
    writer.add_image(tag(drawn.tag), drawn.pixels, step, dataformats="HWC")


def _label_names(trainer: L.Trainer, count: int) -> list[str]:
    """The class labels as the data writes them (``MALE``, ``Gentoo``), or class ids when unknown."""
    datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning at run time
    labels = getattr(datamodule, "label_names", None)
    if not isinstance(labels, list | tuple) or len(labels) != count:
        return [str(k) for k in range(count)]
    return [str(label) for label in labels]
