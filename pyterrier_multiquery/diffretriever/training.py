"""Contrastive fine-tuning: InfoNCE over dense MaxSim (tau 0.01) plus InfoNCE over sparse dot products (tau 1),
with a hard negative per query and the other queries' documents as in-batch negatives."""
import random
from typing import List, Optional, Sequence, Tuple

import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.training.losses import in_batch_infonce

#: The paper's LoRA settings: rank 16, alpha 64, on every linear projection of the attention and MLP blocks.
LORA_R, LORA_ALPHA = 16, 64


def add_lora(backbone, *, r: int = LORA_R, alpha: int = LORA_ALPHA, dropout: float = 0.05) -> None:
    """Wraps the backbone's model with peft LoRA adapters (all linear layers of the transformer blocks)."""
    with requires('train'):
        from peft import LoraConfig, get_peft_model
    backbone.model = get_peft_model(backbone.model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                                               target_modules='all-linear'))


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
    """The loss of one batch of ``(query, positive, hard negative)`` triples.

    Candidates of query ``i`` are all positives and hard negatives of the batch; its positive is candidate ``i``.
    ``encoder`` is a :class:`DiffRetriever` (dense ``mode`` ``maxsim`` or ``mean``, plus the sparse term when
    ``sparse``) or a :class:`DiffEmbed` (mean-pooled vectors, dense term only).
    """
    from pyterrier_multiquery.diffretriever.reference_encoders import DiffEmbed
    queries = [t[0] for t in triples]
    docs = [t[1] for t in triples] + [t[2] for t in triples]
    if isinstance(encoder, DiffEmbed):
        q, d = encoder.pooled(queries), encoder.pooled(docs)
        return in_batch_infonce(q @ d.T, dense_tau)
    q_hidden, q_logits, q_content = _forward(encoder, queries, encoder.k_query, 'query')
    d_hidden, d_logits, d_content = _forward(encoder, docs, encoder.k_doc, 'doc')
    loss = in_batch_infonce(dense_scores(q_hidden, d_hidden, mode), dense_tau)
    if sparse:
        q_sparse, d_sparse = _sparse(q_logits, q_content), _sparse(d_logits, d_content)
        loss = loss + in_batch_infonce(q_sparse @ d_sparse.T, sparse_tau)
    return loss


def _forward(encoder, texts, k, side):
    with requires('dense'):
        import torch
    input_ids, attention, positions, content = encoder.batch(texts, k, side)
    hidden, logits = encoder.represent(input_ids, attention, positions)
    return torch.nn.functional.normalize(hidden, dim=-1), logits, content


def contrastive_train(encoder, triples: Sequence[Tuple[str, str, str]], *, mode: str = 'maxsim', sparse: bool = True,
                      lora: bool = True, epochs: int = 1, batch_size: int = 8, lr: float = 1e-4,
                      max_steps: Optional[int] = None, seed: int = 0, verbose: bool = False) -> List[float]:
    """Fine-tunes ``encoder`` (DiffRetriever or DiffEmbed) in place with AdamW; returns the loss of every step.

    ``lora=True`` adds the paper's LoRA adapters through peft (r 16, alpha 64); ``lora=False`` trains every weight
    (full fine-tuning, for small backbones). Save with ``encoder.save_pretrained`` (adapters merged).
    """
    with requires('dense'):
        import torch
    if not triples:
        raise ValueError('contrastive_train needs at least one (query, positive, negative) triple')
    if lora:
        add_lora(encoder.backbone)
    model = encoder.backbone.model
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = random.Random(seed)
    losses = []
    for _ in range(epochs):
        order = list(triples)
        rng.shuffle(order)
        starts = range(0, len(order), batch_size)
        for start in (pt.tqdm(starts, desc='training', unit='batch') if verbose else starts):
            if max_steps is not None and len(losses) >= max_steps:
                break
            loss = contrastive_loss(encoder, order[start:start + batch_size], mode=mode, sparse=sparse)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
    model.eval()
    return losses
