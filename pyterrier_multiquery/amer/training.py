"""Training AMER (and its Single-Query baseline) with InfoNCE matched to the unordered gold set."""

from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.amer.model import AMERModel
from pyterrier_multiquery.index.multiquery import MERGES
from pyterrier_multiquery.training.distributed import DataParallel
from pyterrier_multiquery.training.losses import matched_infonce
from pyterrier_multiquery.training.trainer import Trainer, TrainingHistory, question_scores

with requires('dense'):
    import torch


class AMERTrainer(Trainer):
    """Trains :class:`AMERModel` (or an encoder AMER) on questions with multi-answer qrels.

    ``fit(topics_tr, qrels_tr, topics_va, qrels_va)`` takes topic frames (``qid``, ``query``). The documents are
    those of ``index``, a :class:`~pyterrier_multiquery.index.MultiVectorIndex` holding one vector per document in
    the space the model writes (a single-vector encoder's), which AMER's lists search. A question's gold set holds
    one document vector per answer and its hard negatives are ``first_stage``'s top non-relevant documents
    (:func:`answer_targets`); the validation questions are scored by the mean of MRecall@5 and MRecall@10 of the
    model's lists merged by ``merge``, and the saved model keeps the merge and the first stage's name.

    Each batch's candidates are all its examples' targets plus ``negatives`` rows drawn from the corpus; every
    example's N predictions are matched to its gold targets by the Hungarian method
    (:func:`~pyterrier_multiquery.training.losses.matched_infonce`, cosine / ``temperature``). Inputs after the
    first come from the (normalised) gold targets in a shuffled order (teacher forcing), except that with probability
    ``p = min(0.8, scheduled_sampling * step / total_steps)`` the model's own previous vector is fed (scheduled
    sampling). ``single_query=True`` is the Single-Query baseline: N = 1 and one gold target, drawn at random
    for each example and epoch, as the positive. :meth:`fit_vectors` trains on vector arrays directly (the
    synthetic tasks' vector queries); :meth:`fit` builds them from the frames and the index.

    Under ``accelerate launch`` the processes share each batch (see :mod:`~pyterrier_multiquery.training.distributed`)
    and train the same model as one process would.
    """
    description = 'AMER'

    def __init__(self, model: AMERModel, index=None, first_stage: Optional[pt.Transformer] = None, *,
                 merge: str = 'round_robin', hard_negatives: int = 10, single_query: bool = False,
                 temperature: float = 0.05, learning_rate: float = 1e-4, epochs: int = 1, batch_size: int = 16,
                 negatives: int = 64, scheduled_sampling: float = 1.0, weight_decay: float = 0.01, seed: int = 0,
                 device: Optional[str] = None, threads: Optional[int] = None, choose_epoch: bool = False,
                 departure: Union[float, str, None] = None, first_stage_name: Optional[str] = None,
                 mixed_precision: Optional[str] = None, gradient_accumulation_steps: int = 1, verbose: bool = True):
        """
        Args:
            model: The model to train (its ``num_vectors`` is N; 1 is used for ``single_query``).
            index: The documents' single-vector index (one vector each) the lists search (:meth:`fit` needs it).
            first_stage: A retriever of the training questions whose top non-relevant documents are the hard
                negatives (None: no hard negatives).
            merge: How the lists merge (``'round_robin'``, ``'score_sum'``, ``'rrf'``) on the validation questions and
                in the saved model.
            hard_negatives: The first stage's top documents searched for hard negatives per question.
            single_query: Train the Single-Query baseline.
            temperature: InfoNCE temperature.
            learning_rate: AdamW learning rate.
            epochs: Passes over the examples.
            batch_size: Examples per optimiser step (over all processes).
            negatives: Corpus rows drawn as extra negatives per batch.
            scheduled_sampling: Multiplier of the own-vector probability's schedule (0 keeps teacher forcing).
            weight_decay: AdamW weight decay.
            seed: Seed of the shuffles and draws.
            device: Where the model trains (None: accelerate's device, a GPU when there is one).
            threads: torch's CPU threads while training (None: as they are).
            choose_epoch: Keep the epoch that scores best on the validation questions.
            departure: The departure weight of an encoder AMER, ``'one_se'`` to choose it on the validation
                questions, or None to leave it.
            first_stage_name: The first stage's name, kept with the model (say, the encoder's path).
            mixed_precision: ``'no'``, ``'fp16'``, ``'bf16'``; None takes ``accelerate launch``'s setting.
            gradient_accumulation_steps: Micro-batches per batch (one backward each).
            verbose: Whether to show progress.
        """
        if merge not in MERGES:
            raise ValueError(f'unknown merge {merge!r}; expected one of {MERGES}')
        super().__init__(model, learning_rate=learning_rate, epochs=epochs, batch_size=batch_size, seed=seed,
                         device=device, threads=threads, choose_epoch=choose_epoch, departure=departure,
                         verbose=verbose)
        self.description = 'Single-Query' if single_query else 'AMER'
        self.index = index
        self.first_stage = first_stage
        self.first_stage_name = first_stage_name
        self.merge = merge
        self.hard_negatives = hard_negatives
        self.single_query = single_query
        self.temperature = temperature
        self.negatives = negatives
        self.scheduled_sampling = scheduled_sampling
        self.weight_decay = weight_decay
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=learning_rate, weight_decay=weight_decay)
        self.parallel = DataParallel(model, self.optimizer, device=self.device, mixed_precision=mixed_precision,
                                     gradient_accumulation_steps=gradient_accumulation_steps)

    def record(self) -> dict:
        """The trainer's record, with the merge the model's lists are searched with and its first stage."""
        return {**super().record(), 'merge': self.merge, 'first_stage': self.first_stage_name}

    def doc_vectors(self) -> Dict[str, np.ndarray]:
        """The index's vector of each document, by docno."""
        if self.index is None:
            raise ValueError('AMERTrainer.fit needs the documents\' index: AMERTrainer(model, index, ...)')
        _, vectors, offsets, docnos = self.index.payload()
        if len(vectors) != len(offsets) - 1:
            raise ValueError(f'AMER searches one vector per document, but the index at {str(self.index.path)!r} '
                             f'holds {len(vectors)} vectors for {len(offsets) - 1} documents')
        return dict(zip(docnos.fwd[np.arange(len(offsets) - 1)], np.asarray(vectors, dtype=np.float32)))

    def examples(self, topics: pd.DataFrame, qrels: pd.DataFrame) -> dict:
        """The training questions with an answer: their texts, gold sets, hard negatives and the corpus."""
        pt.validate.query_frame(topics, ['query'])
        topics = topics.drop_duplicates('qid').assign(qid=lambda f: f['qid'].astype(str))
        qids = sorted(set(qrels.loc[qrels['label'] > 0, 'qid'].astype(str)) & set(topics['qid']))
        if not qids:
            raise ValueError('no training question has a relevant document in the qrels')
        by_qid = topics.set_index('qid')
        vectors = self.doc_vectors()
        questions = by_qid.loc[qids].reset_index()
        run = self.first_stage(questions) if self.first_stage is not None and self.hard_negatives else \
            pd.DataFrame({'qid': [], 'docno': [], 'rank': []})
        targets, negatives = answer_targets(run, qrels, vectors, qids, hard_negatives=self.hard_negatives)
        return {'queries': questions['query'].tolist(), 'targets': targets, 'negatives': negatives,
                'corpus': np.stack(list(vectors.values()))}

    def dev_examples(self, topics: pd.DataFrame, qrels: pd.DataFrame) -> tuple:
        """The validation questions with an answer and their qrels."""
        pt.validate.query_frame(topics, ['query'])
        relevant = set(qrels.loc[qrels['label'] > 0, 'qid'].astype(str))
        topics = topics.drop_duplicates('qid').assign(qid=lambda f: f['qid'].astype(str))
        return topics[topics['qid'].isin(relevant)].reset_index(drop=True), qrels

    def dev_scores(self, dev) -> pd.Series:
        """Each validation question's mean of MRecall@5 and MRecall@10 of the model's merged lists."""
        from pyterrier_multiquery.amer.pipeline import AMER
        topics, qrels = dev
        search = AMER(self.model, batch_size=self.batch_size) >> self.index.multiquery_retriever(self.merge,
                                                                                                num_results=10)
        return question_scores(search(topics), qrels, 10).reindex(topics['qid'], fill_value=0.)

    def steps_per_epoch(self, examples) -> int:
        return -(-len(examples['targets']) // self.batch_size)

    def train_epoch(self, examples: dict, epoch: int, step) -> None:
        """One pass over the examples in a random order (the scheduled sampling grows over all epochs)."""
        queries, targets, negatives = examples['queries'], examples['targets'], examples['negatives']
        per_epoch = self.steps_per_epoch(examples)
        total, done = per_epoch * max(self.epochs, 1), per_epoch * (epoch - 1)
        order = self.rng.permutation(len(targets))
        for number, begin in enumerate(range(0, len(order), self.batch_size)):
            batch = order[begin:begin + self.batch_size]
            step(self.step([queries[i] for i in batch] if not isinstance(queries, np.ndarray) else queries[batch],
                           [targets[i] for i in batch], examples['corpus'], self.own_probability(done + number, total),
                           None if negatives is None else [negatives[i] for i in batch]))

    def fit_vectors(self, queries: Union[Sequence[str], np.ndarray], targets: Sequence[np.ndarray],
                    corpus: np.ndarray, hard_negatives: Optional[Sequence[np.ndarray]] = None) -> TrainingHistory:
        """Trains on vector arrays (no validation); returns the :class:`TrainingHistory`.

        Args:
            queries: Query texts, or an (n, doc_dim) array of vector queries.
            targets: Per query, an (m_i, doc_dim) array of its gold document vectors (m_i >= 1).
            corpus: (size, doc_dim) document vectors the negatives are drawn from.
            hard_negatives: Per query, an (h_i, doc_dim) array of document vectors that are not its targets (a
                first stage's top non-relevant documents, say); each batch adds its queries' rows to the candidates.
        """
        if len(queries) != len(targets):
            raise ValueError(f'{len(queries)} queries but {len(targets)} target sets')
        dim = self.model.doc_dim
        for i, t in enumerate(targets):
            if t.ndim != 2 or t.shape[1] != dim or len(t) == 0:
                raise ValueError(f'targets[{i}] must be a non-empty (m, {dim}) array, got shape {t.shape}')
        if hard_negatives is not None:
            if len(hard_negatives) != len(queries):
                raise ValueError(f'{len(queries)} queries but {len(hard_negatives)} hard-negative sets')
            for i, h in enumerate(hard_negatives):
                if h.ndim != 2 or h.shape[1] != dim:
                    raise ValueError(f'hard_negatives[{i}] must be an (h, {dim}) array, got shape {h.shape}')
        if corpus.ndim != 2 or corpus.shape[1] != dim:
            raise ValueError(f'corpus must be (size, {dim}), got shape {corpus.shape}')
        if self.choose_epoch or self.departure == 'one_se':
            raise ValueError('fit_vectors has no validation questions to choose an epoch or departure on: use fit')
        return self._fit({'queries': queries, 'targets': list(targets), 'negatives': hard_negatives,
                          'corpus': corpus}, None)

    def own_probability(self, step: int, total: int) -> float:
        """The scheduled-sampling probability of feeding the model's own vector at ``step`` of ``total``."""
        return min(0.8, self.scheduled_sampling * step / max(total, 1))

    def step(self, queries, targets: Sequence[np.ndarray], corpus: np.ndarray, own_probability: float,
             hard_negatives: Optional[Sequence[np.ndarray]] = None) -> float:
        """One optimiser step; returns the loss."""
        self.model.train()
        batch = self.draw(queries, targets, corpus, own_probability, hard_negatives)
        return self.parallel.step(len(targets), lambda share: self.example_losses(batch, share.local).sum())

    def loss(self, queries, targets: Sequence[np.ndarray], corpus: np.ndarray, own_probability: float,
             hard_negatives: Optional[Sequence[np.ndarray]] = None):
        """The matched InfoNCE loss of one batch: the mean over its examples."""
        batch = self.draw(queries, targets, corpus, own_probability, hard_negatives)
        return self.example_losses(batch, np.arange(len(targets))).mean()

    def draw(self, queries, targets: Sequence[np.ndarray], corpus: np.ndarray, own_probability: float,
             hard_negatives: Optional[Sequence[np.ndarray]] = None) -> dict:
        """A batch with its random choices made: the candidates, each example's gold rows among them, and the
        vectors fed after each step (NaN where the own vector is fed)."""
        device = self.model.in_proj.weight.device
        if self.single_query:
            targets = [t[self.rng.integers(len(t))][None] for t in targets]
        steps = 1 if self.single_query else self.model.num_vectors
        golds, offset = [], 0
        for t in targets:
            golds.append(torch.arange(offset, offset + len(t), device=device))
            offset += len(t)
        negatives = corpus[self.rng.integers(len(corpus), size=self.negatives)] if self.negatives else corpus[:0]
        negatives = np.concatenate(list(hard_negatives or []) + [negatives])
        candidates = torch.as_tensor(np.concatenate(list(targets) + [negatives]), dtype=torch.float32, device=device)
        feed = torch.full((len(targets), max(steps - 1, 0), self.model.doc_dim), float('nan'), device=device)
        for i, t in enumerate(targets):
            shuffled = torch.as_tensor(t[self.rng.permutation(len(t))][:steps - 1], dtype=torch.float32)
            feed[i, :len(shuffled)] = torch.nn.functional.normalize(shuffled, dim=-1)
        for step in range(steps - 1):
            own = torch.rand(len(targets), generator=self.generator) < own_probability
            feed[own.to(device), step] = float('nan')
        return {'queries': queries, 'steps': steps, 'golds': golds, 'candidates': candidates, 'feed': feed}

    def example_losses(self, batch: dict, positions: np.ndarray):
        """The losses, (len(positions),), of the examples at ``positions`` of a batch from :meth:`draw`."""
        queries = batch['queries']
        if isinstance(queries, np.ndarray):
            embeds = self.model.embed_vectors(queries[positions])
        else:
            embeds = self.model.embed_text([queries[i] for i in positions])
        predictions = self.model(*embeds, num_vectors=batch['steps'], feed=batch['feed'][torch.as_tensor(positions)])
        return torch.stack([matched_infonce(p, batch['candidates'], batch['golds'][i], self.temperature)[0]
                            for p, i in zip(predictions, positions)])


def answer_targets(run: pd.DataFrame, qrels: pd.DataFrame, doc_vectors: Mapping[str, np.ndarray],
                   qids: Sequence[str], *, hard_negatives: int = 10) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """AMER's gold sets and hard negatives for queries with multi-answer qrels, from a first stage's run.

    The gold set of a query holds one document vector per answer (the answer id is ``iteration``; without it every
    relevant document is an answer): of the answer's supporting documents, the one the run ranks highest (the
    first in the qrels when the run has none). Its hard negatives are the run's top ``hard_negatives`` documents
    that support no answer.

    Args:
        run: The first stage's results (``qid``, ``docno``, ``rank``) for the queries.
        qrels: Frame with ``qid``, ``docno``, ``label`` (and ``iteration``).
        doc_vectors: Document vector by docno.
        qids: The queries, in the order of the returned lists; each needs a relevant document.
        hard_negatives: How many of the first stage's top documents per query are searched: its non-relevant ones
            among them are the negatives.

    Returns:
        ``(targets, negatives)``: per query an (m, d) and an (h, d) array.
    """
    from pyterrier_multiquery.measures import answer_ids
    relevant = qrels[qrels['label'] > 0].assign(qid=lambda f: f['qid'].astype(str))
    relevant = relevant.assign(answer=answer_ids(relevant))
    ranks = dict(zip(zip(run['qid'].astype(str), run['docno']), run['rank']))
    relevant = relevant.assign(rank=[ranks.get(k, np.inf) for k in zip(relevant['qid'], relevant['docno'])])
    best = relevant.sort_values('rank', kind='stable').drop_duplicates(['qid', 'answer'])
    gold = best.groupby('qid')['docno'].agg(list)
    supporting = set(zip(relevant['qid'], relevant['docno']))
    top = run[run['rank'] < hard_negatives].sort_values(['qid', 'rank']).assign(qid=lambda f: f['qid'].astype(str))
    negative = top[[k not in supporting for k in zip(top['qid'], top['docno'])]].groupby('qid')['docno'].agg(list)
    missing = [q for q in qids if q not in gold.index]
    if missing:
        raise ValueError(f'{len(missing)} queries have no relevant document in the qrels, e.g. {missing[:5]}')
    dim = len(next(iter(doc_vectors.values())))
    stack = lambda docnos: np.stack([doc_vectors[d] for d in docnos]).astype(np.float32) if docnos \
        else np.zeros((0, dim), dtype=np.float32)  # noqa: E731
    return [stack(gold[q]) for q in qids], [stack(negative.get(q, [])) for q in qids]
