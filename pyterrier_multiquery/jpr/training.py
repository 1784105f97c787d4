"""Training the JPR decoder on a first stage's results: dynamic oracle, teacher forcing, or the independent (IndepPR)
objective."""
from typing import AbstractSet, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.jpr.model import JPRModel
from pyterrier_multiquery.jpr.oracle import greedy_answer_cover, gumbel_top_k
from pyterrier_multiquery.jpr.reranker import index_order
from pyterrier_multiquery.training.distributed import DataParallel
from pyterrier_multiquery.training.trainer import Trainer

with requires('dense'):
    import torch

MODES = ('dynamic_oracle', 'teacher_forcing', 'independent')


class JPRExample(NamedTuple):
    """One training question: its first-stage candidates, the answers each supports, and their first-stage ranks.

    ``ranks`` (0 for the first-stage top passage) is needed to train a model with a prior.
    """
    question: str
    passages: Sequence[str]
    answers: Sequence[AbstractSet]
    ranks: Optional[Sequence[int]] = None


class JPRTrainer(Trainer):
    """Trains a :class:`JPRModel`'s decoder (and its encoder, when not frozen) on a first stage's results.

    ``fit(res_tr, qrels_tr, res_va, qrels_va)`` takes result frames with ``qid``, ``query``, ``docno``, ``text`` and
    ``score``: each question's top ``num_candidates`` are its candidates (:func:`jpr_examples`, in the rerankers'
    index order). The validation questions are scored by the mean of MRecall@(k/2) and MRecall@k of the greedy
    selections. Every epoch each question contributes ``train_candidates`` of its candidates (the paper trains on a
    quarter of ``|B|``): the passages of its greedy answer cover (Algorithm 2) first, then others drawn at random,
    in a random index order. The modes:

    - ``'dynamic_oracle'``: the positives are the cover of that subset (at most ``k``); the prefix is the
      positives and ``k - |positives|`` negatives drawn by Gumbel top-k from the model's own first-step logits
      at temperature ``gamma``, shuffled; each step's target is every positive not yet in the prefix, with loss
      ``-log sum_{p in targets} P(p | prefix)``.
    - ``'teacher_forcing'``: the prefix is the cover in its greedy order and each step's target is the next
      passage of that order (the ablation).
    - ``'independent'``: IndepPR, one step whose targets are all answer-bearing passages,
      loss ``-mean_p log P(p)``.

    Under ``accelerate launch`` the processes share each batch (see :mod:`~pyterrier_multiquery.training.distributed`)
    and train the same model as one process would.
    """
    description = 'JPR'

    def __init__(self, model: JPRModel, *, mode: str = 'dynamic_oracle', num_candidates: int = 20, k: int = 10,
                 gamma: float = 1.0, train_candidates: Optional[int] = None, learning_rate: float = 3e-4,
                 epochs: int = 10, batch_size: int = 16, seed: int = 0, device: Optional[str] = None,
                 threads: Optional[int] = None, choose_epoch: bool = False, departure: Union[float, str, None] = None,
                 first_stage_name: Optional[str] = None, mixed_precision: Optional[str] = None,
                 gradient_accumulation_steps: int = 1, verbose: bool = True):
        """
        Args:
            model: The model to train.
            mode: One of ``'dynamic_oracle'``, ``'teacher_forcing'``, ``'independent'``.
            num_candidates: ``|B|``, each question's candidates (the rerankers' ``num_candidates``).
            k: The most passages in a training prefix, and the validation cutoff.
            gamma: Temperature of the Gumbel top-k negatives.
            train_candidates: Candidates per question in one training example (default: a quarter of
                ``num_candidates``, at least 2, as the paper trains).
            learning_rate: AdamW learning rate.
            epochs: Passes over the questions.
            batch_size: Questions per optimiser step (over all processes).
            seed: Seed of the candidate, order and negative sampling, and of the index order (use the same
                ``seed`` in the rerankers).
            device: Where the model trains (None: accelerate's device, a GPU when there is one).
            threads: torch's CPU threads while training (None: as they are).
            choose_epoch: Keep the epoch that scores best on the validation questions.
            departure: The departure weight, ``'one_se'`` to choose it on the validation questions (a model with a
                prior only), or None to leave it.
            first_stage_name: The name of the first stage whose results it reranks, kept with the model.
            mixed_precision: ``'no'``, ``'fp16'``, ``'bf16'``; None takes ``accelerate launch``'s setting.
            gradient_accumulation_steps: Micro-batches per batch (one backward each).
            verbose: Whether to show progress.
        """
        if mode not in MODES:
            raise ValueError(f'unknown JPR training mode {mode!r}; expected one of {MODES}')
        train_candidates = train_candidates or max(2, num_candidates // 4)
        if train_candidates < 2:
            raise ValueError(f'train_candidates must be at least 2, got {train_candidates}')
        if departure == 'one_se' and not model.prior:
            raise ValueError("departure='one_se' chooses how far a model departs from its first stage's order: it "
                             'needs a model with a prior (JPRModel(..., prior=True))')
        super().__init__(model, learning_rate=learning_rate, epochs=epochs, batch_size=batch_size, seed=seed,
                         device=device, threads=threads, choose_epoch=choose_epoch, departure=departure,
                         verbose=verbose)
        self.description = f'JPR {mode}'
        self.first_stage_name = first_stage_name
        self.mode = mode
        self.num_candidates = num_candidates
        self.k = k
        self.gamma = gamma
        self.train_candidates = train_candidates
        self.rng = np.random.default_rng(seed)
        self.optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=learning_rate)
        self.parallel = DataParallel(model, self.optimizer, device=self.device, mixed_precision=mixed_precision,
                                     gradient_accumulation_steps=gradient_accumulation_steps)

    def record(self) -> dict:
        """The trainer's record, with the first stage the model reranks."""
        return {**super().record(), 'first_stage': self.first_stage_name}

    def examples(self, res: pd.DataFrame, qrels: pd.DataFrame) -> List[JPRExample]:
        """The questions of ``res`` with a candidate that supports an answer, as :class:`JPRExample`."""
        examples = [e for e in jpr_examples(res, qrels, num_candidates=self.num_candidates, seed=self.seed).values()
                    if any(e.answers)]
        if not examples:
            raise ValueError('no training question has a candidate that supports an answer')
        return examples

    def dev_examples(self, res: pd.DataFrame, qrels: pd.DataFrame) -> Tuple[Dict[str, JPRExample], Dict[str, int]]:
        """Every validation question with an answer, and its number of answers (the candidates may miss some)."""
        totals = {}
        for (qid, _), answers in answer_sets(qrels).items():
            totals.setdefault(qid, set()).update(answers)
        examples = jpr_examples(res, qrels, num_candidates=self.num_candidates, seed=self.seed)
        return {q: e for q, e in examples.items() if q in totals}, {q: len(a) for q, a in totals.items()}

    def dev_scores(self, dev) -> pd.Series:
        """Each validation question's mean of MRecall@(k/2) and MRecall@k of the greedy selections."""
        examples, totals = dev
        return pd.Series(dev_scores(self.model, list(examples.values()), [totals[q] for q in examples], self.k,
                                    independent=self.mode == 'independent'), index=list(examples), dtype=float)

    def train_epoch(self, examples: Sequence[JPRExample], epoch: int, step) -> None:
        """One pass over ``examples`` in a random order, ``batch_size`` questions a step."""
        order = self.rng.permutation(len(examples))
        for begin in range(0, len(order), self.batch_size):
            step(self.step([examples[i] for i in order[begin:begin + self.batch_size]]))

    def step(self, batch: Sequence[JPRExample]) -> float:
        """One optimiser step on ``batch``; returns its loss."""
        self.model.train()
        drawn = self.draw(batch)
        steps = sum(int(t.any(-1).sum()) for t in drawn['targets'])
        return self.parallel.step(len(batch), lambda share: self.step_losses(drawn, share.local).sum(), steps)

    def loss(self, batch: Sequence[JPRExample]) -> torch.Tensor:
        """The training loss of ``batch``, with freshly sampled subsets, orders and prefixes: the mean over the
        steps that have a target."""
        return self.step_losses(self.draw(batch), np.arange(len(batch))).mean()

    def draw(self, batch: Sequence[JPRExample]) -> dict:
        """A batch with its random choices made: each example's candidate subset, prefix and targets (a boolean
        (steps + 1, candidates) array per example: the positives of the step after each prefix)."""
        subsets = [self.subset(e) for e in batch]
        answers = [[batch[b].answers[i] for i in subset] for b, subset in enumerate(subsets)]
        prior = None
        if self.mode == 'dynamic_oracle':
            with torch.no_grad():
                memory, mask, ranks = self.memory(batch, subsets)
                empty = torch.zeros(len(batch), 0, dtype=torch.long, device=memory.device)
                prior = self.model(memory, empty, mask, ranks)[:, 0].cpu().numpy()
        prefixes, targets = zip(*[self.targets(a, None if prior is None else prior[b]) for b, a in enumerate(answers)])
        width = max(len(s) for s in subsets)
        masks = []
        for p, t in zip(prefixes, targets):
            target = np.zeros((len(p) + 1, width), dtype=bool)
            for step, positives in enumerate(t):
                target[step, positives] = True
            masks.append(target)
        return {'batch': batch, 'subsets': subsets, 'prefixes': prefixes, 'targets': masks}

    def step_losses(self, drawn: dict, positions: np.ndarray) -> torch.Tensor:
        """The losses of every step with a target of the examples at ``positions`` of a batch from :meth:`draw`."""
        batch = [drawn['batch'][i] for i in positions]
        memory, mask, ranks = self.memory(batch, [drawn['subsets'][i] for i in positions])
        prefixes = [drawn['prefixes'][i] for i in positions]
        steps = max(len(p) for p in prefixes)
        prefix = torch.full((len(batch), steps), -1, dtype=torch.long, device=memory.device)
        target = torch.zeros(len(batch), steps + 1, memory.shape[1], dtype=torch.bool, device=memory.device)
        for b, (p, i) in enumerate(zip(prefixes, positions)):
            prefix[b, :len(p)] = torch.tensor(p, dtype=torch.long)
            example_target = torch.as_tensor(drawn['targets'][i], device=memory.device)
            target[b, :len(example_target), :example_target.shape[1]] = example_target[:, :memory.shape[1]]
        used = target.any(-1)  # steps after the last positive have nothing to learn
        log_probs, target = self.model(memory, prefix, mask, ranks)[used], target[used]
        if self.mode == 'independent':
            return -(log_probs.masked_fill(~target, 0.).sum(-1) / target.sum(-1))
        return -log_probs.masked_fill(~target, float('-inf')).logsumexp(-1)

    def subset(self, example: JPRExample) -> List[int]:
        """Candidate positions for one example: its cover first, others at random, then shuffled."""
        cover = greedy_answer_cover(example.answers, self.k)[:self.train_candidates]
        others = [i for i in range(len(example.passages)) if i not in cover]
        extra = self.rng.permutation(others)[:self.train_candidates - len(cover)].tolist()
        return [int(i) for i in self.rng.permutation(cover + extra)]

    def memory(self, batch: Sequence[JPRExample], subsets: Sequence[List[int]]):
        """Encoder states of each example's subset, padded: (batch, candidates, width), the padding mask and the
        candidates' first-stage ranks (None for a model without a prior)."""
        return candidate_tensors(self.model, batch, subsets)

    def targets(self, answers: Sequence[AbstractSet],
                prior: Optional[np.ndarray] = None) -> Tuple[List[int], List[List[int]]]:
        """The prefix and, for each of its steps and the one after, the target positions.

        Args:
            answers: The answers of each candidate of the example.
            prior: The model's first-step log-probabilities of the candidates (for the dynamic oracle's negatives).
        """
        if self.mode == 'independent':
            return [], [[i for i, a in enumerate(answers) if a]]
        k = min(self.k, len(answers))
        cover = greedy_answer_cover(answers, k)
        if self.mode == 'teacher_forcing':
            return cover, [[p] for p in cover]
        prior = np.where(np.isfinite(prior), prior, -1e9)
        negatives = gumbel_top_k(prior[:len(answers)], k - len(cover), self.gamma, self.rng, exclude=cover)
        prefix = [int(i) for i in self.rng.permutation(cover + negatives)]
        targets = [[p for p in cover if p not in prefix[:step]] for step in range(len(prefix) + 1)]
        return prefix, targets


