"""Lightning's TensorBoard logger, without a filesystem round trip after every logged step."""

import time
from collections.abc import Mapping

from lightning.pytorch import loggers
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override


class TensorBoardLogger(loggers.TensorBoardLogger):
    """``lightning.pytorch.loggers.TensorBoardLogger`` whose ``save()`` does its work at most once a second.

    Lightning calls ``save()`` after every ``log_metrics``: each call flushes the event file and asks the
    filesystem (through fsspec) whether ``hparams.yaml`` exists, about 5 ms on a CPU machine, four times
    an epoch of a short run. Here a call within ``save_every_s`` seconds of the last one that ran is
    skipped, so a value may wait in the event file's buffer until a later save (the next logging step's,
    at the latest the writer's own flush every ``flush_secs``) before a live TensorBoard shows it; the
    run's end (``finalize``) flushes and saves as Lightning's does, and nothing logged is lost to it.

    Args:
        save_every_s: Seconds between two saves that run; 0 saves on every call, as Lightning's does.
        **kwargs: ``TensorBoardLogger``'s (``save_dir``, ``name``, ``version``, ``default_hp_metric`` ...).
    """

    def __init__(self, *args: object, save_every_s: float = 1.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.save_every_s = save_every_s
        self._saved_at: float | None = None

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics({name: value for name, value in metrics.items() if name != "epoch"}, step)

    @override
    @rank_zero_only
    def save(self) -> None:
        now = time.monotonic()
        if self._saved_at is not None and now - self._saved_at < self.save_every_s:
            return
        self._saved_at = now
        super().save()

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        self._saved_at = None  # the last save always runs
        super().finalize(status)
