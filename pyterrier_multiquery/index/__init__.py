"""The MultiVectorIndex: documents with any number of vectors each, searched by MaxSim, mean or multi-query."""
from pyterrier_multiquery.index.core import CorruptIndexError, MultiVectorIndex, MultiVectorIndexer

__all__ = ['MultiVectorIndex', 'MultiVectorIndexer', 'CorruptIndexError']
