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


class SignalAt(Callback):
    """Sends the signal ``name`` during optimizer step ``step`` from one rank: to itself or to its parent (the
    launcher that started it), as a scheduler, the OOM killer or a crash would; each rank first writes its
    process id to ``<folder>/pid<rank>`` so that a test can watch them all."""

    def __init__(self, step: int, folder: str, rank: int = 0, name: str = "SIGTERM", parent: bool = False):
        self.step, self.folder, self.rank, self.parent = step, folder, rank, parent
        self.signal = signal.Signals[name]

    def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
        with open(os.path.join(self.folder, f"pid{trainer.global_rank}"), "w") as file:
            file.write(str(os.getpid()))

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getppid() if self.parent else os.getpid(), self.signal)
