"""One background thread that draws figures, for any code that writes pictures during a run."""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


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
