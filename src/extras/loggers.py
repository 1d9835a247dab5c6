"""What the callbacks that write into a run share: the TensorBoard writer, the step values line up with,
the monitored value and the best epoch by it, and writing values to every logger."""

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch import loggers
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch.distributed.tensor import DTensor
from torch.utils.tensorboard import SummaryWriter


@runtime_checkable
class StageRuns(Protocol):
    """A TensorBoard logger that writes each stage into a run of its own (the dashboard's)."""

    def run_writer(self, run: str) -> SummaryWriter:
        """The writer of the run ``run`` (``"train"``, ``"validation"``, ``"test"``; ``""``: the folder's
        own)."""
        ...


def tensorboard_writer(trainer: L.Trainer, run: str = "") -> SummaryWriter | None:
    """The TensorBoard writer of one of the run folder's runs (``""``: the folder's own, ``"validation"`` …)
    on the process that writes (global rank 0); None elsewhere, or without a TensorBoard logger. A logger
    without runs per stage (Lightning's own) gives its one writer for every run."""
    if not trainer.is_global_zero:
        return None
    logger = next((lg for lg in trainer.loggers if isinstance(lg, loggers.TensorBoardLogger)), None)
    if isinstance(logger, StageRuns):
        return logger.run_writer(run)
    return logger.experiment if logger is not None else None


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning gives the values logged after a training step (in validation, at an epoch's end),
    so images line up with them: the index of the last optimizer step.

    Lightning's own counter is private; the public ``global_step`` (optimizer steps taken) is one more
    under automatic optimization with one optimizer. Under manual optimization it counts optimizer
    steps, not batches, so with accumulation the images sit at earlier steps than the scalars.
    """
    return max(trainer.global_step - 1, 0)


def monitored(trainer: L.Trainer) -> tuple[str, str]:
    """The value the best checkpoint is chosen by, and whether lower or higher is better (``val/loss``,
    lower, when no checkpoint or early stopping monitors one)."""
    checkpoint = trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.monitor:
        return checkpoint.monitor, checkpoint.mode
    stopper = trainer.early_stopping_callback
    if isinstance(stopper, EarlyStopping):
        return stopper.monitor, stopper.mode
    return "val/loss", "min"


def last_by_cap(trainer: L.Trainer) -> bool:
    """Whether the validation under way is the fit's last by its ``max_epochs`` or ``max_steps`` cap (or a
    stop request), or a validation of its own (``validate``)."""
    if trainer.state.fn != "fit" or trainer.should_stop:
        return True
    epochs, steps = trainer.max_epochs, trainer.max_steps
    by_epochs = epochs is not None and epochs >= 0 and trainer.current_epoch + 1 >= epochs
    return by_epochs or (steps is not None and steps >= 0 and trainer.global_step >= steps)


class BestEpoch:
    """What a callback kept of the best validation epoch so far, by the monitored value (:func:`monitored`),
    to draw at the fit's end; the latest epoch's while the monitored value is not logged.

    ``offer(trainer, kept)`` in ``on_validation_end``, where ``trainer.callback_metrics`` holds the epoch's
    values; ``kept`` is then the best epoch's (``None`` before the first offer).
    """

    def __init__(self) -> None:
        self.kept: Any = None
        self.value: float | None = None
        self.epoch: int | None = None

    def offer(self, trainer: L.Trainer, kept: Any) -> None:
        """Keep ``kept`` when this epoch is the best so far."""
        monitor, mode = monitored(trainer)
        logged = trainer.callback_metrics.get(monitor)
        value = float(logged.item()) if isinstance(logged, torch.Tensor) and logged.numel() == 1 else None
        if value is None or not math.isfinite(value):
            if self.value is None:
                self.kept, self.epoch = kept, trainer.current_epoch
            return
        if self.value is None or (value < self.value if mode == "min" else value > self.value):
            self.kept, self.value, self.epoch = kept, value, trainer.current_epoch

    def title(self, trainer: L.Trainer) -> str:
        """``best epoch 12 (val/loss 0.0812)``, or ``last epoch 12`` without a monitored value."""
        if self.value is None:
            return f"last epoch {self.epoch}"
        return f"best epoch {self.epoch} ({monitored(trainer)[0]} {self.value:.4g})"


def step_loss(trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any) -> torch.Tensor | None:
    """The loss ``training_step`` returned, from the ``outputs`` the batch-end hooks get; ``None`` when
    it returned no single number."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        return None
    # Lightning hands on the automatic loop's loss divided by accumulate_grad_batches
    return loss * trainer.accumulate_grad_batches if pl_module.automatic_optimization else loss


def write(
    trainer: L.Trainer, values: Mapping[str, torch.Tensor | float], step: int, epoch: int | None = None
) -> None:
    """Write scalar values to every logger at ``step``, with the ``epoch`` (by default the current one), as
    Lightning writes logged ones; the tensors are read back from the device together, once."""
    tensors = {name: value for name, value in values.items() if isinstance(value, torch.Tensor)}
    numbers = {name: float(value) for name, value in values.items() if name not in tensors}
    if tensors:
        full = [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors.values()]
        read = torch.stack([t.detach().reshape(()).to(full[0].device, torch.float32) for t in full]).tolist()
        numbers.update(zip(tensors, read, strict=True))
    for logger in trainer.loggers:
        logger.log_metrics({**numbers, "epoch": trainer.current_epoch if epoch is None else epoch}, step=step)
        logger.save()
