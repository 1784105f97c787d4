"""The Complexity-Diversity Principle (Feng et al., 2026): query complexity, measured in content words, decides
whether diverse synthetic queries help a dense retriever."""
import itertools
import re
from typing import Dict, Iterable, Optional, Sequence, Set

import numpy as np

#: Below this mean content-word count the paper advises against diverse queries.
AVOID_DIVERSITY_BELOW = 7
#: Above this mean content-word count the paper advises diverse queries.
USE_DIVERSITY_ABOVE = 10

_WORD = re.compile(r'\w+')


def content_words(text: str) -> Set[str]:
    """The unique lower-cased words of ``text`` that are not stopwords and are longer than one character.

    Stopwords are scikit-learn's English list (it ships with the package; NLTK's list would need a download).
    """
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


def self_bleu(queries: Sequence[str]) -> float:
    """Self-BLEU of a query set (Zhu et al., 2018), in [0, 1]: the mean over queries of the sentence BLEU of
    each against all the others as references (sacrebleu, 13a tokenisation, exponential smoothing, effective
    n-gram order). Higher means less diverse; NaN for fewer than two queries."""
    if len(queries) < 2:
        return float('nan')
    from sacrebleu.metrics import BLEU
    bleu = BLEU(effective_order=True, smooth_method='exp')
    scores = [bleu.sentence_score(q, [r for j, r in enumerate(queries) if j != i]).score for i, q in enumerate(queries)]
    return float(np.mean(scores)) / 100


def paraphrase_ratio(queries: Sequence[str], *, cross_encoder=None, encoder=None, threshold: Optional[float] = None) -> float:
    """The fraction of pairs of a document's generated queries that are paraphrases of each other (higher means
    less diverse); NaN for fewer than two queries.

    With ``cross_encoder`` (a sentence-transformers ``CrossEncoder`` trained for paraphrase detection), a pair is a
    paraphrase when its score reaches ``threshold`` (default 0.5). Without one, ``encoder`` (a pyterrier_dr
    bi-encoder) stands in: a pair is a paraphrase when the cosine similarity of its query vectors reaches
    ``threshold`` (default 0.9). The embedding stand-in is cheaper but is not a paraphrase classifier: it also
    counts close queries that ask different things.
    """
    if len(queries) < 2:
        return float('nan')
    pairs = list(itertools.combinations(range(len(queries)), 2))
    if cross_encoder is not None:
        scores = np.asarray(cross_encoder.predict([(queries[i], queries[j]) for i, j in pairs]), dtype=float)
        threshold = 0.5 if threshold is None else threshold
    elif encoder is not None:
        from pyterrier_multiquery.qaencoder import normalise
        vectors = normalise(np.asarray(encoder.encode_queries(list(queries)), dtype=float))
        scores = np.array([vectors[i] @ vectors[j] for i, j in pairs])
        threshold = 0.9 if threshold is None else threshold
    else:
        raise ValueError('paraphrase_ratio needs a cross_encoder or an encoder')
    return float(np.mean(scores >= threshold))


def dist_sim(synthetic_vectors: np.ndarray, real_vectors: np.ndarray) -> float:
    """Dist-Sim: how close synthetic queries lie to real ones in an encoder's space, as the cosine similarity of the
    centroids of their L2-normalised vectors (rows), in [-1, 1].

    The paper's exact formula was not available here; this is the project's definition of the quality metric it
    names (distribution similarity to the target queries).
    """
    from pyterrier_multiquery.qaencoder import normalise
    centroids = [normalise(np.asarray(v, dtype=float)).mean(axis=0) for v in (synthetic_vectors, real_vectors)]
    return float(normalise(centroids[0]) @ normalise(centroids[1]))


def len_sim(synthetic: Sequence[str], real: Sequence[str]) -> float:
    """Len-Sim: the overlap of the word-count distributions of synthetic and real queries (histogram intersection,
    the sum over lengths of the smaller of the two frequencies), in [0, 1]; 1 when the distributions are equal.

    The paper's exact formula was not available here; this is the project's definition of the metric it names.
    """
    if not synthetic or not real:
        raise ValueError('len_sim needs at least one synthetic and one real query')
    lengths = [np.bincount([len(q.split()) for q in queries]) for queries in (synthetic, real)]
    size = max(len(l) for l in lengths)
    frequencies = [np.pad(l, (0, size - len(l))) / l.sum() for l in lengths]
    return float(np.minimum(*frequencies).sum())


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
