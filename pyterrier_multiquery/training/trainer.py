"""The one training interface: every trainable method trains through a :class:`Trainer` on PyTerrier frames.

A trainer follows PyTerrier's estimator convention, ``fit(topics_or_res_tr, qrels_tr, topics_or_res_va,
qrels_va)``, takes the same settings under the same names (``learning_rate``, ``epochs``, ``batch_size``,
``seed``, ``device``, ``threads``, ``verbose``), shows the same progress (``pt.tqdm`` over epochs and, inside
each, over its optimiser steps) and returns the same :class:`TrainingHistory`. The validation frames, where
given, score the model before training and after every epoch; they choose the epoch kept (``choose_epoch``) and
the departure from the first stage (``departure='one_se'``, the one-standard-error rule of
:func:`~pyterrier_multiquery.training.departure.choose_departure`). A subclass says only how a frame becomes its
training examples, how one epoch trains and how the model scores a validation question.
"""
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.training.departure import DEPARTURE_GRID, checked_departure, choose_departure


@dataclass
class TrainingHistory:
    """What one :meth:`Trainer.fit` did.

    Attributes:
        losses: The loss of every optimiser step, in order.
        curve: One row per epoch, ``{'epoch', 'loss', 'dev'}``: epoch 0 is the model before training (no loss),
            ``loss`` an epoch's mean step loss and ``dev`` the mean validation score (None without validation).
        best_epoch: The epoch whose weights the model keeps.
        departure: The model's departure weight from its first stage after training (None for a model without one).
        departure_scores: The mean validation score of each weight tried (``departure='one_se'`` only).
    """
    losses: List[float] = field(default_factory=list)
    curve: List[dict] = field(default_factory=list)
    best_epoch: int = 0
    departure: Optional[float] = None
    departure_scores: Optional[Dict[str, float]] = None

    def to_dict(self) -> dict:
        """The history as plain JSON-ready values."""
        return asdict(self)

    def curve_frame(self) -> pd.DataFrame:
        """The per-epoch curve as a frame (``epoch``, ``loss``, ``dev``)."""
        return pd.DataFrame(self.curve, columns=['epoch', 'loss', 'dev'])


