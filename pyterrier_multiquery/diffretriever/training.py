"""Contrastive fine-tuning: InfoNCE over dense MaxSim (tau 0.01) plus InfoNCE over sparse dot products (tau 1),
with a hard negative per query and the other queries' documents as in-batch negatives."""
from typing import List, Optional, Sequence, Tuple

import numpy as np

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.diffretriever.lora import add_lora
from pyterrier_multiquery.training.distributed import Share
from pyterrier_multiquery.training.contrastive import ContrastiveTrainer, Texts
from pyterrier_multiquery.training.losses import in_batch_infonce

def dense_scores(queries, docs, mode: str):
    """``(Q, D)`` scores of normalised ``(Q, k, d)`` query and ``(D, k', d)`` document vectors: ``maxsim``
    (mean over query vectors of the max over document vectors) or ``mean`` (cosine of the mean vectors)."""
    with requires('dense'):
        import torch
    if mode == 'maxsim':
        return torch.einsum('qid,pjd->qpij', queries, docs).amax(-1).mean(-1)
    if mode == 'mean':
        norm = torch.nn.functional.normalize
        return norm(queries.mean(1), dim=-1) @ norm(docs.mean(1), dim=-1).T
    raise ValueError(f"mode must be 'maxsim' or 'mean', got {mode!r}")


def _sparse(logits, content: List[List[int]]):
    """Sparse weights restricted to each text's content-word ids, ``(B, V)``."""
    with requires('dense'):
        import torch
    from pyterrier_multiquery.diffretriever.sparse import sparse_weights
    weights = sparse_weights(logits)
    keep = torch.zeros_like(weights)
    for i, ids in enumerate(content):
        keep[i, ids] = 1.
    return weights * keep


def contrastive_loss(encoder, triples: Sequence[Tuple[str, str, str]], *, mode: str = 'maxsim',
                     dense_tau: float = 0.01, sparse_tau: float = 1.0, sparse: bool = True):
    """The loss of one batch of ``(query, positive, hard negative)`` triples: the mean of :func:`query_losses`.

    ``encoder`` is a :class:`DiffRetriever` (dense ``mode`` ``maxsim`` or ``mean``, plus the sparse term when
    ``sparse``) or a :class:`DiffEmbed` (mean-pooled vectors, dense term only).
    """
    every = np.arange(len(triples))
    return query_losses(encoder, triples, Share(every, every, lambda rows: rows), mode=mode, dense_tau=dense_tau,
                        sparse_tau=sparse_tau, sparse=sparse).mean()


def query_losses(encoder, triples: Sequence[Tuple[str, str, str]], share: Share, *, mode: str = 'maxsim',
                 dense_tau: float = 0.01, sparse_tau: float = 1.0, sparse: bool = True):
    """The losses of the ``share.local`` triples' queries, ``(len(share.local),)``.

    Candidates of a query are all positives, then all hard negatives, of the (micro-)batch ``share.batch`` (the
    other processes' rows gathered); its positive is its own.
    """
    with requires('dense'):
        import torch
    from pyterrier_multiquery.diffretriever.reference_encoders import DiffEmbed
    local = [triples[i] for i in share.local]
    positives = share.local - share.batch[0]
    queries, docs = [t[0] for t in local], [t[1] for t in local] + [t[2] for t in local]

    def candidates(rows):  # the local positives' rows, then the local negatives'
        return torch.cat([share.gather(rows[:len(local)]), share.gather(rows[len(local):])])

    if isinstance(encoder, DiffEmbed):
        q, d = encoder.pooled(queries), candidates(encoder.pooled(docs))
        return in_batch_infonce(q @ d.T, dense_tau, positives, reduction='none')
    q_hidden, q_logits, q_content = _forward(encoder, queries, encoder.k_query, 'query')
    d_hidden, d_logits, d_content = _forward(encoder, docs, encoder.k_doc, 'doc')
    losses = in_batch_infonce(dense_scores(q_hidden, candidates(d_hidden), mode), dense_tau, positives,
                              reduction='none')
    if sparse:
        q_sparse, d_sparse = _sparse(q_logits, q_content), candidates(_sparse(d_logits, d_content))
        losses = losses + in_batch_infonce(q_sparse @ d_sparse.T, sparse_tau, positives, reduction='none')
    return losses


def _forward(encoder, texts, k, side):
    with requires('dense'):
        import torch
    input_ids, attention, positions, content, _ = encoder.batch(texts, k, side)
    hidden, logits = encoder.represent(input_ids, attention, positions)
    return torch.nn.functional.normalize(hidden, dim=-1), logits, content


