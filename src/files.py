"""The one rule for every file the project writes from a path it was given or chose itself.

- :func:`check_output`, before any work: never over an input of the run (a checkpoint, a data file, a
  config: anything it reads) nor anywhere inside a folder the run reads (a folder of images), never over
  a file that exists unless ``overwrite`` was asked for, and only ever a regular file (a device, a pipe
  or a folder is refused, ``overwrite`` or not).
- :func:`written`, for the writing itself: each file is written under a temporary name in its own
  folder, flushed to disk and renamed onto its destination only when the whole block succeeded, so a
  crash or a kill leaves the destination whole or absent. A temporary file that a killed writer left
  (its process is gone) is removed by the next write in that folder. A write that runs out of room (a
  full disk, a quota) removes its temporary files and ends in one sentence naming the file and the space
  left (:class:`NoRoomError`); whatever the destination held before stays as it was.
"""

import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from src.errors import UserInputError

#: a temporary file: ``.<stem>.partial-<pid><suffix>``; the suffix stays last, since some writers
#: (``torch.export.save``) insist on their extension
TEMPORARY = re.compile(r"^\..*\.partial-(\d+)(\.[^.]*)?$")
#: what a write that ran out of room fails with: the disk is full, or the user's quota is used up
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


class NoRoomError(UserInputError):
    """A file could not be written for lack of space; nothing it would have replaced was touched."""


def temporary_name(path: Path) -> Path:
    """The name ``path`` is written under until it is whole."""
    return path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a writer whose leftovers are not yet leftovers)."""
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files that writers killed before their rename left in ``folder``."""
    removed = []
    for leftover in folder.glob(".*.partial-*"):
        match = TEMPORARY.match(leftover.name)
        if match and int(match.group(1)) != os.getpid() and not alive(int(match.group(1))):
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed


