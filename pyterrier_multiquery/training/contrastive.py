"""Contrastive training of encoders on ``(query, relevant passage, hard negative)`` triples mined from a first stage.

:func:`hard_negative_triples` turns a first stage's results and qrels into triples; :class:`ContrastiveTrainer` is
the base of the trainers of encoders (:class:`~pyterrier_multiquery.training.bi_encoder.BiEncoderTrainer`,
:class:`~pyterrier_multiquery.diffretriever.training.DiffRetrieverTrainer`): it mines the triples, forms batches
that never hold one passage twice nor one question twice (either would be a false negative: a row's own passage, or
another of its question's relevant passages, among the batch's negatives), and scores a validation question
by how often the encoder ranks its relevant passage above its hard negative.
"""
from typing import Callable, List, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.training.trainer import Trainer

#: What the trainers read a passage's text from: a mapping from docno to text, or a transformer that adds ``text``
#: to a frame of ``docno`` (``pt.text.get_text(dataset, 'text')``).
Texts = Union[Mapping[str, str], pt.Transformer]


def passage_texts(texts: Texts, docnos: Sequence[str]) -> List[str]:
    """The text of each of ``docnos`` (a ``KeyError`` naming the first unknown docno)."""
    docnos = [str(d) for d in docnos]
    if isinstance(texts, pt.Transformer):
        unique = list(dict.fromkeys(docnos))
        texts = dict(zip(unique, texts(pd.DataFrame({'docno': unique}))['text']))
    missing = [d for d in docnos if d not in texts]
    if missing:
        raise KeyError(f'no text for docno {missing[0]!r} ({len(missing)} docnos without text)')
    return [texts[d] for d in docnos]


def hard_negative_triples(topics_or_res: pd.DataFrame, qrels: pd.DataFrame, texts: Texts, *,
                          hard_negatives: int = 1) -> pd.DataFrame:
    """One row per relevant passage of each question and each of its ``hard_negatives`` hard negatives: the first
    stage's top passages that are not relevant.

    Args:
        topics_or_res: A first stage's results for the questions (``qid``, ``query``, ``docno`` and ``rank`` or
            ``score``), or the questions alone (``qid``, ``query``) with ``hard_negatives=0``.
        qrels: The questions' qrels (``label > 0`` is relevant).
        texts: The passages' texts (:data:`Texts`).
        hard_negatives: Hard negatives per relevant passage (0: none, the batch's other passages alone).

    Returns:
        A frame with ``qid``, ``query``, ``docno``, ``text`` and (with hard negatives) ``negative`` (the text), in
        the qrels' order; a question whose results hold no passage that is not relevant has no row.
    """
    pt.validate.columns(topics_or_res, includes=['qid', 'query'])
    if hard_negatives and 'docno' not in topics_or_res.columns:
        raise ValueError('hard negatives come from a first stage\'s results: give a result frame (qid, query, docno, '
                         'rank) or hard_negatives=0')
    frame = topics_or_res.assign(qid=topics_or_res['qid'].astype(str))
    relevant = qrels[qrels['label'] > 0].astype({'qid': str, 'docno': str})
    relevant = relevant[relevant['qid'].isin(set(frame['qid']))].drop_duplicates(['qid', 'docno'])
    query = frame.drop_duplicates('qid').set_index('qid')['query']
    rows = relevant[['qid', 'docno']].assign(query=query.reindex(relevant['qid']).to_numpy())
    if hard_negatives:
        order = ['qid', 'rank'] if 'rank' in frame.columns else ['qid', 'score']
        ranked = frame.sort_values(order, ascending=[True, 'rank' in frame.columns], kind='stable')
        judged = relevant.groupby('qid')['docno'].agg(set)
        negatives = {qid: [d for d in group['docno'].astype(str) if d not in judged.get(qid, ())][:hard_negatives]
                     for qid, group in ranked.groupby('qid', sort=False)}
        rows = rows.assign(negative=[negatives.get(q, []) for q in rows['qid']]).explode('negative')
        rows = rows.dropna(subset=['negative'])
    rows = rows.reset_index(drop=True)
    rows['text'] = passage_texts(texts, rows['docno'])
    if hard_negatives:
        rows['negative'] = passage_texts(texts, rows['negative'])
    return rows[['qid', 'query', 'docno', 'text'] + (['negative'] if hard_negatives else [])]


