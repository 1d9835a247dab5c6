"""The validation images the model gets wrong, as a grid in TensorBoard's Images tab."""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch.utils.tensorboard import SummaryWriter
from typing_extensions import override

from src.errors import UserInputError
from src.extras.loggers import BestEpoch, logging_step, tensorboard_writer
from src.extras.pacing import Pace
from src.extras.painter import Painter

TAG = "val/misclassified"
#: the best epoch's grid, at the fit's end
BEST_TAG = "summary/misclassified"
#: panels to a row, at most
COLUMNS = 8
DPI = 100
#: the grid's fixed layout, in inches: the band of the figure's title on top, each panel's title above it,
#: and the gap between two panels in a row
SUPTITLE_IN = 0.45
TITLE_IN = 0.25
GAP_IN = 0.08
#: a panel title's width per character at 8 points, about 0.6 em
CHAR_IN = 0.07
#: a label in a panel's title, at most, in characters: a longer one is cut, ending in "…"
LABEL_CHARS = 12


@runtime_checkable
class Denormalizes(Protocol):
    """A DataModule that can undo its normalization (``ImageDataModule.denormalize``)."""

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` normalized images → the 0…1 scale."""
        ...


Kept = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def first_misclassified(
    kept: Kept | None, images: torch.Tensor, target: torch.Tensor, predicted: torch.Tensor, count: int
) -> Kept:
    """The first ``count`` misclassified images of those ``kept`` so far and a new batch, in order.

    Returns ``(images, target, predicted, wrong)``, each of at most ``count`` rows: the misclassified
    first, then correct ones to fill up, which ``wrong`` tells apart. Tensors of a size known without
    looking at their values, so nothing waits for the device to say how many images were wrong.
    """
    wrong = predicted != target
    if kept is not None:  # the ones kept so far first, then the batch's
        images, target, predicted, wrong = (
            torch.cat([old, new]) for old, new in zip(kept, (images, target, predicted, wrong), strict=True)
        )
    # a stable sort of "not wrong": the misclassified to the front, each group in its order
    front = torch.sort((~wrong).to(torch.uint8), stable=True).indices[:count]
    return images[front], target[front], predicted[front], wrong[front]


@dataclass
class EpochImages:
    """What one validation epoch leaves to draw: up to ``max_images`` misclassified images."""

    epoch: int
    step: int
    images: torch.Tensor  # (N, C, H, W) on the 0…1 scale, CPU
    target: torch.Tensor  # (N,) true class ids
    preds: torch.Tensor  # (N,) predicted class ids
    labels: list[str] | None
    drawn: bool = False
    #: its grid once drawn and written under ``val/``, ``(H, W, 3)``: the best epoch's is written again, not
    #: redrawn
    pixels: np.ndarray | None = None


class MisclassifiedImages(Callback):
    """A grid of the first misclassified validation images, each titled "true → predicted".

    Reads the images from the batch (``batch[0]``, ``(B, C, H, W)``, as the module saw them), the
    ``{"output", "target"}`` dict that ``validation_step`` returns (the net's ``(B, K)`` output and ``(B,)``
    class ids), and the classes the module's ``predictions(output)`` names, the rule its ``predict_step``
    follows (the shipped Classifier's); a module without them gets one line saying so, and no images.
    Normalization is undone with the DataModule's ``denormalize`` when it has one (else each image is
    scaled to its own range), and classes are named by its ``label_names``.

    Per batch, the misclassified images are gathered to the front on the device and the first
    ``max_images`` kept, without any host sync; the one transfer is at the epoch's end. Under DDP it shows
    what the process that writes the logs (global rank 0) validated. Drawn on every n-th validation epoch
    of a fit and on its last under the tag ``val/misclassified``, and at the fit's end for its best epoch
    by the monitored value under ``summary/misclassified``, on a background thread
    (:class:`~src.extras.painter.Painter`).

    Args:
        every_n_epochs: Draw on every n-th validation epoch (and on the last of a fit) while the drawing
            takes at most ``max_share`` of the fit's time (on short epochs some are left out).
        max_share: The most of the fit's time that drawing may take (:class:`~src.extras.pacing.Pace`);
            ``None``: no limit.
        max_images: At most this many images in the grid.
        panel_size: Width and height of each image's panel, in pixels.
    """

    def __init__(
        self,
        every_n_epochs: int = 5,
        max_images: int = 32,
        panel_size: int = 96,
        max_share: float | None = 0.05,
    ) -> None:
        for name, value in {
            "every_n_epochs": every_n_epochs,
            "max_images": max_images,
            "panel_size": panel_size,
        }.items():
            if value < 1:
                raise UserInputError(f"MisclassifiedImages {name}={value} must be at least 1.")
        self.every_n_epochs = every_n_epochs
        self.max_images = max_images
        self.panel_size = panel_size
        # the first misclassified images so far this epoch, on the device (see first_misclassified)
        self._kept: Kept | None = None
        self._collecting = False
        self._latest: EpochImages | None = None
        self._best = BestEpoch()
        self._painter = Painter("misclassified-images")
        self._pace = Pace(max_share, "MisclassifiedImages")
        self._told = False

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._collecting = not trainer.sanity_checking and tensorboard_writer(trainer) is not None
        self._kept = None

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
        # the classes the model's own rule predicts (its predict_step's), from the output validation ran
        predictions = getattr(pl_module, "predictions", None)
        returned = isinstance(outputs, Mapping) and "output" in outputs and "target" in outputs
        if not (returned and callable(predictions)):
            if not self._told:
                self._told = True
                rank_zero_info(
                    f"MisclassifiedImages draws the classes predictions(output) names for the {{'output', "
                    f"'target'}} dict validation_step returns; {type(pl_module).__name__} offers none, so no "
                    "images are drawn."
                )
            return
        predicted = predictions(outputs["output"])["preds"]  # (B,) class ids
        self._kept = first_misclassified(
            self._kept, batch[0].detach(), outputs["target"], predicted, self.max_images
        )

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._collecting or self._kept is None:
            return
        images, target, predicted, wrong = (t.cpu() for t in self._kept)  # the epoch's one host transfer
        images, target, predicted = images[wrong].float(), target[wrong], predicted[wrong]
        datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning at run time
        if isinstance(datamodule, Denormalizes):
            images = datamodule.denormalize(images)
        else:  # each image to its own range
            low = images.amin(dim=(1, 2, 3), keepdim=True)
            images = (images - low) / (images.amax(dim=(1, 2, 3), keepdim=True) - low).clamp_min(1e-12)
        names = getattr(datamodule, "label_names", None)
        latest = EpochImages(
            trainer.current_epoch,
            logging_step(trainer),
            images.clamp(0, 1),
            target,
            predicted,
            [str(name) for name in names] if isinstance(names, list | tuple) else None,
        )
        self._latest = latest
        fitting = trainer.state.fn == TrainerFn.FITTING
        if not fitting or (latest.epoch % self.every_n_epochs == 0 and self._pace.due(trainer)):
            self._draw_later(trainer, latest, TAG)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the epoch's values are in callback_metrics from here on
        if self._collecting and self._latest is not None and trainer.state.fn == TrainerFn.FITTING:
            self._best.offer(trainer, self._latest)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the fit's last validation epoch, whatever ended the fit, and its best one
        if self._latest is not None and not self._latest.drawn:
            self._draw_later(trainer, self._latest, TAG)
        if self._best.kept is not None and self._best.kept.drawn:
            self._write_again(trainer, self._best.kept)
        elif self._best.kept is not None:
            self._draw_later(trainer, self._best.kept, BEST_TAG, self._best.title(trainer))
        self._best = BestEpoch()
        self._pace.reset()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # before Lightning closes the loggers: every grid is written, and a drawing error is raised here
        self._finish(drawn=True)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._finish(drawn=False)  # grids not begun are dropped; the run's error is the one to see

    def _finish(self, drawn: bool) -> None:
        self._latest = None
        self._best = BestEpoch()
        self._painter.finish(drawn)

    def _draw_later(self, trainer: L.Trainer, epoch: EpochImages, tag: str, title: str | None = None) -> None:
        epoch.drawn = epoch.drawn or tag == TAG
        writer = tensorboard_writer(trainer)
        if writer is not None and len(epoch.images):
            start = self._pace.start()
            self._painter.submit(self._draw, writer, epoch, tag, title or f"epoch {epoch.epoch}", start)

    def _write_again(self, trainer: L.Trainer, epoch: EpochImages) -> None:
        """An epoch already drawn (a short fit's last, which is often its best) written under
        :data:`BEST_TAG` as well, once its grid is written: drawn once."""
        writer = tensorboard_writer(trainer)

        def write() -> None:
            if writer is not None and epoch.pixels is not None:  # None: its drawing failed or was left out
                writer.add_image(BEST_TAG, epoch.pixels, epoch.step, dataformats="HWC")

        self._painter.after(write)

    def _draw(self, writer: SummaryWriter, epoch: EpochImages, tag: str, title: str, start: float) -> None:
        try:  # on the painter's thread, whose drawing shares the training's interpreter
            canvas = FigureCanvasAgg(self.figure(epoch, title))
            canvas.draw()
            pixels = np.asarray(canvas.buffer_rgba())[:, :, :3].copy()  # (H, W, 3), as add_figure renders
            writer.add_image(tag, pixels, epoch.step, dataformats="HWC")
            if tag == TAG:
                epoch.pixels = pixels
        finally:
            self._pace.ran(start)

    def figure(self, epoch: EpochImages, title: str = "") -> Figure:
        """The grid: one panel of ``panel_size`` pixels per image, titled "true → predicted" with the label
        names (cut to :data:`LABEL_CHARS`), near square and at most :data:`COLUMNS` to a row: the figure
        grows with the count.

        One axes spans the figure, in inches from its top left; each image is placed at its panel's
        inches and each title above it. Not an axes per panel: their ticks and layout would cost several
        times the drawing, on the training's interpreter."""
        count = len(epoch.images)
        columns = min(math.ceil(math.sqrt(count)), COLUMNS)  # near square
        rows = math.ceil(count / columns)
        labels = epoch.labels or [str(k) for k in range(int(max(epoch.target.max(), epoch.preds.max())) + 1)]
        short = [
            label if len(label) <= LABEL_CHARS else f"{label[: LABEL_CHARS - 1].rstrip()}…"
            for label in labels
        ]
        titles = [
            f"{short[int(t)]} → {short[int(p)]}" for t, p in zip(epoch.target, epoch.preds, strict=True)
        ]
        panel = self.panel_size / DPI  # inches
        # a column as wide as its panel and a gap, or as the longest title
        column = max(panel + GAP_IN, max(map(len, titles)) * CHAR_IN)
        width = max(columns * column, 3.6)
        height = SUPTITLE_IN + rows * (TITLE_IN + panel)
        # a bare Figure, not pyplot: no global state, no display backend, safe on a thread of its own
        figure = Figure(figsize=(width, height), dpi=DPI)
        # two lines, so that the narrowest grid holds them
        figure.suptitle(f"misclassified validation images (true → predicted)\n{title or epoch.epoch}", size=9)
        ax = figure.add_axes((0, 0, 1, 1))
        ax.set_axis_off()
        left = (width - columns * column) / 2  # the columns centred
        for i, text in enumerate(titles):
            row, col = divmod(i, columns)
            x = left + col * column + (column - panel) / 2
            y = SUPTITLE_IN + row * (TITLE_IN + panel) + TITLE_IN  # the panel's top
            extent = (x, x + panel, y + panel, y)
            image = epoch.images[i].permute(1, 2, 0).numpy()  # (H, W, C) for imshow
            if image.shape[2] == 1:
                ax.imshow(image[:, :, 0], cmap="gray", vmin=0, vmax=1, extent=extent)
            else:
                ax.imshow(image, extent=extent)
            ax.text(x + panel / 2, y - 0.04, text, fontsize=8, ha="center", va="bottom")
        ax.set_xlim(0, width)  # imshow sets the limits to its image: the whole figure, y down
        ax.set_ylim(height, 0)
        return figure
