"""The MultiVectorIndex: documents with any number of vectors each, searched by MaxSim, mean or multi-query; and
several of them searched as one (ShardedMultiVectorIndex)."""
from pyterrier_multiquery.index.core import MultiVectorIndex, MultiVectorIndexer
from pyterrier_multiquery.index.errors import CorruptIndexError, IndexReplacedError, ShardUnavailableError
from pyterrier_multiquery.index.sharded import ShardedMultiVectorIndex, ShardedMultiVectorIndexer

__all__ = ['MultiVectorIndex', 'MultiVectorIndexer', 'ShardedMultiVectorIndex', 'ShardedMultiVectorIndexer',
           'CorruptIndexError', 'IndexReplacedError', 'ShardUnavailableError']
