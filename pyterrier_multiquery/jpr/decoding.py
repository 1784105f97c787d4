"""Decoding a passage sequence from a model of P(next passage | chosen passages): SeqDecode, TreeDecode, top-k.

A decoder gets ``log_probs(prefix)``, the log-probabilities over all candidates given the passages already
chosen (a tuple of indexes; chosen ones at ``-inf``), so the same code runs on a trained model or on a
hand-written table.
"""
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

    The tree starts with the empty sequence. Each step scores every (node s, passage p not in s) that is not
    a node yet by ``l(|s| + 1) * log P(p | s)``, adds the best s + p to the tree, and appends p to the output
    unless it is there already, until ``k`` passages are output. A large ``beta`` keeps the tree one level deep
    (the independent top-k); ``beta = 0`` follows the sequence while its next passage stays the most probable.

    Returns:
        The output passages and the tree's depth (its longest sequence).
    """
    nodes = {(): log_probs(())}
    k = min(k, int(np.isfinite(nodes[()]).sum()))
    output: List[int] = []
    depth = 0
    while len(output) < k:
        best, best_value = None, -np.inf
        for prefix, scores in nodes.items():
            weight = length_penalty(len(prefix) + 1, beta)
            for p in np.flatnonzero(np.isfinite(scores)):
                child = prefix + (int(p),)
                value = weight * scores[p]
                if child not in nodes and value > best_value:
                    best, best_value = child, value
        if best is None:
            break
        depth = max(depth, len(best))
        if best[-1] not in output:
            output.append(best[-1])
        if len(output) < k:
            nodes[best] = log_probs(best)
    return Decoded(output, depth)
