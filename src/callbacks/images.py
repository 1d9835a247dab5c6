"""The validation images the model gets wrong, as a grid in TensorBoard's Images tab."""

import math
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from matplotlib.figure import Figure
from torch.utils.tensorboard import SummaryWriter
from typing_extensions import override

from src.callbacks.dashboard import logging_step, tensorboard_writer
from src.errors import UserInputError

TAG = "val/misclassified"


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


class MisclassifiedImages(Callback):
    """A grid of the first misclassified validation images, each titled "true → predicted".

    Reads the images from the batch (``batch[0]``, ``(B, C, H, W)``, as the module saw them) and the
    ``{"preds", "target"}`` dict that ``validation_step`` returns (``(B, K)`` scores or ``(B,)`` class
    ids, and ``(B,)`` class ids); a module whose ``validation_step`` returns no such dict gets one line
    saying so, and no images. Normalization is undone with the DataModule's ``denormalize`` when it has
    one (else each image is scaled to its own range), and classes are named by its ``label_names``.

    Per batch, the misclassified images are gathered to the front on the device and the first
    ``max_images`` kept, without any host sync; the one transfer is at the epoch's end. Under DDP it shows
    what the process that writes the logs (global rank 0) validated. Drawn on every n-th validation epoch
    of a fit and on its last, on a background thread, under the tag ``val/misclassified``.

    Args:
        every_n_epochs: Draw on every n-th validation epoch (and on the last of a fit).
        max_images: At most this many images in the grid.
        image_size: Width and height of the grid, in pixels.
    """

    def __init__(self, every_n_epochs: int = 5, max_images: int = 32, image_size: int = 720) -> None:
        for name, value in {
            "every_n_epochs": every_n_epochs,
            "max_images": max_images,
            "image_size": image_size,
        }.items():
            if value < 1:
                raise UserInputError(f"MisclassifiedImages {name}={value} must be at least 1.")
        self.every_n_epochs = every_n_epochs
        self.max_images = max_images
        self.image_size = image_size
        # the first misclassified images so far this epoch, on the device (see first_misclassified)
        self._kept: Kept | None = None
        self._collecting = False
        self._latest: EpochImages | None = None
        self._pending: list[Future[None]] = []
        self._painter: ThreadPoolExecutor | None = None
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
        if not (isinstance(outputs, Mapping) and "preds" in outputs and "target" in outputs):
            if not self._told:
                self._told = True
                rank_zero_info(
                    f"MisclassifiedImages draws from the {{'preds', 'target'}} dict validation_step returns; "
                    f"{type(pl_module).__name__}.validation_step returns none, so no images are drawn."
                )
            return
        preds, target = outputs["preds"], outputs["target"]
        predicted = preds.argmax(dim=-1) if preds.ndim == 2 else preds  # (B,) class ids
        self._kept = first_misclassified(self._kept, batch[0].detach(), target, predicted, self.max_images)

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
        if not fitting or latest.epoch % self.every_n_epochs == 0:
            self._draw_later(trainer, latest)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the fit's last validation epoch, whatever ended the fit
        if self._latest is not None and not self._latest.drawn:
            self._draw_later(trainer, self._latest)

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
        if errors and drawn:
            raise errors[0]

    def _draw_later(self, trainer: L.Trainer, epoch: EpochImages) -> None:
        epoch.drawn = True
        writer = tensorboard_writer(trainer)
        if writer is None or len(epoch.images) == 0:
            return
        if self._painter is None:
            self._painter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="misclassified-images")
        self._pending.append(self._painter.submit(self._draw, writer, epoch))

    def _draw(self, writer: SummaryWriter, epoch: EpochImages) -> None:
        writer.add_figure(TAG, self.figure(epoch), epoch.step, close=False)

    def figure(self, epoch: EpochImages) -> Figure:
        """The grid: one panel per image, titled "true → predicted" with the label names."""
        count = len(epoch.images)
        columns = math.ceil(math.sqrt(count))
        rows = math.ceil(count / columns)
        inches = self.image_size / 100
        # a bare Figure, not pyplot: no global state, no display backend, safe on a thread of its own
        figure = Figure(figsize=(inches, inches * rows / columns + 0.4), dpi=100, layout="constrained")
        figure.suptitle(f"misclassified validation images (true → predicted), epoch {epoch.epoch}")
        labels = epoch.labels or [str(k) for k in range(int(max(epoch.target.max(), epoch.preds.max())) + 1)]
        for i, ax in enumerate(figure.subplots(rows, columns, squeeze=False).flat):
            ax.set_axis_off()
            if i >= count:
                continue
            image = epoch.images[i].permute(1, 2, 0).numpy()  # (H, W, C) for imshow
            if image.shape[2] == 1:
                ax.imshow(image[:, :, 0], cmap="gray", vmin=0, vmax=1)
            else:
                ax.imshow(image)
            ax.set_title(f"{labels[int(epoch.target[i])]} → {labels[int(epoch.preds[i])]}", fontsize=8)
        return figure
