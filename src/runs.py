"""Run folders are the user's record: which run a checkpoint belongs to, how far each of its checkpoints
got, and the lock that keeps one process writing into a run at a time.

A run folder is ``<save_dir>/<name>/<version>/``, its checkpoints in ``checkpoints/``. A fit writes into
a run folder that already holds checkpoints only when it resumes from the newest of them (or is told
``--overwrite true``); two fits never write into one run folder at once.
"""

import fcntl
import os
from pathlib import Path

import torch


def run_of(ckpt_path: str | Path) -> Path | None:
    """The run folder of ``<run>/checkpoints/<file>.ckpt``, or ``None`` for a checkpoint elsewhere."""
    folder = Path(ckpt_path).resolve().parent
    return folder.parent if folder.name == "checkpoints" else None


def step_of(ckpt_path: str | Path) -> int:
    """The optimizer steps a checkpoint had taken, read without loading its tensors (memory-mapped)."""
    try:
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a file that is no whole checkpoint has taken no step worth keeping track of
        return -1
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return step if isinstance(step, int) else -1


def replaced_by_resuming(ckpt_path: str | Path, run: Path) -> Path | None:
    """The run's ``last.ckpt`` when it got further than ``ckpt_path`` (more optimizer steps): a fit resumed
    from ``ckpt_path`` inside that run would replace it with an earlier state. ``None`` otherwise."""
    last = run / "checkpoints" / "last.ckpt"
    if not last.is_file() or last.resolve() == Path(ckpt_path).resolve():
        return None
    return last if step_of(last) > step_of(ckpt_path) else None


def checkpoints_in(folder: Path) -> list[Path]:
    """The checkpoints a run folder holds, at any depth."""
    return sorted(folder.rglob("*.ckpt")) if folder.is_dir() else []


def first_process() -> bool:
    """Whether this process writes the run's files (global rank 0), known from what launchers set before
    the Trainer knows its own rank: a global ``RANK`` or ``SLURM_PROCID``, else ``LOCAL_RANK`` on node 0."""
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key]) == 0
    return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0


class RunLock:
    """An exclusive lock on a run folder, held from a fit's start to its end.

    ``flock`` on the folder itself: nothing is written into it, and the system releases the lock when the
    process ends, however it ends (a kill leaves no stale lock behind).
    """

    def __init__(self) -> None:
        self._held: int | None = None

    def acquire(self, folder: Path) -> bool:
        """Lock ``folder`` (made when missing); ``False`` when another process holds it."""
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        self.release()
        self._held = descriptor
        return True

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held)  # closing the descriptor releases its lock
            self._held = None
