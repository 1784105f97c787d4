"""Contrastive losses shared by the methods' trainers (AMER's matched InfoNCE, DiffRetriever's in-batch InfoNCE)."""
from typing import TYPE_CHECKING, Tuple

from pyterrier_multiquery._extras import requires

if TYPE_CHECKING:
    import torch


def matched_infonce(predictions, candidates, gold, temperature: float = 0.05) -> Tuple['torch.Tensor', 'torch.Tensor']:
    """InfoNCE over an unordered gold set, each prediction matched to a gold target by the Hungarian method.

    Every prediction is scored against every candidate (cosine similarity / ``temperature``); the cost of pairing
    prediction ``t`` with gold target ``j`` is the cross-entropy of picking candidate ``gold[j]`` from prediction
    ``t``'s scores. The pairing that minimises the total cost (``scipy.optimize.linear_sum_assignment`` on the
    detached costs) is used, so the loss does not depend on the order in which the gold set is listed; the loss
    is the mean cost of the matched pairs (``min(T, m)`` of them) and gradients flow through those.

    Args:
        predictions: ``(T, d)`` predicted vectors (e.g. AMER's query vectors of one example).
        candidates: ``(K, d)`` vectors to pick from: the gold targets and the negatives of the batch.
        gold: ``(m,)`` long tensor, the rows of ``candidates`` that are this example's targets.
        temperature: Softmax temperature.

    Returns:
        ``(loss, assignment)``: the scalar loss and a ``(min(T, m), 2)`` tensor of matched
        (prediction, gold index) pairs.
    """
    with requires('dense'):
        import torch
        import torch.nn.functional as F
    from scipy.optimize import linear_sum_assignment
    if predictions.ndim != 2 or candidates.ndim != 2 or predictions.shape[1] != candidates.shape[1]:
        raise ValueError(f'predictions (T, d) and candidates (K, d) must share d; got {tuple(predictions.shape)} '
                         f'and {tuple(candidates.shape)}')
    if gold.numel() == 0 or gold.min() < 0 or gold.max() >= len(candidates):
        raise ValueError(f'gold must be a non-empty set of candidate rows in [0, {len(candidates)}), '
                         f'got {gold.tolist()}')
    logits = F.normalize(predictions, dim=-1) @ F.normalize(candidates, dim=-1).T / temperature
    costs = -F.log_softmax(logits, dim=-1)[:, gold]  # (T, m): cross-entropy of each (prediction, target) pair
    rows, cols = linear_sum_assignment(costs.detach().cpu().numpy())
    rows, cols = torch.as_tensor(rows, device=costs.device), torch.as_tensor(cols, device=costs.device)
    return costs[rows, cols].mean(), torch.stack([rows, cols], dim=1)


def in_batch_infonce(scores, temperature: float, positives=None, reduction: str = 'mean') -> 'torch.Tensor':
    """InfoNCE over a batch's candidates: row ``i`` of ``scores`` (queries by candidates) has its positive in
    column ``positives[i]`` (default: column ``i``).

    Args:
        scores: ``(B, C)`` similarities (by default ``C >= B``: the batch's positives first, then any further
            negatives).
        temperature: Softmax temperature.
        positives: ``(B,)`` column of each row's positive.
        reduction: ``'mean'`` over the rows, or ``'none'`` for each row's loss.
    """
    with requires('dense'):
        import torch
        import torch.nn.functional as F
    if positives is None:
        if scores.ndim != 2 or scores.shape[1] < scores.shape[0]:
            raise ValueError(f'scores must be (B, C) with C >= B, got {tuple(scores.shape)}')
        positives = torch.arange(len(scores), device=scores.device)
    return F.cross_entropy(scores / temperature, torch.as_tensor(positives, device=scores.device),
                           reduction=reduction)