def question_scores(run: pd.DataFrame, qrels: pd.DataFrame, k: int = 10) -> pd.Series:
    """Each question's mean of MRecall@(k/2) and MRecall@k in ``run``: the validation score of the multi-answer
    trainers (a question of ``qrels`` that ``run`` misses scores 0; one without an answer is left out).

    Args:
        run: A PyTerrier result frame (``qid``, ``docno``, ``score``).
        qrels: Multi-answer qrels (``qid``, ``docno``, ``label``; the answer id in ``iteration``).
        k: The deeper cutoff.
    """
    from pyterrier_multiquery.measures import answer_coverage
    pt.validate.result_frame(run)
    qrels = qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})
    run = run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'})
    scores = {}
    for cutoff in (max(1, k // 2), k):
        for qid, covered, total in answer_coverage(qrels, run, cutoff):
            if total:
                scores.setdefault(qid, []).append(float(covered >= min(total, cutoff)))
    return pd.Series({qid: float(np.mean(values)) for qid, values in scores.items()}, dtype=float)


class Trainer:
    """Base of every trainer: the epochs, the progress, the history, the epoch kept and the departure chosen.

    A subclass sets :attr:`description` and implements :meth:`examples` (training frames to examples),
    :meth:`train_epoch` (one pass, reporting each step's loss) and :meth:`dev_scores` (one score per validation
    question, higher is better); :meth:`dev_examples` defaults to :meth:`examples`. The model must be a
    ``torch.nn.Module`` (``state_dict``); one with a ``departure`` attribute can have it chosen.
    """
    #: The progress bar's label.
    description = 'training'

    def __init__(self, model, *, learning_rate: float, epochs: int, batch_size: int, seed: int = 0,
                 device: Optional[str] = None, threads: Optional[int] = None, choose_epoch: bool = False,
                 departure: Union[float, str, None] = None, verbose: bool = True):
        """
        Args:
            model: The model to train (trained in place).
            learning_rate: The optimiser's learning rate.
            epochs: Passes over the training examples.
            batch_size: Examples per optimiser step.
            seed: Seed of the trainer's shuffles and draws.
            device: Where the model trains (``'cpu'``, ``'cuda'``, ...); None leaves it where it is (the trainers on
                :class:`~pyterrier_multiquery.training.distributed.DataParallel` put it on accelerate's device).
            threads: torch's CPU threads while training (None leaves them as they are).
            choose_epoch: Keep the epoch that scores best on the validation frames (the earliest on ties; epoch 0 is
                the untrained model) instead of the last one.
            departure: The model's departure weight from its first stage once trained (it trains as it is, 1 for a
                new model): a number in [0, 1], ``'one_se'`` to choose it on the validation frames, or None to leave
                it as it is.
            verbose: Whether to show progress.
        """
        if epochs < 0:
            raise ValueError(f'epochs must be at least 0, got {epochs}')
        if batch_size < 1:
            raise ValueError(f'batch_size must be at least 1, got {batch_size}')
        if departure is not None and departure != 'one_se':
            departure = checked_departure(departure)
        if departure is not None and not hasattr(model, 'departure'):
            raise ValueError(f'{type(model).__name__} has no departure weight to set')
        self.model = model
        self.learning_rate = learning_rate
        self.epochs = epochs
        self.batch_size = batch_size
        self.seed = seed
        self.device = device
        self.threads = threads
        self.choose_epoch = choose_epoch
        self.departure = departure
        self.verbose = verbose
        self.history: Optional[TrainingHistory] = None   # the last fit's
        if device is not None:
            self.module.to(device)

    @property
    def module(self):
        """The torch module whose weights train (the model itself, unless a subclass says otherwise)."""
        return self.model

    def examples(self, topics_or_res: pd.DataFrame, qrels: pd.DataFrame):
        """The training examples of a frame and its qrels."""
        raise NotImplementedError

    def dev_examples(self, topics_or_res: pd.DataFrame, qrels: pd.DataFrame):
        """The validation examples of a frame and its qrels (by default as :meth:`examples`)."""
        return self.examples(topics_or_res, qrels)

    def steps_per_epoch(self, examples) -> int:
        """Optimiser steps in one pass over ``examples``."""
        return -(-len(examples) // self.batch_size)

    def train_epoch(self, examples, epoch: int, step: Callable[[float], None]) -> None:
        """Trains one pass over ``examples``, calling ``step`` with each optimiser step's loss."""
        raise NotImplementedError

    def dev_scores(self, examples) -> pd.Series:
        """One score per validation question (higher is better) with the model as it is now."""
        raise NotImplementedError

    def fit(self, topics_or_res_tr: pd.DataFrame, qrels_tr: pd.DataFrame,
            topics_or_res_va: Optional[pd.DataFrame] = None, qrels_va: Optional[pd.DataFrame] = None
            ) -> TrainingHistory:
        """Trains the model on the training frames, validating on the validation frames where given.

        Args:
            topics_or_res_tr: The training questions (or a first stage's results for them, for a reranker).
            qrels_tr: Their qrels.
            topics_or_res_va: The validation questions (or results), which choose the epoch and the departure.
            qrels_va: Their qrels.

        Returns:
            The :class:`TrainingHistory`, also kept as ``self.history``.

        Raises:
            ValueError: If only one of the validation frames is given, or ``choose_epoch`` or ``departure='one_se'``
                is asked without them.
        """
        with requires('dense'):
            import torch
        if (topics_or_res_va is None) != (qrels_va is None):
            raise ValueError('give both topics_or_res_va and qrels_va, or neither')
        validating = topics_or_res_va is not None
        if not validating and (self.choose_epoch or self.departure == 'one_se'):
            raise ValueError('choose_epoch and departure=\'one_se\' choose on the validation questions: give '
                             'topics_or_res_va and qrels_va')
        threads = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            return self._fit(self.examples(topics_or_res_tr, qrels_tr),
                             self.dev_examples(topics_or_res_va, qrels_va) if validating else None)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, train, dev) -> TrainingHistory:
        import copy

        with requires('dense'):
            import torch
        history = TrainingHistory()
        self.history = history
        best = [None, 0, None]   # the kept epoch's score, number and weights

        def validate(epoch: int, loss: Optional[float]) -> None:
            score = float(self.dev_scores(dev).mean()) if dev is not None else None
            history.curve.append({'epoch': epoch, 'loss': loss, 'dev': score})
            if self.choose_epoch and (epoch == 0 or score > best[0]):
                best[:] = [score, epoch, copy.deepcopy(self.module.state_dict())]

        validate(0, None)
        torch.manual_seed(self.seed)   # dropout draws the same whatever ran before (a first stage, a validation)
        steps = self.steps_per_epoch(train)
        epochs = pt.tqdm(range(1, self.epochs + 1), desc=self.description, unit='epoch', disable=not self.verbose)
        for epoch in epochs:
            first = len(history.losses)
            with pt.tqdm(total=steps, desc=f'epoch {epoch}', unit='step', leave=False,
                         disable=not self.verbose) as bar:
                def step(loss: float) -> None:
                    history.losses.append(float(loss))
                    bar.update()
                    bar.set_postfix(loss=f'{loss:.4f}')
                self.train_epoch(train, epoch, step)
            losses = history.losses[first:]
            validate(epoch, float(np.mean(losses)) if losses else None)
            epochs.set_postfix({k: f'{v:.4f}' for k, v in history.curve[-1].items() if k != 'epoch' and v is not None})
        history.best_epoch = self.epochs
        if self.choose_epoch:
            history.best_epoch = best[1]
            self.module.load_state_dict(best[2])
        if self.departure == 'one_se':
            scores = {}
            for weight in DEPARTURE_GRID:
                self.model.departure = weight
                scores[weight] = self.dev_scores(dev)
            scores = pd.DataFrame(scores)
            self.model.departure = choose_departure(scores)
            history.departure_scores = {str(w): float(v) for w, v in scores.mean().items()}
        elif self.departure is not None:
            self.model.departure = self.departure
        history.departure = getattr(self.model, 'departure', None)
        if hasattr(self.model, 'training_record'):   # a SavedModel keeps its record with its weights
            self.model.training_record = {**self.record(), 'history': history.to_dict()}
        return history

    def record(self) -> dict:
        """What the saved model keeps of how it was trained, beside the history: the trainer and its settings
        (a subclass adds what using the model needs, such as AMER's merge and first stage)."""
        return {'trainer': type(self).__name__,
                'settings': {'learning_rate': self.learning_rate, 'epochs': self.epochs, 'batch_size': self.batch_size,
                             'seed': self.seed, 'choose_epoch': self.choose_epoch, 'departure': self.departure}}
