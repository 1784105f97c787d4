"""Decoding a passage sequence from a model of P(next passage | chosen passages): SeqDecode, TreeDecode, top-k.

A decoder gets ``log_probs(prefix)``, the log-probabilities over all candidates given the passages already
chosen (a tuple of indexes; chosen ones at ``-inf``), so the same code runs on a trained model or on a
hand-written table.
"""
import heapq
import math
from typing import Callable, List, NamedTuple, Tuple

import numpy as np

LogProbs = Callable[[Tuple[int, ...]], np.ndarray]


class Decoded(NamedTuple):
    """A decoded ranking: the chosen passages in selection order and the depth of the search tree."""
    passages: List[int]
    depth: int


def length_penalty(length: int, beta: float) -> float:
    """l(y) = ((5 + y) / 6) ** beta, the TreeDecode weight of a sequence of ``length`` passages."""
    return ((5. + length) / 6.) ** beta


def independent_decode(log_probs: LogProbs, k: int) -> Decoded:
    """The top ``k`` passages of the first step (what IndepPR does)."""
    first = log_probs(())
    order = [int(i) for i in np.argsort(-first, kind='stable') if np.isfinite(first[i])]
    return Decoded(order[:k], 1)


def seq_decode(log_probs: LogProbs, k: int) -> Decoded:
    """SeqDecode: greedy, each step takes the most probable passage given all those chosen before."""
    prefix, scores = (), log_probs(())
    k = min(k, int(np.isfinite(scores).sum()))
    while len(prefix) < k:
        prefix += (int(np.argmax(scores)),)
        if len(prefix) < k:
            scores = log_probs(prefix)
    return Decoded(list(prefix), len(prefix))


def tree_decode(log_probs: LogProbs, k: int, beta: float) -> Decoded:
    """TreeDecode (the JPR paper's Algorithm 1).

    The tree starts with the empty sequence. Each step takes, over every node s and every passage p that is in
    neither s nor the output, the pair with the best ``l(|s| + 1) * log P(p | s)``, adds s + p to the tree and p
    to the output, until ``k`` passages are output. A large ``beta`` keeps the tree one level deep (the
    independent top-k); ``beta = 0`` follows one sequence while its next passage stays the most probable. Passages
    already output are not expanded again, so a ranking costs ``k`` calls of ``log_probs``; ties go to the
    earlier node, then the lower index. Pairs are compared by the logarithm of their cost
    ``beta * log((5 + y) / 6) + log(-log P)``, so no ``beta`` overflows.

    Returns:
        The output passages and the tree's depth (its longest sequence).
    """
    root = log_probs(())
    k = min(k, int(np.isfinite(root).sum()))
    frontier: List[Tuple[float, int, int, Tuple[int, ...]]] = []   # (log cost, node order, passage, node)

    def expand(prefix: Tuple[int, ...], scores: np.ndarray, order: int) -> None:
        log_weight = beta * math.log((6. + len(prefix)) / 6.)
        with np.errstate(divide='ignore'):
            log_costs = log_weight + np.log(-np.minimum(scores, 0.))   # a certain passage costs log 0 = -inf
        for p in np.flatnonzero(np.isfinite(scores)):
            heapq.heappush(frontier, (float(log_costs[p]), order, int(p), prefix))

    expand((), root, 0)
    output: List[int] = []
    depth = 0
    while len(output) < k and frontier:
        _, _, passage, prefix = heapq.heappop(frontier)
        if passage in output:
            continue
        output.append(passage)
        node = prefix + (passage,)
        depth = max(depth, len(node))
        if len(output) < k:
            expand(node, log_probs(node), len(output))
    return Decoded(output, depth)
