"""Writing folders (indexes, caches, saved models) so that an interrupted build never leaves one that loads."""
import ctypes
import errno
import fcntl
import hashlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional, Union

PathLike = Union[str, Path]


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(folder: Path, prefix: str) -> None:
    """Removes the leftovers ``<prefix><pid>`` in ``folder`` of builds whose process is no longer alive."""
    for leftover in folder.glob(f'{prefix}*'):
        pid = leftover.name[len(prefix):]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            _remove(leftover)


def followed(path: PathLike) -> Path:
    """``path``, or the path it links to where it is a symbolic link: a build replaces what the link points to."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextmanager
def building(path: PathLike) -> Iterator[Path]:
    """Yields a temporary path beside ``path`` that replaces ``path`` when the block completes.

    The caller creates the folder at the temporary path (``.NAME.building-PID``). If the block raises, the
    temporary folder is removed and ``path`` is left as it was. Whatever is at ``path`` is first renamed away
    (``.NAME.old-PID``), so a build killed at any point leaves the old folder or nothing at ``path``, never a
    half-written or half-deleted one; where the system can swap two paths in one step (Linux), the new folder and
    the old one are swapped instead, so that ``path`` always holds one of them. Leftovers of killed builds of the
    same ``path`` are removed on entry. Where ``path`` is a symbolic link, what it links to is replaced.
    """
    path = followed(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for kind in ('building', 'old'):
        remove_stale(path.parent, f'.{path.name}.{kind}-')
    tmp = path.with_name(f'.{path.name}.building-{os.getpid()}')
    old = path.with_name(f'.{path.name}.old-{os.getpid()}')
    _remove(tmp)
    _remove(old)
    try:
        yield tmp
        if not os.path.lexists(tmp):
            raise FileNotFoundError(f'the build wrote nothing at {str(tmp)!r}; {str(path)!r} is left as it was')
        if os.path.lexists(path) and _exchange(tmp, path):
            return  # the old folder, now at tmp, is removed below
        if os.path.lexists(path):
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            if os.path.lexists(old):
                os.replace(old, path)
            raise
    finally:
        _remove(tmp)
        _remove(old)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Swaps two existing paths in one step (Linux's ``renameat2`` with ``RENAME_EXCHANGE``).

    Returns:
        False, having changed nothing, where the system or the file system cannot.
    """
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), 'renameat2', None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def build_once(path: PathLike, build: Callable[[str], None], *, overwrite: bool = False) -> Path:
    """Builds a folder (an index, a model) at ``path`` unless it is already there, never leaving a half-built one.

    Args:
        path: Where the finished folder lives.
        build: Writes the folder into the (not yet existing) path it is given.
        overwrite: Whether to build even where ``path`` exists (the old folder is replaced once the new one is
            complete).

    Returns:
        The path of the finished folder.
    """
    path = Path(path)
    if overwrite or not path.exists():
        with building(path) as tmp:
            build(str(tmp))
    return path


@contextmanager
def exclusive_lock(path: PathLike) -> Iterator[None]:
    """Holds an exclusive inter-process lock for ``path`` (on the file ``.NAME.lock`` beside it) within the block.

    Another process (or another open of the lock here) asking for the same lock waits until the block ends; the
    operating system releases it when the holder dies, so a killed build never leaves it taken. The holder removes
    the lock file as it leaves; a waiter that then holds the removed file opens the lock again. Where ``path`` is a
    symbolic link, the lock is that of what it links to.
    """
    path = followed(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(f'.{path.name}.lock')
    while True:
        lock = open(lock_path, 'a')
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.path.samestat(os.fstat(lock.fileno()), os.stat(lock_path)):
                break
        except FileNotFoundError:
            pass
        lock.close()  # the holder before removed this file: lock the one at lock_path now
    try:
        yield
    finally:
        try:
            os.unlink(lock_path)
        except FileNotFoundError:  # its folder was removed meanwhile
            pass
        lock.close()  # releases the lock


def file_sha256(path: Union[PathLike, BinaryIO], chunk: int = 1 << 20, *, length: Optional[int] = None) -> str:
    """The SHA-256 of a file's bytes, as hex.

    Args:
        path: The file, or a binary file open for reading (read from where it stands).
        chunk: Bytes read at a time.
        length: Hash only this many bytes (default: to the end).
    """
    if not hasattr(path, 'read'):
        with open(path, 'rb') as f:
            return file_sha256(f, chunk, length=length)
    digest = hashlib.sha256()
    left = float('inf') if length is None else length
    while left > 0 and (block := path.read(int(min(chunk, left)))):
        digest.update(block)
        left -= len(block)
    return digest.hexdigest()
