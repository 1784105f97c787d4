"""JPR (Min et al., 2021): joint passage reranking with dynamic-oracle training and TreeDecode.

Modules: ``oracle`` (greedy answer cover, Gumbel top-k), ``decoding`` (SeqDecode, TreeDecode), ``model``
(:class:`JPRModel`), ``training`` (:class:`JPRTrainer`, :func:`jpr_examples`), ``reranker`` (:class:`JPR`,
:class:`IndepPR`).
torch loads only with the model, trainer and rerankers.
"""
from pyterrier_multiquery._lazy import lazy_getattr

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
    'jpr_examples': 'training',
    'JPR': 'reranker',
    'IndepPR': 'reranker',
}

__all__ = list(_ATTRIBUTES)


__getattr__ = lazy_getattr(__name__, _ATTRIBUTES, globals())
