"""JPR (Min et al., 2021): joint passage reranking with dynamic-oracle training and TreeDecode.

Modules: ``oracle`` (greedy answer cover, Gumbel top-k), ``decoding`` (SeqDecode, TreeDecode), ``model``
(:class:`JPRModel`), ``training`` (:class:`JPRTrainer`), ``reranker`` (:class:`JPR`, :class:`IndepPR`).
torch loads only with the model, trainer and rerankers.
"""
import importlib

_ATTRIBUTES = {
    'greedy_answer_cover': 'oracle',
    'gumbel_top_k': 'oracle',
    'seq_decode': 'decoding',
    'tree_decode': 'decoding',
    'independent_decode': 'decoding',
    'length_penalty': 'decoding',
    'JPRModel': 'model',
    'PassageEncoder': 'model',
    'JPRTrainer': 'training',
    'JPRExample': 'training',
    'JPR': 'reranker',
    'IndepPR': 'reranker',
}

__all__ = list(_ATTRIBUTES)


def __getattr__(name):
    if name not in _ATTRIBUTES:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(f'{__name__}.{_ATTRIBUTES[name]}'), name)
    globals()[name] = value
    return value