def candidate_tensors(model: JPRModel, examples: Sequence[JPRExample],
                      subsets: Optional[Sequence[Sequence[int]]] = None):
    """The model's inputs for some candidates of each example, padded to the longest.

    Args:
        model: The model whose encoder computes the states (cached when frozen).
        examples: The questions.
        subsets: Candidate positions of each example (default: all of them, in order).

    Returns:
        States (batch, candidates, width), the padding mask (batch, candidates), and the candidates' first-stage
        ranks (batch, candidates), None for a model without a prior.
    """
    subsets = subsets or [range(len(e.passages)) for e in examples]
    device = model.start.device
    width = max(len(s) for s in subsets)
    memory = torch.zeros(len(examples), width, model.width, device=device)
    mask = torch.ones(len(examples), width, dtype=torch.bool, device=device)
    ranks = torch.zeros(len(examples), width, dtype=torch.long, device=device) if model.prior else None
    for b, (example, subset) in enumerate(zip(examples, subsets)):
        index = torch.tensor(list(subset), dtype=torch.long)
        states = model.passages(example.question, list(example.passages))
        memory[b, :len(index)] = states[index.to(states.device)]
        mask[b, :len(index)] = False
        if ranks is not None:
            if example.ranks is None:
                raise ValueError('a JPR model with a first-stage prior needs the candidates\' ranks: '
                                 'JPRExample(..., ranks=...)')
            ranks[b, :len(index)] = torch.as_tensor(list(example.ranks), dtype=torch.long)[index]
    return memory, mask, ranks