class DiffRetrieverTrainer(ContrastiveTrainer):
    """Fine-tunes a :class:`~pyterrier_multiquery.diffretriever.DiffRetriever` (its mask positions' dense and sparse
    representations) or a :class:`~pyterrier_multiquery.diffretriever.DiffEmbed` in place, on
    :func:`~pyterrier_multiquery.training.contrastive.hard_negative_triples` (one hard negative per relevant passage
    at least), with InfoNCE over the batch's candidates (:func:`query_losses`).

    ``lora=True`` adds the paper's LoRA adapters through peft (r 16, alpha 64); ``lora=False`` trains every weight
    (full fine-tuning, for small backbones). Save with ``encoder.save_pretrained`` (adapters merged; the training
    record with it). Under ``accelerate launch`` the processes share each batch (see
    :mod:`~pyterrier_multiquery.training.distributed`).
    """
    description = 'DiffRetriever'

    def __init__(self, encoder, texts: Texts, *, mode: str = 'maxsim', sparse: bool = True, lora: bool = True,
                 hard_negatives: int = 1, dense_temperature: float = 0.01, sparse_temperature: float = 1.0,
                 learning_rate: float = 1e-4, epochs: int = 1, batch_size: int = 8, seed: int = 0,
                 device: Optional[str] = None, threads: Optional[int] = None, choose_epoch: bool = False,
                 mixed_precision: Optional[str] = None, gradient_accumulation_steps: int = 1, verbose: bool = True):
        """
        Args:
            encoder: The DiffRetriever (read with ``vectors='masks'``) or DiffEmbed to fine-tune.
            texts: The passages' texts (:data:`~pyterrier_multiquery.training.contrastive.Texts`).
            mode: The dense score, ``'maxsim'`` or ``'mean'`` (DiffRetriever).
            sparse: Whether the sparse InfoNCE term joins the dense one (DiffRetriever).
            lora: Train LoRA adapters (else every weight).
            hard_negatives: Hard negatives per relevant passage (at least 1).
            dense_temperature: The dense InfoNCE temperature.
            sparse_temperature: The sparse InfoNCE temperature.
            learning_rate: AdamW learning rate.
            epochs: Passes over the triples.
            batch_size: Triples per optimiser step (over all processes).
            seed: Seed of the batches' order.
            device: Where the model trains (None: accelerate's device, a GPU when there is one).
            threads: torch's CPU threads while training (None: as they are).
            choose_epoch: Keep the epoch that scores best on the validation questions.
            mixed_precision: ``'no'``, ``'fp16'``, ``'bf16'``; None takes ``accelerate launch``'s setting.
            gradient_accumulation_steps: Micro-batches per batch (one backward each).
            verbose: Whether to show progress.
        """
        with requires('dense'):
            import torch
        from pyterrier_multiquery.training.distributed import DataParallel
        if getattr(encoder, 'vectors', 'masks') != 'masks':
            raise ValueError("DiffRetrieverTrainer trains the mask positions' vectors: fine-tune a DiffRetriever with "
                             f"vectors='masks' (this one reads vectors={encoder.vectors!r})")
        if hard_negatives < 1:
            raise ValueError(f'DiffRetrieverTrainer needs a hard negative per triple, got {hard_negatives=}')
        super().__init__(encoder, texts, hard_negatives=hard_negatives, temperature=dense_temperature,
                         learning_rate=learning_rate, epochs=epochs, batch_size=batch_size, seed=seed,
                         device=device, threads=threads, choose_epoch=choose_epoch, verbose=verbose)
        self.mode, self.sparse, self.lora, self.sparse_temperature = mode, sparse, lora, sparse_temperature
        if lora:
            add_lora(encoder.backbone)
        model = encoder.backbone.model
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
        self.parallel = DataParallel(model, self.optimizer, device=self.device, mixed_precision=mixed_precision,
                                     gradient_accumulation_steps=gradient_accumulation_steps)
        encoder.device = str(self.parallel.device)

    @property
    def module(self):
        return self.model.backbone.model

    def record(self) -> dict:
        return {**super().record(), 'mode': self.mode, 'sparse': self.sparse, 'lora': self.lora,
                'sparse_temperature': self.sparse_temperature}

    def optimiser_step(self, batch) -> float:
        self.module.train()
        triples = list(zip(batch['query'], batch['text'], batch['negative']))
        loss = self.parallel.step(len(triples), lambda share: query_losses(
            self.model, triples, share, mode=self.mode, dense_tau=self.temperature, sparse_tau=self.sparse_temperature,
            sparse=self.sparse).sum())
        self.module.eval()
        return loss

    def pair_scores(self, queries: List[str], passages: List[str]) -> np.ndarray:
        """The dense score of each query with the passage beside it (in batches)."""
        from pyterrier_multiquery.diffretriever.reference_encoders import DiffEmbed
        scores = []
        for begin in range(0, len(queries), self.batch_size):
            q, p = queries[begin:begin + self.batch_size], passages[begin:begin + self.batch_size]
            if isinstance(self.model, DiffEmbed):
                scores.append((self.model.pooled(q) * self.model.pooled(p)).sum(-1))
            else:
                scores.append(dense_scores(_forward(self.model, q, self.model.k_query, 'query')[0],
                                           _forward(self.model, p, self.model.k_doc, 'doc')[0], self.mode).diagonal())
        return np.concatenate([s.float().cpu().numpy() for s in scores])
