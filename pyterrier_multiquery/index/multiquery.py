"""Retrieval where each query vector searches on its own and the lists are merged (AMER's multi-query search)."""
from typing import List, Optional

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._transformer import DerivedIdentity, NumResultsCutoff, check_positive, validate_frame

MERGES = ('round_robin', 'score_sum', 'rrf')
SEARCHES = ('exact', 'ann')


def round_robin(lists: List[List[str]], num_results: int) -> List[str]:
    """Interleaves ranked lists rank by rank (list order within a rank), skipping documents already taken."""
    merged, seen = [], set()
    for depth in range(max((len(docs) for docs in lists), default=0)):
        for docs in lists:
            if depth < len(docs) and docs[depth] not in seen:
                seen.add(docs[depth])
                merged.append(docs[depth])
                if len(merged) == num_results:
                    return merged
    return merged


class MultiQueryRetriever(DerivedIdentity, NumResultsCutoff, pt.Transformer):
    """Each row of ``query_embs`` retrieves its own list (MaxSim of one vector: its best match in a document);
    the lists are merged round-robin without duplicates (AMER), by summed scores, or by reciprocal-rank fusion.

    Round-robin scores are ``-rank``; score-sum scores are the sums of the lists' scores; RRF is
    :func:`pyterrier_alpha.fusion.rr_fusion`.
    """
    schematic = {'label': 'MultiQuery'}

    def __init__(self, index, *, merge: str = 'round_robin', num_results: int = 1000,
                 per_vector_results: Optional[int] = None, rrf_k: int = 60, search: str = 'exact',
                 verbose: bool = False, **maxsim_args):
        """
        Args:
            index: The :class:`MultiVectorIndex` (sharded, or over Ray) to search.
            merge: ``round_robin``, ``score_sum`` or ``rrf``.
            num_results: Documents returned per query after merging.
            per_vector_results: Documents each query vector retrieves (default: ``num_results``).
            rrf_k: RRF's rank constant.
            search: How each vector searches: ``exact`` (:meth:`retriever`) or ``ann`` (:meth:`ann_retriever`).
            verbose: Whether to show progress bars.
            maxsim_args: Passed to the per-vector search (``device``, ``threads``; ``ann``, ``candidates``, ... for
                ``search='ann'``).
        """
        if merge not in MERGES:
            raise ValueError(f'merge must be one of {MERGES}, got {merge!r}')
        if search not in SEARCHES:
            raise ValueError(f'search must be one of {SEARCHES}, got {search!r}')
        check_positive(num_results=num_results, per_vector_results=per_vector_results)
        self.index = index
        self.merge = merge
        self.num_results = num_results
        self.per_vector_results = per_vector_results or num_results
        self.rrf_k = rrf_k
        self.verbose = verbose
        self.maxsim_args = maxsim_args
        self.search = search
        method = index.retriever if search == 'exact' else index.ann_retriever
        self.retriever = method(num_results=self.per_vector_results, drop_query_embs=True, verbose=verbose,
                                **maxsim_args)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Retrieves for each query row (``qid``, ``query_embs``) and merges its vectors' lists (its MaxSim retriever
        searches once more where a rebuild replaced the index meanwhile)."""
        validate_frame(self, inp, 'query', ['query_embs'])
        from pyterrier_multiquery.index.maxsim import check_unique_qids, query_matrices
        check_unique_qids(inp)
        query_columns = [c for c in inp.columns if c != 'query_embs']
        if len(inp) == 0:
            return inp[query_columns].assign(docno=pd.Series(dtype=object), score=pd.Series(dtype=float),
                                             rank=pd.Series(dtype=int))
        dim = self.index.searchers().meta['dim']
        queries = query_matrices(inp, dim)
        counts = [len(embs) for embs in queries]
        single = pd.DataFrame({  # one row per query vector, each its own qid; position: the query's row in inp
            'qid': [f'{qid} (vector {vector})' for qid, count in zip(inp['qid'].tolist(), counts)
                    for vector in range(count)],
            'query': '', 'position': np.repeat(np.arange(len(inp)), counts),
            'vector': np.concatenate([np.arange(count) for count in counts]),
            'query_embs': [row[None, :] for embs in queries for row in embs]})
        lists = self.retriever(single)
        if self.merge == 'rrf':
            from pyterrier_alpha.fusion import rr_fusion
            frames = [frame.assign(qid=frame['position'].astype(str))[['qid', 'query', 'docno', 'score']]
                      for _, frame in lists.groupby('vector')]
            merged = rr_fusion(*frames, k=self.rrf_k, num_results=self.num_results)
            merged = merged.assign(position=merged['qid'].astype(int))
        else:
            rows = []
            for position, frame in lists.groupby('position', sort=False):
                if self.merge == 'round_robin':
                    ranked = frame.sort_values(['vector', 'rank']).groupby('vector')
                    docnos = round_robin([group['docno'].tolist() for _, group in ranked], self.num_results)
                    scores = -np.arange(len(docnos), dtype=float)
                else:
                    sums = frame.groupby('docno', sort=False)['score'].sum()
                    docnos, scores = sums.index, sums.to_numpy(dtype=float)
                rows.append(pd.DataFrame({'qid': position, 'position': position, 'docno': docnos, 'score': scores}))
            merged = pt.model.add_ranks(pd.concat(rows, ignore_index=True))
            merged = merged[merged['rank'] < self.num_results]
        merged = merged.sort_values(['position', 'rank'], kind='stable')
        out = inp[query_columns].iloc[merged['position'].to_numpy()].reset_index(drop=True)
        return out.assign(docno=merged['docno'].to_numpy(), score=merged['score'].to_numpy(dtype=float),
                          rank=merged['rank'].to_numpy(dtype=int))

