"""Hybrid retrieval: a weighted sum of per-query min-max normalised scores of two retrievers."""
import functools
from typing import List

import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._results import by_query_and_score
from pyterrier_multiquery._transformer import DerivedIdentity


def min_max(scores: pd.Series) -> pd.Series:
    """``(s - min) / (max - min)`` within one list; all ones when every score is equal."""
    low, high = scores.min(), scores.max()
    if high == low:
        return pd.Series(1., index=scores.index)
    return (scores - low) / (high - low)


class HybridRetriever(DerivedIdentity, pt.Transformer):
    """Runs ``first`` and ``second`` on the same queries, keeps each one's top ``num_results``, min-max normalises
    each list per query and scores ``weight * first + (1 - weight) * second`` (a document missing from one list
    counts 0 on that side). DiffRetriever's hybrid is dense MaxSim and sparse with ``weight=0.5``.

    It offers no ``fuse_rank_cutoff``: the normalisation depends on each list's depth, so a shallower hybrid would
    not rank as the cut-off deep one does. It is not written as PyTerrier's ``*`` and ``+`` over pyterrier_alpha's
    ``PerQueryMaxMinScore`` because, measured (docs/ecosystem.md): that class fails in pyterrier-alpha 0.16.5, ``+``
    leaves the documents only the second list found without their query text, and ``minmax_scale`` gives a
    one-document list 0 where it counts 1 here."""
    schematic = {'label': 'Hybrid'}

    def __init__(self, first: pt.Transformer, second: pt.Transformer, *, weight: float = 0.5, num_results: int = 1000):
        if not 0. <= weight <= 1.:
            raise ValueError(f'weight must be in [0, 1], got {weight}')
        self.first, self.second, self.weight, self.num_results = first, second, weight, num_results

    @functools.cached_property
    def inputs(self) -> List[str]:
        """The columns both retrievers need (each one's first input configuration), ``qid`` first."""
        needed = ['qid']
        for retriever in (self.first, self.second):
            configurations = pt.inspect.transformer_inputs(retriever, strict=False) or [[]]
            needed += [c for c in configurations[0] if c not in needed]
        return needed

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.columns(inp, includes=self.inputs)
        if not len(inp):
            return inp.assign(docno=pd.Series(dtype=object), score=pd.Series(dtype=float),
                              rank=pd.Series(dtype=int))
        sides = []
        for retriever, name in ((self.first, 'first'), (self.second, 'second')):
            res = retriever(inp)
            res = res[res['rank'] < self.num_results] if 'rank' in res.columns else res
            res = res.assign(**{name: res.groupby('qid')['score'].transform(min_max)})
            sides.append(res[['qid', 'docno', name]])
        merged = sides[0].merge(sides[1], on=['qid', 'docno'], how='outer').fillna({'first': 0., 'second': 0.})
        merged['score'] = self.weight * merged['first'] + (1 - self.weight) * merged['second']
        queries = inp.drop(columns=['docno', 'score', 'rank'], errors='ignore').drop_duplicates('qid')
        merged = queries.merge(merged.drop(columns=['first', 'second']), on='qid')
        merged = by_query_and_score(merged, ties=('docno',))
        merged = merged.groupby('qid', sort=False).head(self.num_results).reset_index(drop=True)
        return merged.assign(rank=merged.groupby('qid', sort=False).cumcount())
