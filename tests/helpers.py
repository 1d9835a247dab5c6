"""Callbacks the tests stop runs with, at a chosen optimizer step: as a crash or a scheduler would."""

import os
import signal
import threading

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
    launcher that started it), as a scheduler, the OOM killer or a crash would, or to its whole process group,
    as a terminal sends Ctrl-C; ``delay`` seconds after the step starts, from a timer thread, it lands
    wherever the run is by then (a step, a validation, a write). Each rank first writes its process id to
    ``<folder>/pid<rank>`` so that a test can watch them all, and the sender writes ``<folder>/signalled``
    as it sends."""

    def __init__(
        self, step: int, folder: str, rank: int = 0, name: str = "SIGTERM", parent: bool = False,
        group: bool = False, delay: float = 0.0,
    ) -> None:  # fmt: skip
        self.step, self.folder, self.rank, self.parent, self.group = step, folder, rank, parent, group
        self.signal = signal.Signals[name]
        self.delay = delay
        self.sent = False

    def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
        with open(os.path.join(self.folder, f"pid{trainer.global_rank}"), "w") as file:
            file.write(str(os.getpid()))

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank or self.sent:
            return
        self.sent = True
        if self.delay > 0:
            timer = threading.Timer(self.delay, self._send)
            timer.daemon = True  # a process that ends first ends without sending it
            timer.start()
        else:
            self._send()

    def _send(self) -> None:
        with open(os.path.join(self.folder, "signalled"), "w"):  # its time: the file's
            pass
        if self.group:
            os.killpg(os.getpgid(0), self.signal)
        else:
            os.kill(os.getppid() if self.parent else os.getpid(), self.signal)
