"""``last.ckpt``: a fit's latest state, written often enough to lose little, seldom enough to cost little."""

import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from src.errors import UserInputError, process_group_error


class LatestCheckpoint(ModelCheckpoint):
    """A :class:`ModelCheckpoint` keeping one ``last.ckpt`` for ``--ckpt_path last``: saved every
    ``every_seconds`` at a step's end, at the fit's end, and on an exception between two steps (not inside
    one, whose update may be half made, nor in a lost distributed process); a save due at an epoch's last
    step waits for a later one, so the validation is not skipped.

    Args:
        dirpath: The folder; left out, ``checkpoints/`` in the logger's run folder.
        every_seconds: Training time between two saves; 0 saves at every step.
        every_n_train_steps: Save every this many optimizer steps instead of by time.
        every_n_epochs: Save at every this many epochs' validation instead of by time.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_seconds: float = 60.0,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
    ) -> None:
        by_time = every_n_train_steps is None and every_n_epochs is None
        super().__init__(
            dirpath=dirpath,
            filename="last",
            save_top_k=1,  # no monitor: the newest replaces the one before
            enable_version_counter=False,
            every_n_train_steps=every_n_train_steps,
            every_n_epochs=every_n_epochs,
            train_time_interval=timedelta(seconds=every_seconds) if by_time else None,
        )
        self.between_steps = True

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.between_steps = False

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.between_steps = True
        if batch_idx + 1 < trainer.num_training_batches:  # (the same on every rank: the decision is shared)
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save_now(trainer)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        if isinstance(exception, SIGTERMException):  # saved, and said where, by whoever stopped the fit
            return
        if process_group_error(exception) is not None:  # a kill -9 of another process: its error says it
            return
        if self.between_steps:
            # a callback may refuse this state (weights no longer finite): the file stays as it was
            with contextlib.suppress(UserInputError):
                self.save_now(trainer)
        elif self.dirpath is not None:
            rank_zero_info(
                f"Stopped inside training step {trainer.global_step}: {self.path} keeps the state of its "
                "last save."
            )

    @property
    def path(self) -> Path:
        return Path(str(self.dirpath)) / f"{self.filename}{self.FILE_EXTENSION}"

    def save_now(self, trainer: L.Trainer) -> None:
        """Write ``last.ckpt`` with everything a resume restores (not a fast_dev_run, which saves nothing)."""
        # fast_dev_run is public and documented, but assigned in a connector without being declared
        if trainer.fast_dev_run or self.dirpath is None or trainer.global_step == 0:  # type: ignore[attr-defined]
            return
        trainer.save_checkpoint(self.path, weights_only=False)
