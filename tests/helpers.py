"""Callbacks the tests stop runs with, at a chosen optimizer step: as a crash or a scheduler would."""

import os
import signal

import lightning as L
from lightning.pytorch.callbacks import Callback


class StopAt(Callback):
    """Stops the fit after the given optimizer step, as a crash or a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


class SigtermAt(Callback):
    """Sends this process SIGTERM during a training step, as a scheduler preempting the job would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
