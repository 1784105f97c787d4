"""PyTerrier operators for diverse and multi-representation retrieval.

Attributes load on first use, so that ``import pyterrier_multiquery`` stays cheap: torch, transformers,
faiss and pyterrier_dr are imported only by the classes that need them.
"""
from pyterrier_multiquery._lazy import lazy_getattr

__version__ = '0.1.0'

_ATTRIBUTES = {
    'MRecall': 'measures',
    'AnswerRecall': 'measures',
    'answer_coverage': 'measures',
    'load_dataset': 'loaders',
    'BeirDataset': 'loaders',
    'TrecDataset': 'loaders',
    'RamDocsDataset': 'loaders',
    'MusiqueDataset': 'loaders',
    'MMR': 'baselines',
    'minilm': 'baselines',
    'bm25': 'baselines',
    'LuceneIndex': 'lucene',
    'flex_index': 'baselines',
    'target_distances': 'analysis',
    'distance_quartiles': 'analysis',
    'low_similarity_subset': 'analysis',
    'paired_bootstrap': 'analysis',
    'MultiVectorIndex': 'index',
    'ShardedMultiVectorIndex': 'index',
    'HuggingFaceGenerator': 'generation',
    'OpenAICompatibleGenerator': 'generation',
    'parse_queries': 'generation',
    'QueryGenerator': 'generation',
    'KeywordExpansion': 'generation',
    'QAEncoder': 'qaencoder',
    'content_words': 'cdp',
    'content_word_count': 'cdp',
    'diversity_advice': 'cdp',
    'self_bleu': 'cdp',
    'paraphrase_ratio': 'cdp',
    'dist_sim': 'cdp',
    'len_sim': 'cdp',
    'complexity_regression': 'cdp',
    'condition_correlations': 'cdp',
    'JPR': 'jpr',
    'IndepPR': 'jpr',
    'DiffRetriever': 'diffretriever',
    'DiffEmbed': 'diffretriever',
    'PromptReps': 'diffretriever',
    'HybridRetriever': 'diffretriever',
    'AMER': 'amer',
    'AMERModel': 'amer',
    'EncoderAMERModel': 'amer',
    'BackOff': 'training.backoff',
}

__all__ = list(_ATTRIBUTES)


__getattr__ = lazy_getattr(__name__, _ATTRIBUTES, globals())


def __dir__():
    return sorted(list(globals()) + __all__)
