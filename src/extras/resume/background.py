"""Checkpoints written on a background thread, whole or absent: the Trainer's plugin
``configs/defaults.yaml`` names (``trainer.plugins``), over the core's :class:`AtomicCheckpointIO`.

Without this extra the core's :class:`src.checkpoint_io.AtomicCheckpointIO` writes them on the training
thread (``make slim`` names it in this one's place).
"""

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning_utilities import apply_to_collection
from typing_extensions import override

from src.checkpoint_io import AtomicCheckpointIO


class BackgroundCheckpointIO(AsyncCheckpointIO):
    """Lightning's :class:`AsyncCheckpointIO` over :class:`AtomicCheckpointIO`: each checkpoint is copied
    on the training thread (its tensors cloned) and written on Lightning's writer thread, whole or absent.

    Three rules on top of Lightning's plugin, each so that nothing is lost:

    - **one write at a time**: a save first waits for the previous write to be on disk, and raises its
      failure (a full disk: one sentence, :class:`src.files.NoRoomError`) before anything else is
      written; at most one copy of the training state is held besides the model's own;
    - **a removal waits for the write before it**: ``ModelCheckpoint`` removes the best file a new one
      displaces right after asking for the new one, and a kill in between must leave the old file on
      disk, not neither (nor must a new file that failed to be written cost the old one);
    - **every Trainer run ends with its last write on disk**: the Trainer's teardown (the end of
      ``fit``, and the exit after SIGTERM's save) waits for it and raises its failure.

    So ``trainer.save_checkpoint(path)`` may return before ``path`` is written; :meth:`wait` waits.

    Args:
        checkpoint_io: What writes each checkpoint (left out: :class:`AtomicCheckpointIO`); kept as
            ``writer``. Lightning's writer thread lives as long as a Trainer run, not one per save.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self.writer = checkpoint_io if checkpoint_io is not None else AtomicCheckpointIO()
        self.idle = threading.Event()  # no write under way
        self.idle.set()
        self.failure: BaseException | None = None
        super().__init__(_Reporting(self.writer, self._written))

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        self.wait()
        self.idle.clear()
        try:
            # the copy Lightning's plugin makes (every tensor cloned), made in one pass over the plain
            # containers a checkpoint holds: Lightning's general walk costs a small model's checkpoint
            # (some 900 containers and numbers) more than its save. Lightning's own copy passes the
            # Snapshot through as one value, and hands it to the writer
            super().save_checkpoint(Snapshot(snapshot(checkpoint)), path, storage_options)
        except BaseException:
            self.idle.set()  # nothing was handed over (a clone that ran out of memory)
            raise

    @override
    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.wait()
        super().remove_checkpoint(*args, **kwargs)

    @override
    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.wait()  # a file this process is still writing is read whole
        return super().load_checkpoint(*args, **kwargs)

    def wait(self) -> None:
        """Return once the write under way (if any) is on disk; raise its failure if it failed."""
        self.idle.wait()
        if self.failure is not None:
            raise self.failure

    def _written(self, failure: BaseException | None) -> None:
        """Called on the writer's thread after each write."""
        self.failure = self.failure or failure
        self.idle.set()


class Snapshot:
    """A checkpoint copied for the writer thread (:func:`snapshot`), passed on unopened (a plain class:
    Lightning's walk would open a dataclass)."""

    def __init__(self, checkpoint: dict[str, Any]) -> None:
        self.checkpoint = checkpoint


def snapshot(value: Any) -> Any:
    """``value`` with every tensor cloned (detached) and every dict, list and tuple rebuilt: a copy the
    writer thread reads while the training changes the original. Other containers (a namedtuple, a
    dataclass) go through Lightning's general walk, as ``AsyncCheckpointIO`` copies them."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    kind = type(value)
    if kind is dict or kind is OrderedDict:
        return kind((key, snapshot(item)) for key, item in value.items())
    if kind is list:
        return [snapshot(item) for item in value]
    if kind is tuple:
        return tuple(snapshot(item) for item in value)
    if kind in (str, int, float, bool, type(None)):
        return value
    return apply_to_collection(value, torch.Tensor, lambda tensor: tensor.detach().clone())


class _Reporting(CheckpointIO):
    """Writes through ``writer``, and reports the end of each write (with its failure) to ``done``."""

    def __init__(self, writer: CheckpointIO, done: Callable[[BaseException | None], None]) -> None:
        self.writer = writer
        self.done = done

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if isinstance(checkpoint, Snapshot):
            checkpoint = checkpoint.checkpoint
        try:
            self.writer.save_checkpoint(checkpoint, path, storage_options)
        except BaseException as failure:
            self.done(failure)
            raise
        self.done(None)

    @override
    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.writer.load_checkpoint(*args, **kwargs)

    @override
    def remove_checkpoint(self, path: Any) -> None:
        self.writer.remove_checkpoint(path)
