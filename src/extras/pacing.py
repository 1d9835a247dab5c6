"""Per-epoch work beside the training (a text sample, a grid of images) kept to a share of the run's time:
on long epochs it runs every time it is asked for, on short ones less often."""

import time
from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L

from src.errors import UserInputError


class Pace:
    """Whether a piece of per-epoch work is due: its last run's time may be at most ``share`` of the wall
    time since that run ended (the first run is always due).

    Under several processes rank 0's clock decides for all (a broadcast), so that work every process takes
    part in (a sharded net's forward) runs on all of them or on none.

    Args:
        share: The most of the run's time the work takes, between 0 (exclusive) and 1; ``None``: the work
            is always due.
        what: Its name in the sentence that refuses a bad ``share``.
    """

    def __init__(self, share: float | None, what: str) -> None:
        if share is not None and not 0 < share <= 1:
            raise UserInputError(f"{what} max_share={share} must lie in (0, 1], or be null for no limit.")
        self.share = share
        self._cost = 0.0
        self._ended: float | None = None
        self._running = False

    def due(self, trainer: L.Trainer) -> bool:
        if self.share is None:
            return True
        now = time.perf_counter()
        due = not self._running and (self._ended is None or now - self._ended >= self._cost / self.share)
        return bool(trainer.strategy.broadcast(due)) if trainer.world_size > 1 else due

    @contextmanager
    def running(self) -> Iterator[None]:
        """Times one run of the work (what :meth:`due` weighs the next one by)."""
        start = self.start()
        try:
            yield
        finally:
            self.ran(start)

    def start(self) -> float:
        """A run of the work begins (asked of a thread or a worker process); none is due until it has
        :meth:`ran`. Returns its start, ``time.perf_counter()``."""
        self._running = True
        return time.perf_counter()

    def ran(self, start: float) -> None:
        """The run begun at ``start`` ended now."""
        self._ended = time.perf_counter()
        self._cost = self._ended - start
        self._running = False

    def reset(self) -> None:
        """A new fit: its first run is due."""
        self._cost, self._ended, self._running = 0.0, None, False
