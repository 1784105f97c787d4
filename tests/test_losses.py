import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from pyterrier_multiquery.training.losses import matched_infonce


def brute_force(predictions, candidates, gold, temperature):
    """The smallest mean cross-entropy over every one-to-one pairing of predictions with gold targets."""
    logits = F.normalize(predictions, dim=-1) @ F.normalize(candidates, dim=-1).T / temperature
    best = None
    for targets in itertools.permutations(gold.tolist(), min(len(predictions), len(gold))):
        for steps in itertools.permutations(range(len(predictions)), len(targets)):
            losses = [F.cross_entropy(logits[s:s + 1], torch.tensor([t])) for s, t in zip(steps, targets)]
            loss = sum(losses) / len(targets)
            best = loss if best is None or loss < best else best
    return best


@pytest.mark.parametrize('steps, targets, seed', [(3, 3, 0), (4, 4, 1), (2, 3, 2), (4, 2, 3), (1, 1, 4)])
def test_equals_brute_force_over_pairings(steps, targets, seed):
    torch.manual_seed(seed)
    predictions, candidates = torch.randn(steps, 8), torch.randn(10, 8)
    gold = torch.randperm(10)[:targets]
    loss, assignment = matched_infonce(predictions, candidates, gold, temperature=0.1)
    assert loss.item() == pytest.approx(brute_force(predictions, candidates, gold, 0.1).item(), rel=1e-5)
    assert len(assignment) == min(steps, targets)
    assert len(set(assignment[:, 0].tolist())) == len(set(assignment[:, 1].tolist())) == len(assignment)


def test_order_of_the_gold_set_does_not_matter():
    torch.manual_seed(5)
    predictions, candidates = torch.randn(3, 8), torch.randn(12, 8)
    gold = torch.tensor([7, 2, 9])
    a, _ = matched_infonce(predictions, candidates, gold)
    b, _ = matched_infonce(predictions, candidates, gold.flip(0))
    assert a.item() == pytest.approx(b.item())


def test_hand_case_matches_each_prediction_to_its_own_target():
    # predictions point exactly at candidates 2 and 0 (in that order); gold listed as {0, 2}
    candidates = torch.eye(4)
    predictions = torch.stack([candidates[2], candidates[0]])
    loss, assignment = matched_infonce(predictions, candidates, torch.tensor([0, 2]), temperature=1.0)
    assert assignment.tolist() == [[0, 1], [1, 0]]
    # cross-entropy of logits (1, 0, 0, 0) at the right place: -log(e / (e + 3))
    assert loss.item() == pytest.approx(-math.log(math.e / (math.e + 3)), rel=1e-6)


def test_gradient_step_lowers_the_loss():
    torch.manual_seed(6)
    predictions = torch.randn(3, 8, requires_grad=True)
    candidates, gold = torch.randn(10, 8), torch.tensor([1, 4, 6])
    before, _ = matched_infonce(predictions, candidates, gold)
    before.backward()
    with torch.no_grad():
        after, _ = matched_infonce(predictions - 0.5 * predictions.grad, candidates, gold)
    assert after.item() < before.item()


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match='share d'):
        matched_infonce(torch.randn(2, 4), torch.randn(5, 3), torch.tensor([0]))
    with pytest.raises(ValueError, match='candidate rows'):
        matched_infonce(torch.randn(2, 4), torch.randn(5, 4), torch.tensor([5]))