def _same(a: Path, b: Path) -> bool:
    """Whether two paths are one file: the same name after links, or the same inode (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _inside(target: Path, folder: Path) -> bool:
    """Whether ``target`` lies anywhere under ``folder`` (through links or not), or is a hard link to a file
    there."""
    if not folder.is_dir():
        return False
    if any(_same(parent, folder) for parent in target.absolute().parents if parent.exists()):
        return True
    if not target.is_file() or target.stat().st_nlink < 2:  # a file of one name has no other name inside
        return False
    inode = (target.stat().st_dev, target.stat().st_ino)
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                found = os.stat(os.path.join(root, name), follow_symlinks=False)
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == inode:
                return True
    return False


def _flat(inputs: Iterable[object]) -> Iterator[Path]:
    """The local paths among ``inputs``: ``None`` and URLs skipped, lists (several files) opened."""
    for given in inputs:
        if isinstance(given, list | tuple):
            yield from _flat(given)
        elif isinstance(given, str | os.PathLike) and "://" not in str(given):
            yield Path(given)


def check_output(
    path: str | Path, inputs: Iterable[object], overwrite: bool, option: str = "--output"
) -> Path:
    """``path`` as a file this run may write, or one sentence saying why not (:class:`UserInputError`).

    Args:
        path: The file to be written.
        inputs: Every file or folder the run reads (``None`` entries are skipped, lists opened): never
            written, nor anything inside a folder among them, ``overwrite`` or not.
        overwrite: Whether the user asked for an existing file to be replaced.
        option: How the user named ``path``, for the sentence (``--output``, or what it derives from).
    """
    target = Path(path)
    named = f"{option}={str(path)!r}"
    for given in _flat(inputs):
        if _same(target, given):
            raise UserInputError(f"{named} is {str(given)!r}, an input of this run; name another file.")
        if _inside(target, given):
            raise UserInputError(
                f"{named} is inside {str(given)!r}, a folder this run reads; name a file outside it."
            )
    if target.is_symlink():  # a rename would replace the link itself, wherever it pointed
        raise UserInputError(f"{named} is a symbolic link; name the file itself.")
    if target.is_dir() or str(path).endswith(("/", os.sep)):  # Path() drops a trailing slash
        raise UserInputError(f"{named} is a folder; name the file to write inside it.")
    if target.exists() and not target.is_file():
        raise UserInputError(f"{named} is not a regular file (a device, pipe or socket); name a file.")
    if target.exists() and not overwrite:
        raise UserInputError(f"{named} exists; pass --overwrite true to replace it, or name another file.")
    existing = next(p for p in target.absolute().parents if p.exists())
    if not existing.is_dir():
        raise UserInputError(f"{named} cannot be written: {str(existing)!r} is a file, not a folder.")
    refusal = refusal_to_create(existing)
    if refusal is not None:
        raise UserInputError(
            f"{named} cannot be written: {str(existing)!r} refuses new files ({refusal}); name a file "
            "elsewhere."
        )
    return target


def refusal_to_create(folder: Path) -> str | None:
    """Why ``folder`` refuses a new file (the system's words), or ``None`` when it takes one.

    A real write, since ``access()`` says yes to root even where nothing can be created (/proc, a
    read-only mount).
    """
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        return err.strerror or str(err)
    return None


@contextmanager
def written(*paths: Path) -> Iterator[list[Path]]:
    """Temporary names for ``paths`` in their own folders, renamed onto them together when the block
    succeeds and removed when it fails; each is flushed to disk before its rename.

    A block that writes through a file object (not a file name) lets a full disk reach it as an
    ``OSError``, which this turns into :class:`NoRoomError`. Writers whose native code cannot report a
    failed write (``torch.export.save`` aborts the process) should serialize into memory first and write
    the bytes here.
    """
    temporary = [temporary_name(path) for path in paths]
    try:
        for folder in dict.fromkeys(path.parent for path in paths):
            folder.mkdir(parents=True, exist_ok=True)
            remove_leftovers(folder)
        yield temporary
        for temp in temporary:
            _sync(temp)
        # no fsync of the folder after the renames: it would make a rename itself durable, not a file
        # whole; after a power loss each name holds its old file or its new one, both whole (or is absent)
        for temp, path in zip(temporary, paths, strict=True):
            os.replace(temp, path)
    except Exception as err:
        for temp in temporary:  # first, so that the space they held is counted as free
            temp.unlink(missing_ok=True)
        no_room = out_of_room(err)
        if no_room is not None:
            raise NoRoomError(no_room_sentence(paths, no_room)) from err
        raise
    finally:
        for temp in temporary:
            temp.unlink(missing_ok=True)


def out_of_room(err: BaseException) -> OSError | None:
    """The out-of-space error behind ``err`` (itself, or one in its chain of causes), else ``None``.

    torch's writers raise an error of their own (``inline_container``), with the file object's
    ``OSError`` as its context.
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in NO_ROOM:
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def no_room_sentence(paths: Iterable[Path], err: OSError) -> str:
    """The one sentence for ``paths`` not written for lack of room: ``cannot write 'a/last.ckpt': no space
    left on device (40.0 KiB free there), and nothing was replaced; ...``."""
    paths = tuple(paths)
    names = " and ".join(repr(str(path)) for path in paths)
    free = " and ".join(dict.fromkeys(_free(path.parent) for path in paths))
    reason = (err.strerror or os.strerror(err.errno or errno.ENOSPC)).lower()
    return (
        f"cannot write {names}: {reason} ({free} free there), and nothing was replaced; free some space or "
        "write elsewhere."
    )


def free_space(path: str | Path | None) -> str:
    """The space left on the disk of ``path`` (a file or folder; the working folder's for ``None``)."""
    return _free(Path(path).parent if path is not None else Path.cwd())


def _free(folder: Path) -> str:
    """The space this process may still fill on ``folder``'s disk, as ``40.0 KiB``."""
    existing = next((p for p in (folder, *folder.absolute().parents) if p.exists()), Path("/"))
    return size_text(shutil.disk_usage(existing).free)


def size_text(count: int) -> str:
    """A number of bytes as people read it: ``512 bytes``, ``40.0 KiB``, ``1.5 GiB``."""
    if count < 1024:
        return f"{count} bytes"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def _sync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def special_file(path: Path) -> str | None:
    """What ``path`` is, in words, when it is there but is neither a regular file nor a folder: a FIFO, a
    socket, a device (reading one can wait for ever) or a link to nothing; None otherwise."""
    try:
        kind = path.stat().st_mode  # follows links: a link to a FIFO is a FIFO
    except OSError:
        return "a link to nothing" if path.is_symlink() else None
    if stat.S_ISFIFO(kind):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(kind):
        return "a socket"
    if stat.S_ISCHR(kind) or stat.S_ISBLK(kind):
        return "a device"
    return None