def answer_sets(qrels: pd.DataFrame) -> Dict[Tuple[str, str], set]:
    """The answers each relevant (qid, docno) supports: its ``iteration`` ids, or the docno itself where the qrels
    have no answer ids (no ``iteration`` column, or TREC's placeholders ``'0'``/``'Q0'``), as the multi-answer
    measures count them."""
    from pyterrier_multiquery.measures import answer_ids
    relevant = qrels[qrels['label'] > 0].astype({'qid': str, 'docno': str})
    return answer_ids(relevant).groupby([relevant['qid'], relevant['docno']]).agg(set).to_dict()


def jpr_examples(results: pd.DataFrame, qrels: pd.DataFrame, *, num_candidates: int = 20,
                 seed: int = 0) -> Dict[str, JPRExample]:
    """Each question's top ``num_candidates`` first-stage passages as a :class:`JPRExample`, by qid.

    The candidates are those the rerankers take (the top ``num_candidates`` by ``score``), in the index order
    the rerankers give them (:func:`~pyterrier_multiquery.jpr.reranker.index_order` with ``seed``), each with its
    first-stage rank and the answers it supports.

    Args:
        results: A result frame with ``qid``, ``query``, ``docno``, ``text`` and ``score``.
        qrels: Multi-answer qrels (``qid``, ``docno``, ``label``, the answer id in ``iteration``).
        num_candidates: ``|B|``, candidates per question.
        seed: Seed of the index order (the rerankers' ``seed``).
    """
    pt.validate.result_frame(results, extra_columns=['query', 'text'])
    answers = answer_sets(qrels)
    results = results.sort_values(['qid', 'score'], ascending=[True, False], kind='stable')
    examples = {}
    for qid, frame in results.groupby('qid', sort=False):
        frame = frame.head(num_candidates)
        order = index_order(qid, len(frame), seed)
        frame = frame.iloc[order]
        examples[str(qid)] = JPRExample(frame['query'].iloc[0], frame['text'].tolist(),
                                        [answers.get((str(qid), str(d)), set()) for d in frame['docno']],
                                        [int(r) for r in order])
    return examples


