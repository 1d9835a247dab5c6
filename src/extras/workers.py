"""Worker processes for work beside the training that runs Python of its own (fitting the baselines,
drawing figures): one per purpose, started on first use, shut down by its user when its work is done
(:func:`shutdown`), or exiting when idle; started again when needed.

A thread of the training's process would hold its interpreter's lock while it runs Python, and the
training would wait for it; a process does not. The workers are loky's: a fresh interpreter that imports
only what the submitted function's module imports, never the main module (a CLI's ``python -m src.cli``
would import Lightning), so they start in the time their own imports take.
"""

import signal
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
#: an idle worker exits after this many seconds; the next submission starts another
IDLE_SECONDS = 300
_pools: dict[str, Executor] = {}


def ignore_ctrl_c() -> None:
    """A worker's start: a terminal's Ctrl-C reaches every process of the command, and the training's own
    decides how the run ends (its end shuts the workers down); a worker would only print its traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def submit(purpose: str, function: Callable[..., T], *args: Any) -> "Future[T]":
    """``function(*args)`` on the worker process of ``purpose`` (one per purpose, in submission order).
    ``function`` must be importable by name from a module that imports little (no Lightning, no torch
    where it can be helped), and ``args`` picklable."""
    # loky (and with it two resource-tracker processes) only once a worker has work
    from loky import ProcessPoolExecutor  # type: ignore[import-untyped]  # no py.typed

    for _ in range(2):
        pool = _pools.get(purpose)
        if pool is None:
            # at the training's own CPU priority: the fit waits for what its workers owe at its end, and a
            # worker of a lower one gets next to no CPU on a machine busy with other work, so that the
            # wait would last as long as the other work does
            pool = _pools[purpose] = ProcessPoolExecutor(
                max_workers=1, timeout=IDLE_SECONDS, initializer=ignore_ctrl_c
            )
        try:
            return pool.submit(function, *args)
        except (BrokenExecutor, RuntimeError):  # its worker died, or it was shut down: a new one
            _pools.pop(purpose, None)
    raise RuntimeError(f"the {purpose} worker process could not be started.")


def shutdown(purpose: str) -> None:
    """Stop the worker of ``purpose``, if one runs, once the work it was given is done: what a user of
    :func:`submit` calls when it has no more, so that the command leaves no process behind."""
    pool = _pools.pop(purpose, None)
    if pool is not None:
        pool.shutdown(wait=True)
