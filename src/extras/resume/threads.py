"""How many CPU threads torch uses within one operation (the resume callback's ``cpu_threads``)."""

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from src.errors import UserInputError


class CpuThreads(Callback):
    """Sets ``torch.set_num_threads`` while the Trainer runs on the CPU, and restores it afterwards.

    torch's default, one thread per core, splits every matrix product across the cores. For the small
    nets of tabular data the split costs more than it saves, and on a machine that other work also
    loads it costs several times over (the threads wait for each other at every operation): the shipped
    MLPs train fastest with 1. Raise it for a large net on a machine of its own; ``null`` keeps torch's
    choice. Under DDP on the CPU each process gets this many.

    Args:
        threads: Intra-op threads during the run; ``None`` leaves torch's setting alone.
    """

    def __init__(self, threads: int | None = 1) -> None:
        if threads is not None and threads < 1:
            raise UserInputError(
                f"cpu_threads threads={threads} must be at least 1, or null for torch's default."
            )
        self.threads = threads
        self._before: int | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.threads is None or trainer.strategy.root_device.type != "cpu" or self._before is not None:
            return
        self._before = torch.get_num_threads()
        torch.set_num_threads(self.threads)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()  # a failed run gets no teardown call

    def _restore(self) -> None:
        if self._before is not None:
            torch.set_num_threads(self._before)
            self._before = None
