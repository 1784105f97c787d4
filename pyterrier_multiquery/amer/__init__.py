"""AMER (Autoregressive Multi-Embedding Retriever): model, trainer, query encoder and the synthetic task.

torch and transformers load only with the classes that need them.
"""
import importlib

_ATTRIBUTES = {
    'AMER': 'model',
    'AMERTrainer': 'training',
    'AMERQueryEncoder': 'pipeline',
    'make_task': 'synthetic',
    'random_rotation': 'synthetic',
    'frobenius_orthogonal_rotations': 'synthetic',
}

__all__ = list(_ATTRIBUTES)


def __getattr__(name):
    if name not in _ATTRIBUTES:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(f'{__name__}.{_ATTRIBUTES[name]}'), name)
    globals()[name] = value
    return value
