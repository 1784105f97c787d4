"""The content-word rule of the Complexity-Diversity Principle: query complexity, measured in content words,
decides whether diverse synthetic queries help a dense retriever; with the paper's regression and per-condition
correlations."""
import re
from typing import Dict, Iterable, Sequence, Set

import numpy as np

from pyterrier_multiquery._extras import requires

#: Below this mean content-word count the paper advises against diverse queries.
AVOID_DIVERSITY_BELOW = 7
#: Above this mean content-word count the paper advises diverse queries.
USE_DIVERSITY_ABOVE = 10

_WORD = re.compile(r'\w+')


def content_words(text: str) -> Set[str]:
    """The unique lower-cased words of ``text`` that are not stopwords and are longer than one character.

    Stopwords are scikit-learn's English list (it ships with the package; NLTK's list would need a download).
    """
    with requires('cdp'):
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
    return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in ENGLISH_STOP_WORDS}


def content_word_count(texts: Iterable[str]) -> float:
    """CW of a query set: the mean number of content words per query."""
    counts = [len(content_words(t)) for t in texts]
    if not counts:
        raise ValueError('content_word_count needs at least one query')
    return float(np.mean(counts))


def diversity_advice(cw: float) -> str:
    """The CDP rule: ``'avoid'`` diverse queries below CW 7, ``'use'`` them above CW 10, else ``'either'``."""
    if cw < AVOID_DIVERSITY_BELOW:
        return 'avoid'
    if cw > USE_DIVERSITY_ABOVE:
        return 'use'
    return 'either'


def complexity_regression(cw: Sequence[float], benefit: Sequence[float]) -> Dict[str, float]:
    """The least-squares line of diversity benefit (diverse minus paraphrase effectiveness) on query complexity (CW),
    as in the paper's regression over its (dataset, condition) points.

    Returns:
        ``r`` and ``p`` (Pearson), ``slope``, ``intercept``, and ``threshold``: the CW at which the fitted benefit
        is zero (below it diversity is predicted to hurt when the slope is positive).
    """
    from scipy.stats import linregress
    if len(cw) != len(benefit) or len(cw) < 3:
        raise ValueError(f'complexity_regression needs at least three paired values, got {len(cw)} and {len(benefit)}')
    fit = linregress(np.asarray(cw, dtype=float), np.asarray(benefit, dtype=float))
    threshold = -fit.intercept / fit.slope if fit.slope else float('nan')
    return {'r': float(fit.rvalue), 'p': float(fit.pvalue), 'slope': float(fit.slope),
            'intercept': float(fit.intercept), 'threshold': float(threshold)}


def condition_correlations(table, *, condition: str = 'condition', cw: str = 'CW', benefit: str = 'benefit'):
    """Per condition (a model and training setting, say), the Pearson correlation between the CW of its datasets and
    the diversity benefit measured on them, as the paper reports it per condition.

    Args:
        table: A pandas frame with one row per (condition, dataset): ``condition``, ``cw`` and ``benefit`` columns.

    Returns:
        A frame indexed by condition with ``r``, ``p`` and ``datasets``.
    """
    import pandas as pd
    from scipy.stats import pearsonr
    missing = {condition, cw, benefit} - set(table.columns)
    if missing:
        raise ValueError(f'condition_correlations needs columns {sorted(missing)}')
    rows = {}
    for name, part in table.groupby(condition, sort=False):
        if len(part) < 3:
            raise ValueError(f'condition {name!r} has {len(part)} datasets; a correlation needs at least three')
        fit = pearsonr(part[cw].astype(float), part[benefit].astype(float))
        rows[name] = {'r': float(fit.statistic), 'p': float(fit.pvalue), 'datasets': len(part)}
    return pd.DataFrame.from_dict(rows, orient='index')
