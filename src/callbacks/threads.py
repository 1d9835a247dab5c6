"""Threads: how many CPU threads torch uses within one operation, and the one that draws figures."""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

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


class Painter:
    """Draws figures on one background thread, one at a time in the order asked, so that the training
    thread does not wait for matplotlib and PNG encoding. For any callback (or code outside one) that
    writes pictures: :class:`~src.callbacks.ValidationFigures`, ``MisclassifiedImages``.

    ``submit(draw, *args)`` queues ``draw(*args)``; ``finish(drawn=True)`` waits for every one and raises the
    first error met, ``finish(drawn=False)`` drops those not begun and waits for the one being drawn (a
    failed run's folder may be removed right after), raising nothing. Call ``finish`` before the writers
    the drawings use are closed (a callback's ``teardown`` and ``on_exception``).

    Args:
        name: The thread's name prefix, as a profiler or ``threading.enumerate()`` shows it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def submit(self, draw: Callable[..., None], *args: Any) -> None:
        """Queue ``draw(*args)`` on the thread (started on first use)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        # those done without an error are let go; an error is kept until finish raises it
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending.append(self._pool.submit(draw, *args))

    def finish(self, drawn: bool = True) -> None:
        """Wait for the drawings (or drop those not begun, ``drawn=False``) and stop the thread."""
        pending, self._pending = self._pending, []
        errors = []
        for future in pending:
            if not drawn:
                future.cancel()
            if not future.cancelled() and (error := future.exception()) is not None:  # waits for it
                errors.append(error)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if errors and drawn:  # once nothing is drawing any more
            raise errors[0]
