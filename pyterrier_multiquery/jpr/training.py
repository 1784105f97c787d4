"""Training the JPR decoder: dynamic oracle, teacher forcing, or the independent (IndepPR) objective."""
from typing import AbstractSet, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pyterrier as pt
import torch

from pyterrier_multiquery.jpr.model import JPRModel
from pyterrier_multiquery.jpr.oracle import greedy_answer_cover, gumbel_top_k

MODES = ('dynamic_oracle', 'teacher_forcing', 'independent')


class JPRExample(NamedTuple):
    """One training question: its first-stage candidates and the answers each candidate supports."""
    question: str
    passages: Sequence[str]
    answers: Sequence[AbstractSet]


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
    """

    def __init__(self, model: JPRModel, *, mode: str = 'dynamic_oracle', k: int = 10, gamma: float = 1.0,
                 train_candidates: int = 5, learning_rate: float = 1e-3, epochs: int = 10, batch_size: int = 16,
                 shuffle: bool = True, seed: int = 0, verbose: bool = True):
        """
        Args:
            model: The model to train.
            mode: One of ``'dynamic_oracle'``, ``'teacher_forcing'``, ``'independent'``.
            k: The most passages in a training prefix.
            gamma: Temperature of the Gumbel top-k negatives.
            train_candidates: Candidates per question in one training example.
            learning_rate: AdamW learning rate.
            epochs: Passes over the questions.
            batch_size: Questions per optimiser step.
            shuffle: Whether to put each example's candidates in a random order first (give them in a random
                order yourself otherwise, e.g. :func:`~pyterrier_multiquery.jpr.reranker.index_order`'s).
            seed: Seed of the candidate, order and negative sampling.
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

    def fit(self, examples: Sequence[JPRExample]) -> List[float]:
        """Trains for ``epochs`` passes; returns the mean loss of each epoch."""
        examples = [self.shuffled(e) if self.shuffle else e for e in examples if any(e.answers)]
        if not examples:
            raise ValueError('no training question has a candidate that supports an answer')
        history = []
        epochs = pt.tqdm(range(self.epochs), desc=f'JPR {self.mode}', unit='epoch') if self.verbose \
            else range(self.epochs)
        for _ in epochs:
            order = self.rng.permutation(len(examples))
            losses = [self.step([examples[i] for i in order[begin:begin + self.batch_size]])
                      for begin in range(0, len(order), self.batch_size)]
            history.append(float(np.mean(losses)))
            if self.verbose:
                epochs.set_postfix(loss=f'{history[-1]:.4f}')
        return history

    def shuffled(self, example: JPRExample) -> JPRExample:
        """``example`` with its candidates in a random order, which assigns their index numbers at random.

        The order is drawn once per example, so a frozen encoder encodes each question once.
        """
        order = self.rng.permutation(len(example.passages))
        return JPRExample(example.question, [example.passages[i] for i in order], [example.answers[i] for i in order])

    def step(self, batch: Sequence[JPRExample]) -> float:
        """One optimiser step on ``batch``; returns its loss."""
        self.model.train()
        loss = self.loss(batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def loss(self, batch: Sequence[JPRExample]) -> torch.Tensor:
        """The training loss of ``batch``, with freshly sampled subsets, orders and prefixes."""
        subsets = [self.subset(e) for e in batch]
        memory, mask = self.memory(batch, subsets)
        answers = [[batch[b].answers[i] for i in subset] for b, subset in enumerate(subsets)]
        prior = None
        if self.mode == 'dynamic_oracle':
            with torch.no_grad():
                empty = torch.zeros(len(batch), 0, dtype=torch.long, device=memory.device)
                prior = self.model(memory, empty, mask)[:, 0].cpu().numpy()
        prefixes, targets = zip(*[self.targets(a, None if prior is None else prior[b]) for b, a in enumerate(answers)])
        steps = max(len(p) for p in prefixes)
        prefix = torch.full((len(batch), steps), -1, dtype=torch.long, device=memory.device)
        target = torch.zeros(len(batch), steps + 1, memory.shape[1], dtype=torch.bool, device=memory.device)
        for b, (p, t) in enumerate(zip(prefixes, targets)):
            prefix[b, :len(p)] = torch.tensor(p, dtype=torch.long)
            for step, positives in enumerate(t):
                target[b, step, positives] = True
        used = target.any(-1)  # steps after the last positive have nothing to learn
        log_probs, target = self.model(memory, prefix, mask)[used], target[used]
        if self.mode == 'independent':
            return -(log_probs.masked_fill(~target, 0.).sum(-1) / target.sum(-1)).mean()
        return -log_probs.masked_fill(~target, float('-inf')).logsumexp(-1).mean()

    def subset(self, example: JPRExample) -> List[int]:
        """Candidate positions for one example: its cover first, others at random, then shuffled."""
        cover = greedy_answer_cover(example.answers, self.k)[:self.train_candidates]
        others = [i for i in range(len(example.passages)) if i not in cover]
        extra = self.rng.permutation(others)[:self.train_candidates - len(cover)].tolist()
        return [int(i) for i in self.rng.permutation(cover + extra)]

    def memory(self, batch: Sequence[JPRExample], subsets: Sequence[List[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Encoder states of each example's subset, padded: (batch, candidates, width) and the padding mask."""
        device = self.model.start.device
        width = max(len(s) for s in subsets)
        memory = torch.zeros(len(batch), width, self.model.width, device=device)
        mask = torch.ones(len(batch), width, dtype=torch.bool, device=device)
        for b, (example, subset) in enumerate(zip(batch, subsets)):
            states = self.model.passages(example.question, list(example.passages))  # cached when frozen
            memory[b, :len(subset)] = states[torch.tensor(subset, dtype=torch.long)]
            mask[b, :len(subset)] = False
        return memory, mask

    def targets(self, answers: Sequence[AbstractSet], prior: Optional[np.ndarray] = None) -> Tuple[List[int], List[List[int]]]:
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
