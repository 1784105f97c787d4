"""The mean-pooling ablation: one mean vector per document and per query, searched by inner product."""
from typing import Optional

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import build_once
from pyterrier_multiquery.index.errors import CorruptIndexError


class MeanRetriever(pt.Transformer):
    """Retrieves by the inner product of the query's mean vector and each document's mean vector.

    The document means are written once to a pyterrier_dr FlexIndex inside the index folder (``mean.flex``, or
    ``mean-normalised.flex``), which does the search.
    """
    schematic = {'label': 'Mean'}

    def __init__(self, index, *, num_results: int = 1000, normalise: bool = False, verbose: bool = False):
        """
        Args:
            index: The :class:`MultiVectorIndex` whose documents are pooled.
            num_results: Documents returned per query.
            normalise: Whether to scale both means to unit length (cosine of the means).
            verbose: Whether to show progress bars.
        """
        self.index = index
        self.num_results = num_results
        self.normalise = normalise
        self.verbose = verbose

    def flex_index(self):
        """The FlexIndex of document means, built the first time it is needed."""
        with requires('dense'):
            from pyterrier_dr import FlexIndex
        path = self.index.path / ('mean-normalised.flex' if self.normalise else 'mean.flex')
        build_once(path, lambda tmp: FlexIndex(tmp, verbose=self.verbose).index(self._document_means()))
        return FlexIndex(str(path), verbose=self.verbose)

    def _document_means(self):
        _, vectors, offsets, docnos = self.index.payload()
        for docid in range(len(offsets) - 1):
            docno, mean = str(docnos.fwd[docid]), self._pool(vectors[offsets[docid]:offsets[docid + 1]])
            if not np.isfinite(mean).all():
                raise CorruptIndexError(f'document {docno!r} has non-finite values (NaN or inf) in its stored vectors: '
                                        f'the index at {str(self.index.path)!r} is damaged; rebuild it')
            yield {'docno': docno, 'doc_vec': mean}

    def _pool(self, embs) -> np.ndarray:
        mean = np.asarray(embs, dtype=np.float64).mean(axis=0)  # a float32 sum could overflow
        return (mean / np.linalg.norm(mean) if self.normalise else mean).astype(np.float32)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Retrieves for each query row (``qid``, ``query_embs``)."""
        from pyterrier_multiquery.index.maxsim import check_unique_qids, query_embs
        pt.validate.query_frame(inp, extra_columns=['query_embs'])
        check_unique_qids(inp)
        dim = self.index.payload()[0]['dim']
        query_vecs = [self._pool(query_embs(embs, dim, qid)) for qid, embs in zip(inp['qid'], inp['query_embs'])]
        # two at least: with one result per query, pyterrier_dr's retriever fills each cell with a one-element array
        # (pyterrier-alpha's DataFrameBuilder takes length-1 columns for one row's values)
        retriever = self.flex_index().np_retriever(num_results=max(self.num_results, 2), drop_query_vec=True)
        out = retriever(inp.assign(query_vec=query_vecs))
        overflowed = ~np.isfinite(out['score'].to_numpy())
        if overflowed.any():
            row = out.iloc[int(np.argmax(overflowed))]
            raise ValueError(f'query {row["qid"]!r}: its score against the mean of document {row["docno"]!r} is '
                             f'{row["score"]} (float32 overflows): scale its query_embs down')
        return out[out['rank'] < self.num_results].reset_index(drop=True)

    def fuse_rank_cutoff(self, k: int) -> Optional['MeanRetriever']:
        """``retriever % k`` with ``k`` below ``num_results`` becomes a retriever of ``k`` results."""
        if k < self.num_results:
            return MeanRetriever(self.index, num_results=k, normalise=self.normalise, verbose=self.verbose)
        return None

    def __eq__(self, other):
        return isinstance(other, MeanRetriever) and (str(self.index.path), self.num_results, self.normalise) == \
            (str(other.index.path), other.num_results, other.normalise)

    def __hash__(self):
        return hash((MeanRetriever, str(self.index.path), self.num_results, self.normalise))

    def __repr__(self):
        return f'{self.index!r}.mean_retriever(num_results={self.num_results}, normalise={self.normalise})'
