"""Module attributes that import their submodule on first use, so that importing a package stays cheap."""
import importlib
from typing import Callable, Dict


def lazy_getattr(package: str, attributes: Dict[str, str], namespace: dict) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``package.<attributes[name]>`` on first use.

    Args:
        package: The package's ``__name__``.
        attributes: Attribute name to the submodule (relative to ``package``) that defines it.
        namespace: The package's ``globals()``; a loaded attribute is cached there.
    """
    def __getattr__(name: str):
        if name not in attributes:
            raise AttributeError(f'module {package!r} has no attribute {name!r}')
        value = getattr(importlib.import_module(f'{package}.{attributes[name]}'), name)
        namespace[name] = value
        return value
    return __getattr__
