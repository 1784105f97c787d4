"""Writing folders (indexes, caches, saved models) so that an interrupted build never leaves one that loads."""
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Mapping, Optional, Union

import numpy as np

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


_PR_SET_PDEATHSIG = 1


def exit_with_parent(parent: int) -> None:
    """Has the system kill this process (SIGKILL) as soon as ``parent``, the process that started it, dies (Linux's
    ``PR_SET_PDEATHSIG``); exits at once where ``parent`` is already gone. Elsewhere it does nothing: the caller
    keeps its own checks."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):
        return
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() != parent:
        os._exit(1)  # the parent died before the request took effect


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


#: The file a folder made by :func:`build_once` keeps what made it in.
BUILT_FROM = 'built_from.json'


class StaleBuildError(FileExistsError):
    """A folder is already at the path, made from other records or settings than those asked for."""


def build_once(path: PathLike, build: Callable[[str, Iterable], None], records: Callable[[], Iterable], *,
               settings: Optional[dict] = None, overwrite: bool = False) -> Path:
    """Builds a folder (an index) at ``path`` from ``records``, unless one made from the same records and settings is
    there; never serves one made from others, never leaves a half-built one.

    The folder keeps a SHA-256 of the records it was built from, and ``settings``, in ``built_from.json``. An existing
    folder is reused only where both equal those asked for (the records are read again to hash them: a pass over
    the corpus, no indexing).

    Args:
        path: Where the finished folder lives.
        build: Writes the folder into the (not yet existing) path it is given, from the records it is given.
        records: Returns the records (dicts) to build from.
        settings: Whatever else decides the folder's content (JSON-able).
        overwrite: Whether to build even where a folder made from other records or settings is at ``path`` (it is
            replaced once the new one is complete).

    Raises:
        StaleBuildError: If ``path`` holds a folder made from other records or settings (or one not made by this
            function) and ``overwrite`` is False.
    """
    path = Path(path)
    settings = json.loads(json.dumps(settings or {}))
    if path.exists() and not overwrite:
        made_from = {'records': records_digest(records()), 'settings': settings}
        stored = _built_from(path)
        if stored == made_from:
            return path
        if stored is None:
            raise StaleBuildError(f'{str(path)!r} exists but was not built by this helper (no {BUILT_FROM}): pass '
                                  'overwrite=True to replace it, or choose another path')
        changed = [name for name in ('records', 'settings') if stored.get(name) != made_from[name]]
        raise StaleBuildError(f'{str(path)!r} was built from other {" and ".join(changed)} than these: pass '
                              'overwrite=True to rebuild it, or choose another path')
    with building(path) as tmp:
        hashed = DigestingIterable(records())
        build(str(tmp), hashed)
        if tmp.is_dir():  # else building() names the empty build
            (tmp / BUILT_FROM).write_text(json.dumps({'records': hashed.hexdigest(), 'settings': settings}, indent=1))
    return path


def _built_from(path: Path) -> Optional[dict]:
    try:
        stored = json.loads((path / BUILT_FROM).read_text())
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) else None


class DigestingIterable:
    """Yields the records of an iterable, hashing each as it passes (:func:`records_digest` of all of them)."""

    def __init__(self, records: Iterable):
        self._records = records
        self._digest = hashlib.sha256()
        self._done = False

    def __iter__(self):
        if self._done:
            raise RuntimeError('the records can be read once')
        self._done = True
        for record in self._records:
            self._digest.update(record_bytes(record))
            yield record

    def __len__(self) -> int:
        """The number of records, where the iterable knows it (a ``TypeError`` otherwise, as ``len()`` gives)."""
        return len(self._records)

    def hexdigest(self) -> str:
        """The SHA-256 of the records read so far."""
        return self._digest.hexdigest()


def records_digest(records: Iterable) -> str:
    """The SHA-256 of records (dicts of strings, numbers, arrays, token dicts), in order: equal exactly where every
    field's name, type and value are equal."""
    hashed = DigestingIterable(records)
    for _ in hashed:
        pass
    return hashed.hexdigest()


def record_bytes(value) -> bytes:
    """An unambiguous byte encoding of a record or of one of its values: arrays by dtype, shape and every byte (not
    their printed, abbreviated form), mappings by sorted key."""
    if isinstance(value, Mapping):
        items = sorted((str(k), v) for k, v in value.items())
        return b'{' + b''.join(_framed(k.encode()) + _framed(record_bytes(v)) for k, v in items) + b'}'
    if isinstance(value, np.ndarray) or type(value).__module__ == 'torch':
        array = np.ascontiguousarray(np.asarray(value))
        return b'a' + _framed(f'{array.dtype.str}{array.shape}'.encode()) + _framed(array.tobytes())
    if isinstance(value, (list, tuple)):
        return b'[' + b''.join(_framed(record_bytes(v)) for v in value) + b']'
    if isinstance(value, np.generic):
        value = value.item()
    return b's' + _framed(f'{type(value).__name__}:{value!r}'.encode())


def encoder_digest(encoder, *, name: Optional[str] = None) -> str:
    """The SHA-256 of an encoder: ``name`` (default: its repr) and every tensor of its torch module (``module`` of a
    :class:`~pyterrier_multiquery.multivector_encoder.MultiVectorEncoder`, ``model`` of a pyterrier_dr encoder), so
    that weights changed in place at the same path give another digest."""
    digest = hashlib.sha256((repr(encoder) if name is None else name).encode())
    module = getattr(encoder, 'module', None) or getattr(encoder, 'model', None)
    if hasattr(module, 'state_dict'):
        for key, tensor in module.state_dict().items():
            data = tensor.detach().cpu().contiguous().flatten()
            digest.update(_framed(f'{key}:{data.dtype}:{tuple(tensor.shape)}'.encode()))
            digest.update(_framed((data.float() if data.is_floating_point() else data).numpy().tobytes()))
    return digest.hexdigest()


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(8, 'little') + data


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
