"""Checkpoints are whole or absent, and are read as data only.

Lightning's own save moves its temporary file from ``$TMPDIR``, which on another filesystem (a cluster's
RAM disk) is a copy that a kill cuts short. Here the temporary file lives beside its destination
(:func:`src.files.written`): the final ``os.replace`` is one rename, a full disk one sentence with the old
file as it was, and a killed save's debris is removed by the next save in that folder.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_debug
from typing_extensions import override

from src.checkpoints import read_data
from src.files import written


class AtomicCheckpointIO(TorchCheckpointIO):
    """:class:`TorchCheckpointIO` whose local saves are atomic on every filesystem layout, whose loads never
    run code (see module), and which removes only the checkpoints this process wrote.

    The last rule is what makes a resume safe: a resumed ModelCheckpoint restores the list of files its
    earlier run kept and deletes them as better ones come, files another process wrote (a run resumed
    from an older checkpoint would delete the newer ones for good). Such files are left where they are.
    """

    def __init__(self) -> None:
        super().__init__()
        #: every local checkpoint this process saved, resolved
        self.written: set[Path] = set()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if "://" in str(path):  # remote storage: its own client's semantics
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options.")
        with written(Path(path)) as (temporary,), temporary.open("wb") as file:
            torch.save(checkpoint, file)
        self.written.add(Path(path).resolve())

    @override
    def remove_checkpoint(self, path: str | Path) -> None:
        if "://" in str(path) or Path(path).resolve() in self.written:
            super().remove_checkpoint(path)
            self.written.discard(Path(path).resolve())
        else:
            rank_zero_debug(f"{path} was written by another process; it is kept.")

    @override
    def load_checkpoint(
        self, path: str | Path, map_location: Callable | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if "://" in str(path):  # remote storage: fsspec's client, still as data only
            return super().load_checkpoint(path, map_location, weights_only=True)
        return read_data(path, map_location or "cpu")  # as Lightning's default: every tensor on the CPU