def greedy_selections(model: JPRModel, examples: Sequence[JPRExample], k: int, *,
                      independent: bool = False) -> List[List[int]]:
    """The ``k`` candidate positions SeqDecode (or the independent top ``k``) picks for each example, batched."""
    model.eval()
    with torch.no_grad():
        memory, mask, ranks = candidate_tensors(model, examples)
        prefix = torch.zeros(len(examples), 0, dtype=torch.long, device=memory.device)
        if independent:
            first = model(memory, prefix, mask, ranks)[:, 0]
            top = first.topk(min(k, first.shape[1]), -1)
            chosen = top.indices.masked_fill(~torch.isfinite(top.values), -1)
        else:
            for _ in range(min(k, memory.shape[1])):
                log_probs = model(memory, prefix, mask, ranks)[:, -1]
                best = log_probs.max(-1)
                prefix = torch.cat([prefix, best.indices.masked_fill(~torch.isfinite(best.values), -1)[:, None]], 1)
            chosen = prefix
    return [[int(i) for i in row if i >= 0] for row in chosen.tolist()]


def dev_mrecall(model: JPRModel, examples: Sequence[JPRExample], totals: Sequence[int], k: int, *,
                independent: bool = False) -> float:
    """Mean of MRecall@(k/2) and MRecall@k of the greedy selections, ``totals`` being each question's answer count."""
    return float(np.mean(dev_scores(model, examples, totals, k, independent=independent)))


def dev_scores(model: JPRModel, examples: Sequence[JPRExample], totals: Sequence[int], k: int, *,
               independent: bool = False) -> List[float]:
    """Each question's mean of MRecall@(k/2) and MRecall@k of the greedy selections (see :func:`dev_mrecall`)."""
    scores = []
    for example, total, chosen in zip(examples, totals, greedy_selections(model, examples, k, independent=independent)):
        hits = [total > 0 and len(set().union(*(example.answers[i] for i in chosen[:cutoff]))) >= min(total, cutoff)
                for cutoff in (max(1, k // 2), k)]
        scores.append(float(np.mean(hits)))
    return scores