class ContrastiveTrainer(Trainer):
    """Base of the trainers of encoders on :func:`hard_negative_triples` with in-batch negatives.

    ``fit(res_tr, qrels_tr, res_va, qrels_va)`` takes a first stage's results (``qid``, ``query``, ``docno``,
    ``rank``) for the questions, whose top non-relevant passages are the hard negatives (with ``hard_negatives=0``
    the questions alone will do). A subclass implements :meth:`optimiser_step` (one step over a batch of triples,
    the candidates of its queries being every relevant passage of the batch, then every hard negative) and
    :meth:`pair_scores` (the encoder's scores of queries with passages).
    """

    def __init__(self, model, texts: Texts, *, hard_negatives: int = 1, temperature: float = 0.05,
                 learning_rate: float, epochs: int, batch_size: int, seed: int = 0, device: Optional[str] = None,
                 threads: Optional[int] = None, choose_epoch: bool = False, verbose: bool = True):
        """
        Args:
            model: The encoder to train (trained in place).
            texts: The passages' texts (:data:`Texts`).
            hard_negatives: Hard negatives per relevant passage (0: the batch's other passages alone).
            temperature: InfoNCE temperature.
            learning_rate: AdamW learning rate.
            epochs: Passes over the triples.
            batch_size: Triples per optimiser step (over all processes).
            seed: Seed of the batches' order.
            device: Where the model trains (None: where it is).
            threads: torch's CPU threads while training (None: as they are).
            choose_epoch: Keep the epoch that scores best on the validation questions.
            verbose: Whether to show progress.
        """
        super().__init__(model, learning_rate=learning_rate, epochs=epochs, batch_size=batch_size, seed=seed,
                         device=device, threads=threads, choose_epoch=choose_epoch, verbose=verbose)
        self.texts = texts
        self.hard_negatives = hard_negatives
        self.temperature = temperature
        self.rng = np.random.default_rng(seed)

    def record(self) -> dict:
        return {**super().record(), 'hard_negatives': self.hard_negatives, 'temperature': self.temperature}

    def examples(self, topics_or_res: pd.DataFrame, qrels: pd.DataFrame) -> pd.DataFrame:
        """The training triples (:func:`hard_negative_triples`)."""
        triples = hard_negative_triples(topics_or_res, qrels, self.texts, hard_negatives=self.hard_negatives)
        if len(triples) < 2:
            raise ValueError(f'training needs at least two (query, passage) pairs for in-batch negatives, got '
                             f'{len(triples)}')
        return triples

    def dev_examples(self, topics_or_res: pd.DataFrame, qrels: pd.DataFrame) -> pd.DataFrame:
        """The validation triples, each with a hard negative."""
        return hard_negative_triples(topics_or_res, qrels, self.texts, hard_negatives=max(self.hard_negatives, 1))

    def dev_scores(self, triples: pd.DataFrame) -> pd.Series:
        """Each validation question's share of its triples whose relevant passage the encoder scores above the hard
        negative."""
        with requires('dense'):
            import torch
        self.module.eval()
        with torch.no_grad():
            positive = self.pair_scores(list(triples['query']), list(triples['text']))
            negative = self.pair_scores(list(triples['query']), list(triples['negative']))
        return pd.Series(positive > negative, index=triples['qid']).astype(float).groupby(level=0).mean()

    def pair_scores(self, queries: List[str], passages: List[str]) -> np.ndarray:
        """The encoder's score of each query with the passage beside it."""
        raise NotImplementedError

    def batches(self, triples: pd.DataFrame) -> List[np.ndarray]:
        """The triples' rows in a random order, cut into batches of ``batch_size`` that never hold one passage twice
        (by its text, as the relevant passage of one row or the hard negative of any) nor two rows of one question: a
        row that would waits for the next batch."""
        waiting, batches = list(self.rng.permutation(len(triples))), []
        columns = ['text', 'negative'] if 'negative' in triples.columns else ['text']
        passages = triples[columns].to_numpy()
        questions = triples['qid'].to_numpy()
        while waiting:
            batch, seen, later = [], set(), []
            for row in waiting:
                keys = {('question', questions[row]), *(('passage', text) for text in passages[row])}
                if len(batch) < self.batch_size and not keys & seen:
                    batch.append(row)
                    seen |= keys
                else:
                    later.append(row)
            batches.append(np.array(batch))
            waiting = later
        return batches

    def train_epoch(self, triples: pd.DataFrame, epoch: int, step: Callable[[float], None]) -> None:
        """One pass over the triples in :meth:`batches` (more than ``len / batch_size`` where passages or questions
        repeat)."""
        for rows in self.batches(triples):
            step(self.optimiser_step(triples.iloc[rows].reset_index(drop=True)))

    def optimiser_step(self, batch: pd.DataFrame) -> float:
        """One optimiser step over ``batch``; returns its loss."""
        raise NotImplementedError

