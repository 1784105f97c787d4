"""QAEncoder (Wang et al., 2025): documents indexed by the mean vector of queries generated for them."""
from pyterrier_multiquery.qaencoder.encoder import (METHODS, QAEncoder, grid_search, interpolate, query_mean,
                                                    text_fingerprint)

__all__ = ['QAEncoder', 'METHODS', 'grid_search', 'query_mean', 'interpolate', 'text_fingerprint']
