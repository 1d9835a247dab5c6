"""The one rule for every file the project writes: :func:`check_output` before any work (never an input,
never an existing file unless asked), then :func:`written`, whole or not at all."""

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

#: a temporary file: ``.<stem>.partial-<pid><suffix>``; the suffix last, as ``torch.export.save`` insists
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
    """Whether ``target`` lies under ``folder`` (through links or not), or is a hard link to a file there."""
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
    """``path`` as a regular file this run may write, or one sentence saying why not: never one of
    ``inputs`` (files or folders the run reads) or inside one, nor an existing file unless ``overwrite``;
    ``option`` names ``path`` in the sentence."""
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
    """Why ``folder`` refuses a new file, or ``None``; a real write, as ``access()`` says yes to root."""
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        return err.strerror or str(err)
    return None


@contextmanager
def written(*paths: Path) -> Iterator[list[Path]]:
    """Temporary names for ``paths`` in their folders, flushed and renamed onto them when the block succeeds,
    removed when it fails (a full disk: :class:`NoRoomError`); a killed writer's leftovers are removed.

    Writers whose native code cannot report a failed write (``torch.export.save``) should write bytes here."""
    temporary = [temporary_name(path) for path in paths]
    try:
        for folder in dict.fromkeys(path.parent for path in paths):
            folder.mkdir(parents=True, exist_ok=True)
            remove_leftovers(folder)
        yield temporary
        for temp in temporary:
            _sync(temp)
        # no fsync of the folder: after a power loss each name holds its old file or its new one, both whole
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
    """The out-of-space error in ``err``'s chain (torch's writers wrap it), else ``None``."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in NO_ROOM:
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def no_room_sentence(paths: Iterable[Path], err: OSError) -> str:
    """The one sentence for ``paths`` not written for lack of room."""
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
    """What ``path`` is, in words, when it is neither a regular file nor a folder; None otherwise."""
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
