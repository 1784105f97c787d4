"""Training the JPR decoder: dynamic oracle, teacher forcing, or the independent (IndepPR) objective."""
import copy
from typing import AbstractSet, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.jpr.model import JPRModel, PassageEncoder
from pyterrier_multiquery.jpr.oracle import greedy_answer_cover, gumbel_top_k
from pyterrier_multiquery.jpr.reranker import index_order
from pyterrier_multiquery.training.departure import DEPARTURE_GRID, choose_departure
from pyterrier_multiquery.training.distributed import DataParallel
from pyterrier_multiquery.training.splits import dev_split

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


class JPRTrainer:
    """Trains a :class:`JPRModel`'s decoder (and its encoder, when not frozen).

    Each question's candidates get random index numbers once (the paper found rank-ordered indexes bias the
    model). Every epoch each question contributes ``train_candidates`` of its candidates (the paper trains on a
    quarter of |B|): the passages of its greedy answer cover (Algorithm 2) first, then others drawn at random,
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

    def __init__(self, model: JPRModel, *, mode: str = 'dynamic_oracle', k: int = 10, gamma: float = 1.0,
                 train_candidates: int = 5, learning_rate: float = 1e-3, epochs: int = 10, batch_size: int = 16,
                 shuffle: bool = True, seed: int = 0, mixed_precision: Optional[str] = None,
                 gradient_accumulation_steps: int = 1, verbose: bool = True):
        """
        Args:
            model: The model to train.
            mode: One of ``'dynamic_oracle'``, ``'teacher_forcing'``, ``'independent'``.
            k: The most passages in a training prefix.
            gamma: Temperature of the Gumbel top-k negatives.
            train_candidates: Candidates per question in one training example.
            learning_rate: AdamW learning rate.
            epochs: Passes over the questions.
            batch_size: Questions per optimiser step (over all processes).
            shuffle: Whether to put each example's candidates in a random order first (give them in a random
                order yourself otherwise, e.g. :func:`~pyterrier_multiquery.jpr.reranker.index_order`'s).
            seed: Seed of the candidate, order and negative sampling.
            mixed_precision: ``'no'``, ``'fp16'``, ``'bf16'``; None takes ``accelerate launch``'s setting.
            gradient_accumulation_steps: Micro-batches per batch (one backward each).
            verbose: Whether to show progress.
        """
        if mode not in MODES:
            raise ValueError(f'unknown JPR training mode {mode!r}; expected one of {MODES}')
        if train_candidates < 2:
            raise ValueError(f'train_candidates must be at least 2, got {train_candidates}')
        self.model = model
        self.mode = mode
        self.k = k
        self.gamma = gamma
        self.train_candidates = train_candidates
        self.learning_rate = learning_rate
        self.epochs = epochs
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.verbose = verbose
        self.rng = np.random.default_rng(seed)
        self.optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=learning_rate)
        self.parallel = DataParallel(model, self.optimizer, mixed_precision=mixed_precision,
                                     gradient_accumulation_steps=gradient_accumulation_steps)

    def fit(self, examples: Sequence[JPRExample]) -> List[float]:
        """Trains for ``epochs`` passes; returns the mean loss of each epoch."""
        examples = [self.shuffled(e) if self.shuffle else e for e in examples if any(e.answers)]
        if not examples:
            raise ValueError('no training question has a candidate that supports an answer')
        history = []
        epochs = pt.tqdm(range(self.epochs), desc=f'JPR {self.mode}', unit='epoch') if self.verbose \
            else range(self.epochs)
        for _ in epochs:
            history.append(self.epoch(examples))
            if self.verbose:
                epochs.set_postfix(loss=f'{history[-1]:.4f}')
        return history

    def epoch(self, examples: Sequence[JPRExample]) -> float:
        """One pass over ``examples`` (used as given: neither shuffled nor filtered); returns its mean loss."""
        order = self.rng.permutation(len(examples))
        losses = [self.step([examples[i] for i in order[begin:begin + self.batch_size]])
                  for begin in range(0, len(order), self.batch_size)]
        return float(np.mean(losses))

    def shuffled(self, example: JPRExample) -> JPRExample:
        """``example`` with its candidates in a random order, which assigns their index numbers at random.

        The order is drawn once per example, so a frozen encoder encodes each question once.
        """
        order = self.rng.permutation(len(example.passages))
        ranks = None if example.ranks is None else [example.ranks[i] for i in order]
        return JPRExample(example.question, [example.passages[i] for i in order], [example.answers[i] for i in order],
                          ranks)

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
        num_candidates: |B|, candidates per question.
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


def train_jpr(results: pd.DataFrame, qrels: pd.DataFrame, encoder: Union[str, PassageEncoder], *,
              mode: str = 'dynamic_oracle', prior: bool = True, num_candidates: int = 20, k: int = 10,
              epochs: int = 10, dev_fraction: float = 0.2, train_candidates: Optional[int] = None,
              learning_rate: float = 3e-4, gamma: float = 1.0, batch_size: int = 16, decoder_layers: int = 2,
              max_length: int = 128, choose_epoch: bool = True, departure: Union[float, str] = 1., seed: int = 0,
              verbose: bool = False) -> JPRModel:
    """Trains a JPR model (or, with ``mode='independent'``, an IndepPR one) on a first-stage result frame.

    A ``dev_fraction`` of the questions is held out; the model is scored on it (the mean of MRecall@(k/2) and
    MRecall@k of greedy selections) before training and after every epoch, and the returned model is the one of
    the best epoch, the earliest on ties: with a prior, epoch 0 is the first-stage order itself. The returned
    model's ``training_curve`` lists ``{'epoch', 'loss', 'dev'}`` per epoch (epoch 0: untrained, no loss) and
    its ``best_epoch`` the epoch kept. With ``choose_epoch=False`` the last epoch is kept (a schedule fixed in
    advance) and the held-out questions serve only to choose the departure weight: ``departure='one_se'`` scores
    each weight of :data:`~pyterrier_multiquery.training.departure.DEPARTURE_GRID` on them and keeps the one
    :func:`~pyterrier_multiquery.training.departure.choose_departure` picks (``departure_scores`` records the means).

    Args:
        results: First-stage results with ``qid``, ``query``, ``docno``, ``text`` and ``score``.
        qrels: Multi-answer qrels (answer id in ``iteration``).
        encoder: The passage encoder's checkpoint path, or a :class:`PassageEncoder` to share.
        mode: ``'dynamic_oracle'``, ``'teacher_forcing'`` or ``'independent'`` (see :class:`JPRTrainer`).
        prior: Whether the model adds the first-stage rank prior.
        num_candidates: |B|, candidates per question (the rerankers' ``num_candidates``).
        k: Passages chosen, the longest training prefix.
        epochs: Passes over the training questions.
        dev_fraction: Fraction of the questions held out to choose the epoch or the departure (0: none).
        train_candidates: Candidates per question in one training example (default: a quarter of
            ``num_candidates``, at least 2, as the paper trains).
        learning_rate: AdamW learning rate.
        gamma: Temperature of the dynamic oracle's Gumbel negatives.
        batch_size: Questions per optimiser step.
        decoder_layers: Transformer decoder layers.
        max_length: Tokens per candidate text (for an encoder given by path).
        choose_epoch: Whether the held-out questions choose the epoch (else the last one is kept).
        departure: The model's departure weight, or ``'one_se'`` to choose it on the held-out questions.
        seed: Seed of the split, the initialisation, the sampling and the index order (use the same ``seed`` in
            the rerankers).
        verbose: Whether to show progress.
    """
    if departure == 'one_se' and (not dev_fraction or not prior):
        raise ValueError("departure='one_se' chooses the weight on held-out questions of a model with a prior: give "
                         'dev_fraction > 0 and prior=True')
    examples = jpr_examples(results, qrels, num_candidates=num_candidates, seed=seed)
    totals = {}
    for (qid, _), answers in answer_sets(qrels).items():
        totals.setdefault(qid, set()).update(answers)
    qids = [q for q in examples if any(examples[q].answers)]
    if not qids:
        raise ValueError('no training question has a candidate that supports an answer')
    train_qids, dev_qids = dev_split(qids, dev_fraction, seed=seed)
    torch.manual_seed(seed)
    model = JPRModel(encoder, decoder_layers=decoder_layers, max_length=max_length, prior=prior)
    trainer = JPRTrainer(model, mode=mode, k=k, gamma=gamma,
                         train_candidates=train_candidates or max(2, num_candidates // 4), learning_rate=learning_rate,
                         batch_size=batch_size, shuffle=False, seed=seed, verbose=False)
    train, dev = [examples[q] for q in train_qids], [examples[q] for q in dev_qids]

    def score():
        return dev_mrecall(model, dev, [len(totals[q]) for q in dev_qids], k,
                           independent=mode == 'independent') if dev else None

    curve = [{'epoch': 0, 'loss': None, 'dev': score()}]
    best = (curve[0]['dev'], 0, copy.deepcopy(model.state_dict()))
    passes = pt.tqdm(range(1, epochs + 1), desc=f'JPR {mode}', unit='epoch') if verbose else range(1, epochs + 1)
    for epoch in passes:
        curve.append({'epoch': epoch, 'loss': trainer.epoch(train), 'dev': score()})
        if dev and choose_epoch and curve[-1]['dev'] > best[0]:
            best = (curve[-1]['dev'], epoch, copy.deepcopy(model.state_dict()))
        if verbose:
            passes.set_postfix(loss=f'{curve[-1]["loss"]:.4f}', dev=curve[-1]['dev'])
    if dev and choose_epoch:
        model.load_state_dict(best[2])
    model.training_curve = curve
    model.best_epoch = best[1] if dev and choose_epoch else epochs
    model.departure_scores = None
    if departure == 'one_se':
        totals_dev = [len(totals[q]) for q in dev_qids]
        scores = {}
        for weight in DEPARTURE_GRID:
            model.departure = weight
            scores[weight] = dev_scores(model, dev, totals_dev, k, independent=mode == 'independent')
        scores = pd.DataFrame(scores, index=dev_qids)
        model.departure = choose_departure(scores)
        model.departure_scores = {str(w): float(v) for w, v in scores.mean().items()}
    else:
        model.departure = departure
    return model.eval()

