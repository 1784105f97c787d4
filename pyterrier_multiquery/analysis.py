"""Analysis helpers: how far apart a query's targets lie, and paired significance between two systems."""
from typing import Callable, Dict, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
from scipy.spatial.distance import pdist

VectorLookup = Union[Mapping[str, np.ndarray], Callable[[Sequence[str]], np.ndarray]]


def target_distances(qrels: pd.DataFrame, doc_vectors: VectorLookup, *, metric: str = 'cosine') -> pd.Series:
    """Per-query mean pairwise distance between the embeddings of its target (relevant) passages.

    This is the AMER paper's measure of how spread out a query's answers are: the further apart the targets,
    the less a single query vector can be close to all of them.

    Args:
        qrels: Frame with ``qid``, ``docno`` and ``label``; passages with ``label > 0`` are targets.
        doc_vectors: A mapping from docno to vector, or a function from a list of docnos to a 2-D array.
        metric: Any :func:`scipy.spatial.distance.pdist` metric (default: cosine distance).

    Returns:
        A Series indexed by ``qid``: the mean distance over pairs of distinct targets, NaN for a query with
        fewer than two targets.
    """
    missing = [c for c in ('qid', 'docno', 'label') if c not in qrels.columns]
    if missing:
        raise ValueError(f'qrels is missing column(s) {missing}; found {list(qrels.columns)}')
    lookup = doc_vectors if callable(doc_vectors) else (lambda docnos: np.stack([doc_vectors[d] for d in docnos]))
    targets = qrels[qrels['label'] > 0].drop_duplicates(['qid', 'docno'])
    distances = {}
    for qid, group in targets.groupby('qid', sort=False):
        docnos = list(group['docno'])
        distances[qid] = pdist(lookup(docnos), metric=metric).mean() if len(docnos) > 1 else np.nan
    return pd.Series(distances, name='target_distance', dtype=float).rename_axis('qid')


def distance_quartiles(distances: pd.Series) -> pd.Series:
    """Assigns each query with a defined distance to a quartile bin (Q1 = closest targets ... Q4 = furthest)."""
    distances = distances.dropna()
    return pd.qcut(distances, 4, labels=['Q1', 'Q2', 'Q3', 'Q4']).rename('quartile')


def low_similarity_subset(distances: pd.Series, fraction: float = 1 / 3) -> pd.Index:
    """The qids of the ``fraction`` of queries whose targets are furthest apart (the AMER paper's hard third)."""
    if not 0. < fraction <= 1.:
        raise ValueError(f'fraction must lie in (0, 1], got {fraction}')
    distances = distances.dropna()
    count = int(round(len(distances) * fraction))
    return distances.sort_values(ascending=False, kind='stable').index[:count]


def paired_bootstrap(system: Mapping[str, float], baseline: Mapping[str, float], *, n_resamples: int = 10_000,
                     confidence: float = 0.95, seed: Optional[int] = 0) -> Dict[str, float]:
    """Paired bootstrap test of the mean per-query difference ``system - baseline``.

    Queries are resampled with replacement; the two-sided p-value is the fraction of resampled mean
    differences that lie at least as far from the observed mean as the observed mean lies from zero (the
    bootstrap distribution shifted to the null hypothesis of no difference).

    Args:
        system: Per-query scores of the system, by qid (a dict or a Series).
        baseline: Per-query scores of the baseline on the same qids.
        n_resamples: Number of bootstrap samples.
        confidence: Level of the percentile confidence interval of the difference.
        seed: Random seed.

    Returns:
        ``{'mean_diff', 'ci_low', 'ci_high', 'p_value', 'n_queries'}``.
    """
    system, baseline = pd.Series(system, dtype=float), pd.Series(baseline, dtype=float)
    only_one = system.index.symmetric_difference(baseline.index)
    if len(only_one):
        raise ValueError(f'paired test needs the same queries on both sides; {len(only_one)} differ, '
                         f'e.g. {list(only_one[:5])}')
    if len(system) == 0:
        raise ValueError('paired test needs at least one query')
    diffs = (system - baseline.loc[system.index]).to_numpy()
    observed = diffs.mean()
    rng = np.random.default_rng(seed)
    samples = diffs[rng.integers(0, len(diffs), size=(n_resamples, len(diffs)))].mean(axis=1)
    tail = (1. - confidence) / 2.
    return {
        'mean_diff': float(observed),
        'ci_low': float(np.quantile(samples, tail)),
        'ci_high': float(np.quantile(samples, 1. - tail)),
        'p_value': float(np.mean(np.abs(samples - observed) >= abs(observed))),
        'n_queries': len(diffs),
    }
