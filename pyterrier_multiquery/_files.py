"""Writing index folders so that an interrupted build never leaves one that loads."""
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Union

PathLike = Union[str, Path]


@contextmanager
def building(path: PathLike) -> Iterator[Path]:
    """Yields a temporary path beside ``path`` that replaces ``path`` when the block completes.

    The caller creates the folder at the temporary path. If the block raises, the temporary folder is removed
    and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'.{path.name}.building-{os.getpid()}')
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_once(path: PathLike, build: Callable[[str], None]) -> Path:
    """Builds an index folder at ``path`` unless it is already there, never leaving a half-built one.

    Args:
        path: Where the finished index lives.
        build: Writes the index into the (not yet existing) folder it is given.

    Returns:
        The path of the finished index.
    """
    path = Path(path)
    if not path.exists():
        with building(path) as tmp:
            build(str(tmp))
    return path
