"""A trained refiner on the questions like its training questions, its first stage on the others.

The departure weight (:mod:`~pyterrier_multiquery.training.departure`) is one number for every question. A question
unlike any the model was trained on is where the model's departure is least known, so :class:`BackOff` gives it the
first stage's ranking instead: a question is *familiar* where its cosine similarity to its nearest training question
reaches the ``quantile`` of the training questions' own similarities to their nearest other training question.
"""
from typing import Sequence

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._transformer import DerivedIdentity

#: The share of the training questions themselves that count as unfamiliar (fixed in advance, not tuned: in
#: domain about one question in twenty falls back to the first stage).
DEFAULT_QUANTILE = 0.05


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    if vectors.ndim != 2:
        raise ValueError(f'question vectors must form a matrix (questions x dimensions), got shape {vectors.shape}')
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.all(np.isfinite(vectors)) or np.any(norms == 0):
        raise ValueError('question vectors must be finite and non-zero')
    return vectors / norms


class Familiarity:
    """Whether questions are like a set of known (training) questions, by their vectors' cosine similarity."""

    def __init__(self, known_vectors: np.ndarray, quantile: float = DEFAULT_QUANTILE):
        """
        Args:
            known_vectors: One vector per known question (at least two).
            quantile: The share of the known questions that would count as unfamiliar among the others, in [0, 1].
        """
        if not 0. <= quantile <= 1.:
            raise ValueError(f'quantile must lie in [0, 1], got {quantile}')
        self.known = _unit(known_vectors)
        if len(self.known) < 2:
            raise ValueError(f'Familiarity needs at least two known questions, got {len(self.known)}')
        self.quantile = quantile
        similarity = self.known @ self.known.T
        np.fill_diagonal(similarity, -np.inf)
        #: The ``quantile`` of the known questions' similarity to their nearest other known question.
        self.threshold = float(np.quantile(similarity.max(axis=1), quantile))

    def similarity(self, vectors: np.ndarray) -> np.ndarray:
        """Each question's cosine similarity to its nearest known question."""
        vectors = _unit(vectors)
        if vectors.shape[1] != self.known.shape[1]:
            raise ValueError(f'question vectors have {vectors.shape[1]} dimensions, the known questions '
                             f'{self.known.shape[1]}')
        return (vectors @ self.known.T).max(axis=1)

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        """Whether each question is familiar: its :meth:`similarity` reaches :attr:`threshold`."""
        return self.similarity(vectors) >= self.threshold


class BackOff(DerivedIdentity, pt.Transformer):
    """``refined`` on the questions like its training questions, ``first_stage`` on the others (a floor for a
    trained refiner on a collection it never saw).

    Each question is encoded by ``encoder`` (a pyterrier_dr bi-encoder, e.g. the first stage's) and given to
    ``refined`` when :class:`Familiarity` to ``known_queries`` holds, else to ``first_stage``; the two result
    frames are concatenated.
    """
    schematic = {'label': 'BackOff'}

    def __init__(self, refined: pt.Transformer, first_stage: pt.Transformer, encoder, known_queries: Sequence[str],
                 *, quantile: float = DEFAULT_QUANTILE):
        """
        Args:
            refined: The trained refiner's pipeline (topics in, results out).
            first_stage: The pipeline it refines, for the questions unlike ``known_queries``.
            encoder: Encodes questions (``encode_queries``), e.g. pyterrier_dr's ``SBertBiEncoder``.
            known_queries: The questions the refiner was trained on (at least two).
            quantile: See :class:`Familiarity`.
        """
        if len(known_queries) < 2:
            raise ValueError(f'BackOff needs at least two known questions, got {len(known_queries)}')
        if not 0. <= quantile <= 1.:
            raise ValueError(f'quantile must lie in [0, 1], got {quantile}')
        self.refined = refined
        self.first_stage = first_stage
        self.encoder = encoder
        self.known_queries = list(known_queries)
        self.quantile = quantile
        self._familiarity = None

    @property
    def familiarity(self) -> Familiarity:
        """The :class:`Familiarity` of ``known_queries`` (encoded at first use)."""
        if self._familiarity is None:
            self._familiarity = Familiarity(self.encoder.encode_queries(self.known_queries), self.quantile)
        return self._familiarity

    def transform(self, topics: pd.DataFrame) -> pd.DataFrame:
        """Each question's results from ``refined`` or from ``first_stage``."""
        pt.validate.query_frame(topics, extra_columns=['query'])
        if topics.empty:
            return self.refined(topics)
        familiar = self.familiarity(self.encoder.encode_queries(topics['query'].tolist()))
        return pd.concat([system(topics[chosen].reset_index(drop=True))
                          for system, chosen in ((self.refined, familiar), (self.first_stage, ~familiar))
                          if chosen.any()], ignore_index=True)
