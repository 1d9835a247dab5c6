"""Checkpoints are whole or absent: written beside their destination, flushed to disk, then renamed.

Lightning's own save writes the checkpoint through fsspec, whose local "transaction" keeps the
temporary file in ``$TMPDIR`` and moves it at the end; when ``$TMPDIR`` is another filesystem (a RAM
disk, as on many clusters) that move is a copy, and a process killed during it leaves a truncated
``last.ckpt``. Here the temporary file lives in the destination folder, so the final ``os.replace``
is one atomic rename on one filesystem; a temporary file left by a killed save is removed by the next
save in that folder.
"""

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

TEMPORARY = ".tmp-"  # <folder>/.<name>.tmp-<pid>


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class AtomicCheckpointIO(TorchCheckpointIO):
    """:class:`TorchCheckpointIO` whose local saves are atomic on every filesystem layout (see module)."""

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        if "://" in str(path):  # remote storage: its own client's semantics
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options.")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(target.parent)
        temporary = target.with_name(f".{target.name}{TEMPORARY}{os.getpid()}")
        try:
            with temporary.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _sync_folder(target.parent)


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files that saves killed before their rename left in ``folder``."""
    removed = []
    for leftover in folder.glob(f".*{TEMPORARY}*"):
        pid = leftover.name.rsplit(TEMPORARY, 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable: the folder's entry list reaches the disk too."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
