"""The Complexity-Diversity Principle's quality and diversity metrics of synthetic queries (Q-D metrics)."""
import itertools
from typing import Optional, Sequence

import numpy as np

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._vectors import normalise


def self_bleu(queries: Sequence[str]) -> float:
    """Self-BLEU of a query set (Zhu et al., 2018), in [0, 1]: the mean over queries of the sentence BLEU of
    each against all the others as references (sacrebleu, 13a tokenisation, exponential smoothing, effective
    n-gram order). Higher means less diverse; NaN for fewer than two queries."""
    if len(queries) < 2:
        return float('nan')
    with requires('cdp'):
        from sacrebleu.metrics import BLEU
    bleu = BLEU(effective_order=True, smooth_method='exp')
    scores = [bleu.sentence_score(q, [r for j, r in enumerate(queries) if j != i]).score for i, q in enumerate(queries)]
    return float(np.mean(scores)) / 100


def paraphrase_ratio(queries: Sequence[str], *, cross_encoder=None, encoder=None,
                     threshold: Optional[float] = None) -> float:
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
        if scores.ndim != 1:
            raise ValueError(f'the cross-encoder gives {scores.shape[1:]} scores a pair: paraphrase_ratio needs a '
                             'single-label paraphrase classifier (one score a pair)')
        threshold = 0.5 if threshold is None else threshold
    elif encoder is not None:
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
    vectors = [np.asarray(v, dtype=float) for v in (synthetic_vectors, real_vectors)]
    if any(v.ndim != 2 or not len(v) for v in vectors) or vectors[0].shape[1] != vectors[1].shape[1]:
        raise ValueError(f'dist_sim needs two non-empty (queries, dim) matrices of one dim, got shapes '
                         f'{vectors[0].shape} and {vectors[1].shape}')
    centroids = [normalise(v).mean(axis=0) for v in vectors]
    return float(normalise(centroids[0]) @ normalise(centroids[1]))


def len_sim(synthetic: Sequence[str], real: Sequence[str]) -> float:
    """Len-Sim: the overlap of the word-count distributions of synthetic and real queries (histogram intersection,
    the sum over lengths of the smaller of the two frequencies), in [0, 1]; 1 when the distributions are equal.

    The paper's exact formula was not available here; this is the project's definition of the metric it names.
    """
    if not synthetic or not real:
        raise ValueError('len_sim needs at least one synthetic and one real query')
    lengths = [np.bincount([len(q.split()) for q in queries]) for queries in (synthetic, real)]
    size = max(len(counts) for counts in lengths)
    frequencies = [np.pad(counts, (0, size - len(counts))) / counts.sum() for counts in lengths]
    return float(np.minimum(*frequencies).sum())
