"""The JPR training targets: the greedy answer cover (Algorithm 2) and Gumbel top-k negatives."""
from typing import AbstractSet, List, Sequence

import numpy as np


def greedy_answer_cover(answers: Sequence[AbstractSet], k: int) -> List[int]:
    """The JPR paper's Algorithm 2: passages picked one at a time, each covering the most answers not yet covered.

    Ties go to the earlier passage; the cover stops at ``k`` passages or when no passage adds an answer.

    Args:
        answers: For each candidate passage, the set of answers it supports (empty for a negative).
        k: The most passages to pick.

    Returns:
        Indexes into ``answers``, in picking order.
    """
    if k < 0:
        raise ValueError(f'k must not be negative, got {k}')
    covered, cover = set(), []
    while len(cover) < k:
        gains = [len(set(a) - covered) if i not in cover else 0 for i, a in enumerate(answers)]
        if not gains or max(gains) == 0:
            break
        best = int(np.argmax(gains))
        cover.append(best)
        covered |= set(answers[best])
    return cover


def gumbel_top_k(logits: np.ndarray, k: int, gamma: float, rng: np.random.Generator,
                 exclude: Sequence[int] = ()) -> List[int]:
    """``k`` indexes sampled without replacement from softmax(``logits`` / ``gamma``), by the Gumbel top-k trick.

    Args:
        logits: Prior scores of the candidates.
        k: Number of indexes to draw (fewer when fewer candidates are left).
        gamma: Temperature: near 0 takes the top-scored candidates, large values sample uniformly.
        rng: Source of the Gumbel noise.
        exclude: Indexes never drawn.
    """
    if gamma <= 0:
        raise ValueError(f'gamma must be positive, got {gamma}')
    perturbed = np.asarray(logits, dtype=float) / gamma + rng.gumbel(size=len(logits))
    perturbed[list(exclude)] = -np.inf
    order = np.argsort(-perturbed, kind='stable')
    return [int(i) for i in order[:k] if np.isfinite(perturbed[i])]
