"""Optional features: an import that a feature's extra provides fails naming the extra that installs it."""
import contextlib
from typing import Iterator


@contextlib.contextmanager
def requires(extra: str) -> Iterator[None]:
    """Within the block, importing a package that is not installed raises naming ``pyterrier-multiquery[extra]``.

    Args:
        extra: The extra of ``pyproject.toml`` that installs the block's imports (``dense``, ``generation``, ...).

    Raises:
        ModuleNotFoundError: With the pip command that installs the extra, when a module of the block is missing.
    """
    try:
        yield
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"{e.name!r} is not installed: this feature needs pyterrier-multiquery's [{extra}] "
                                  f"extra (pip install 'pyterrier-multiquery[{extra}]')", name=e.name) from e
