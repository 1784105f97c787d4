"""Contrastive fine-tuning: InfoNCE over dense MaxSim (tau 0.01) plus InfoNCE over sparse dot products (tau 1),
with a hard negative per query and the other queries' documents as in-batch negatives."""
import random
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.diffretriever.lora import add_lora
from pyterrier_multiquery.training.distributed import Share
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


def contrastive_train(encoder, triples: Sequence[Tuple[str, str, str]], *, mode: str = 'maxsim', sparse: bool = True,
                      lora: bool = True, epochs: int = 1, batch_size: int = 8, lr: float = 1e-4,
                      max_steps: Optional[int] = None, seed: int = 0, mixed_precision: Optional[str] = None,
                      gradient_accumulation_steps: int = 1, verbose: bool = False) -> List[float]:
    """Fine-tunes ``encoder`` (DiffRetriever or DiffEmbed) in place with AdamW; returns the loss of every step.

    ``lora=True`` adds the paper's LoRA adapters through peft (r 16, alpha 64); ``lora=False`` trains every weight
    (full fine-tuning, for small backbones). Save with ``encoder.save_pretrained`` (adapters merged).
    ``batch_size`` triples make one step over all processes: under ``accelerate launch`` the processes share each
    batch (see :mod:`~pyterrier_multiquery.training.distributed`), and ``mixed_precision`` (None: the launch's
    setting) and ``gradient_accumulation_steps`` (micro-batches per batch) go to accelerate.
    """
    with requires('dense'):
        import torch
    from pyterrier_multiquery.training.distributed import DataParallel
    if not triples:
        raise ValueError('contrastive_train needs at least one (query, positive, negative) triple')
    if getattr(encoder, 'vectors', 'masks') != 'masks':
        raise ValueError("contrastive_train trains the mask positions' vectors: fine-tune a DiffRetriever with "
                         f"vectors='masks' (this one reads vectors={encoder.vectors!r})")
    if lora:
        add_lora(encoder.backbone)
    model = encoder.backbone.model
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    parallel = DataParallel(model, optimiser, mixed_precision=mixed_precision,
                            gradient_accumulation_steps=gradient_accumulation_steps)
    encoder.device = str(parallel.device)
    rng = random.Random(seed)
    losses = []
    for _ in range(epochs):
        order = list(triples)
        rng.shuffle(order)
        starts = range(0, len(order), batch_size)
        for start in (pt.tqdm(starts, desc='training', unit='batch') if verbose else starts):
            if max_steps is not None and len(losses) >= max_steps:
                break
            batch = order[start:start + batch_size]
            losses.append(parallel.step(len(batch), lambda share, batch=batch: query_losses(
                encoder, batch, share, mode=mode, sparse=sparse).sum()))
    model.eval()
    return losses
