"""PyTerrier operators for diverse and multi-representation retrieval.

Attributes load on first use, so that ``import pyterrier_multiquery`` stays cheap: torch, transformers,
faiss and pyterrier_dr are imported only by the classes that need them.
"""
from pyterrier_multiquery._lazy import lazy_getattr

__version__ = '0.1.0'

#: The public surface: operators, indexes, models, trainers, the measures and the loader (30 names). Statistics and
#: analysis live in their submodules: ``pyterrier_multiquery.analysis`` (``paired_bootstrap``, distances),
#: ``pyterrier_multiquery.cdp`` (content words, Self-BLEU, ...), ``pyterrier_multiquery.loaders`` (each collection's
#: dataset class), ``pyterrier_multiquery.measures`` (``answer_coverage``), ``pyterrier_multiquery.generation``
#: (``parse_queries``).
_ATTRIBUTES = {
    # operators
    'MMR': 'baselines',
    'QueryGenerator': 'generation',
    'KeywordExpansion': 'generation',
    'QAEncoder': 'qaencoder',
    'AMER': 'amer',
    'JPR': 'jpr',
    'IndepPR': 'jpr',
    'DiffRetriever': 'diffretriever',
    'DiffEmbed': 'diffretriever',
    'PromptReps': 'diffretriever',
    'HybridRetriever': 'diffretriever',
    'BackOff': 'training.backoff',
    # encoders and generators
    'minilm': 'baselines',
    'HuggingFaceGenerator': 'generation',
    'OpenAICompatibleGenerator': 'generation',
    # indexes
    'MultiVectorIndex': 'index',
    'ShardedMultiVectorIndex': 'index',
    'bm25': 'baselines',
    'flex_index': 'baselines',
    'LuceneIndex': 'lucene',
    # models and their trainers
    'AMERModel': 'amer',
    'EncoderAMERModel': 'amer',
    'AMERTrainer': 'amer',
    'JPRModel': 'jpr',
    'JPRTrainer': 'jpr',
    'DiffRetrieverTrainer': 'diffretriever',
    'BiEncoderTrainer': 'training.bi_encoder',
    # measures and data
    'MRecall': 'measures',
    'AnswerRecall': 'measures',
    'load_dataset': 'loaders',
}

__all__ = list(_ATTRIBUTES)


__getattr__ = lazy_getattr(__name__, _ATTRIBUTES, globals())


def __dir__():
    return sorted(list(globals()) + __all__)
