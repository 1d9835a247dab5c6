"""Draws figures off the training thread, for any code that writes pictures during a run."""

import warnings
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Future, ThreadPoolExecutor
from typing import Any

from src.extras import workers


class Painter:
    """Draws figures one at a time in the order asked, so that the training does not wait for matplotlib:
    on a worker process (``processes=True``: :mod:`src.extras.workers`, whose Python never holds the training
    interpreter's lock), or on a background thread of this process. For any callback (or code outside
    one) that writes pictures: the validation figures, the misclassified images.

    ``submit(draw, *args, then=write)`` queues ``draw(*args)`` and, once it is drawn, ``write(drawn)`` on a
    thread of this process (where the writers live); ``after(write)`` queues ``write()`` on that thread
    behind every queued drawing's; ``finish(drawn=True)`` waits for every one and raises
    the first error met, ``finish(drawn=False)`` drops those not begun and waits for the one being drawn
    (a failed run's folder may be removed right after), raising nothing. Call ``finish`` before the
    writers the drawings use are closed (a callback's ``teardown`` and ``on_exception``).

    Args:
        name: The thread's name prefix (as a profiler or ``threading.enumerate()`` shows it), and the
            worker process's purpose.
        processes: Draw on a worker process: ``draw`` must then be importable by name from a module that
            imports little (matplotlib and numpy, say), its arguments and result picklable.
    """

    def __init__(self, name: str, processes: bool = False) -> None:
        self.name = name
        self.processes = processes
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Future[Any] | None, Future[None]]] = []

    def submit(self, draw: Callable[..., Any], *args: Any, then: Callable[[Any], None] | None = None) -> None:
        """Queue ``draw(*args)``, then ``then(result)`` on this process's thread (started on first use)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        # those done without an error are let go; an error is kept until finish raises it
        self._pending = [p for p in self._pending if not p[1].done() or p[1].exception() is not None]
        remote = workers.submit(self.name, draw, *args) if self.processes else None

        def here() -> None:
            try:
                drawn = remote.result() if remote is not None else draw(*args)
            except BrokenExecutor as error:  # the worker was killed (for memory, say): a figure, not the run
                warnings.warn(
                    f"The {self.name} worker process ended before it drew ({error}); that figure is left "
                    "out.",
                    stacklevel=1,
                )
                return
            if then is not None:
                then(drawn)

        self._pending.append((remote, self._pool.submit(here)))

    def after(self, then: Callable[[], None]) -> None:
        """Queue ``then()`` on this process's thread, after every drawing queued so far is written."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._pending.append((None, self._pool.submit(then)))

    def finish(self, drawn: bool = True) -> None:
        """Wait for the drawings (or drop those not begun, ``drawn=False``) and stop the thread."""
        pending, self._pending = self._pending, []
        errors = []
        for remote, local in pending:
            if not drawn:
                local.cancel()
                if remote is not None:
                    remote.cancel()  # not begun on the worker: dropped there too
            if not local.cancelled() and (error := local.exception()) is not None:  # waits for it
                errors.append(error)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.processes:  # nothing more to draw: its worker process goes too
            workers.shutdown(self.name)
        if errors and drawn:  # once nothing is drawing any more
            raise errors[0]
