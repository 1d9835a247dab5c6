"""Pictures of the validation errors for TensorBoard's Images tab, drawn off the training thread."""

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from matplotlib.figure import Figure
from torch.utils.tensorboard import SummaryWriter
from torchmetrics.aggregation import CatMetric
from torchmetrics.classification import MulticlassConfusionMatrix
from typing_extensions import override

from src.errors import UserInputError
from src.loggers import BestEpoch, logging_step, tensorboard_writer
from src.painter import Painter

DPI = 100
#: the confusion matrix's side, in inches, before the cell-size bounds apply (10 classes: 0.6 in a cell)
CONFUSION_SIDE_IN = 6.0
MIN_CELL_IN, MAX_CELL_IN = 0.16, 1.0
#: cells smaller than this show no text, and from this size on both the count and the rate
MIN_TEXT_CELL_IN, BOTH_TEXT_CELL_IN = 0.2, 0.45
#: labels longer than this are wrapped (few classes) or numbered with a legend (many)
LABEL_CHARS = 12
WRAP_MAX_CLASSES = 8
#: a character's mean width in the default font, in em: label lengths are estimated, not measured
CHAR_EM = 0.62
TITLE_FONT = 9.0


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

    Drawn on every n-th epoch's validation, on the first and the last of a fit (also when it resumes, or
    when early stopping or a stop signal ends it), and at the fit's end for its best epoch by the monitored
    value (the best checkpoint's): ``summary/…`` tags in the run folder, at that epoch's step. Drawing
    (matplotlib, PNG encoding) runs on a background thread (:class:`~src.painter.Painter`), one
    figure at a time, so the next training steps do not wait for it; the fit ends only once every figure
    is written.

    Tags: ``val/confusion_matrix`` (image) and ``val/confusion_counts`` (the same counts as a text table),
    or ``val/predicted_vs_true`` (image); ``summary/…`` for the best epoch's.

    Args:
        every_n_epochs: Draw on every n-th validation epoch (and on the first and the last).
        image_size: Width and height of the regression's image, in pixels; the confusion matrix is
            sized to its class count instead.
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
        self._best = BestEpoch()
        self._painter = Painter("validation-figures")
        self._drew = False  # whether this run has drawn a figure yet
        self._told = False  # whether the module was told what this callback needs

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # every epoch is collected (a confusion-matrix update per batch, on the device): the best one
        # is drawn at the fit's end, and which one is best is known only then
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
        if self._best.kept is not None:
            self._draw_later(trainer, self._best.kept, "summary", self._best.title(trainer))
        self._best = BestEpoch()

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
        if writer is not None:
            self._painter.submit(
                self._draw, writer, epoch, group, title or f"validation, epoch {epoch.epoch}"
            )

    def _draw(self, writer: SummaryWriter, epoch: _Epoch, group: str, title: str) -> None:
        figure = self._figure()
        if epoch.counts is not None:
            labels = epoch.labels or [str(k) for k in range(len(epoch.counts))]
            confusion_figure(figure, epoch.counts, labels, title)
            writer.add_text(f"{group}/confusion_counts", _markdown_table(epoch.counts, labels), epoch.step)
            tag = f"{group}/confusion_matrix"
        else:
            assert epoch.preds is not None
            assert epoch.target is not None
            figure.set_layout_engine("constrained")
            ax = figure.add_subplot()
            _scatter(ax, epoch.target, epoch.preds)
            ax.set_title(title)
            tag = f"{group}/predicted_vs_true"
        writer.add_figure(tag, figure, epoch.step, close=False)

    def _figure(self) -> Figure:
        # a bare Figure, not pyplot: no global state, no display backend, safe on a thread of its own
        inches = self.image_size / DPI
        return Figure(figsize=(inches, inches), dpi=DPI)


def confusion_figure(figure: Figure, counts: torch.Tensor, labels: list[str], title: str) -> None:
    """Draw (K, K) ``counts`` (rows true, columns predicted) into ``figure``, sized to the class count.

    Each cell's colour is its row-normalized rate (the share of the true class predicted so); a non-zero
    cell also says its count and rate when the cell is large enough to hold them. Labels longer than
    :data:`LABEL_CHARS` are wrapped onto two lines when there are few classes, and replaced by their class
    number with a legend beside the matrix otherwise. The layout is computed from the class count and
    the label lengths, not by a layout engine: a constrained layout costs more than the drawing itself.
    """
    k = len(counts)
    matrix = counts.double()
    rates = (matrix / matrix.sum(dim=1, keepdim=True).clamp(min=1)).numpy()  # (K, K), rows sum to 1
    cell = min(max(CONFUSION_SIDE_IN / k, MIN_CELL_IN), MAX_CELL_IN)  # inches
    font = min(max(cell * 72 * 0.45, 5.0), 10.0)  # points: tick labels fit their cell
    shown, legend = _tick_labels(labels)
    lines = max(label.count("\n") + 1 for label in shown)
    longest = max(len(line) for label in shown for line in label.split("\n"))
    text_in = longest * CHAR_EM * font / 72  # the longest label line's length, in inches
    rotate = text_in > cell * 0.9 or (lines > 1 and k > WRAP_MAX_CLASSES)
    side = k * cell
    left = text_in + 0.55  # tick labels, then the axis label
    bottom = (text_in if rotate else lines * font * 1.3 / 72) + 0.55
    heading = f"{title}\ncolour: share of the true class"
    top = 0.65  # the two lines of the title
    legend_font = 8.0
    rows_per_column = max(int((side + bottom) * 72 / (legend_font * 1.35)), 1)
    columns = -(-len(legend) // rows_per_column) if legend else 0
    entry_in = max((len(entry) for entry in legend), default=0) * CHAR_EM * legend_font / 72
    legend_in = columns * (entry_in + 0.2)
    # wide enough for the title over a matrix of two or three classes
    title_in = max(len(line) for line in heading.split("\n")) * CHAR_EM * TITLE_FONT / 72
    width, height = (
        max(left + side + 0.3 + legend_in, left + side / 2 + title_in / 2 + 0.2),
        bottom + side + top,
    )
    figure.set_size_inches(width, height)
    ax = figure.add_axes((left / width, bottom / height, side / width, side / height))
    ax.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
    ticks = list(range(k))
    ax.set_xticks(ticks, shown, rotation=90 if rotate else 0, fontsize=font)
    ax.set_yticks(ticks, shown, fontsize=font)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(heading, fontsize=TITLE_FONT)
    _annotate(ax, counts, rates, cell)
    if legend:
        for column in range(columns):
            block = legend[column * rows_per_column : (column + 1) * rows_per_column]
            x = (left + side + 0.3 + column * legend_in / columns) / width
            figure.text(x, 1 - top / height, "\n".join(block), va="top", ha="left", fontsize=legend_font)


def _tick_labels(labels: list[str]) -> tuple[list[str], list[str]]:
    """The labels as shown on the axes, and the legend lines (empty when the labels are shown whole)."""
    if all(len(label) <= LABEL_CHARS for label in labels):
        return labels, []
    if len(labels) <= WRAP_MAX_CLASSES and all(len(label) <= 2 * LABEL_CHARS for label in labels):
        return ["\n".join(textwrap.wrap(label, LABEL_CHARS)[:2]) or label for label in labels], []
    return [str(k) for k in range(len(labels))], [f"{k}: {label}" for k, label in enumerate(labels)]


def _annotate(ax: Any, counts: torch.Tensor, rates: Any, cell: float) -> None:
    """Count and rate in the non-zero cells that can hold them (text in empty cells is most of the cost)."""
    if cell < MIN_TEXT_CELL_IN:
        return
    both = cell >= BOTH_TEXT_CELL_IN
    font = min(max(cell * 72 * (0.22 if both else 0.35), 5.0), 10.0)
    for i, j in counts.nonzero().tolist():
        rate = float(rates[i, j])
        text = f"{int(counts[i, j])}\n{rate:.0%}" if both else f"{int(counts[i, j])}"
        colour = "white" if rate > 0.5 else "black"
        ax.text(j, i, text, ha="center", va="center", fontsize=font, color=colour)


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
