"""Training a single-vector bi-encoder on synthetic (generated query, document) pairs, as CDP does."""
import json
import tempfile
from pathlib import Path
from typing import Optional, Union

import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building

#: ``(type, format)`` in the ``pt_meta.json`` of a bi-encoder saved by :func:`train_bi_encoder`, through which
#: ``pt.Artifact.load`` finds :func:`load_bi_encoder`.
BI_ENCODER_ARTIFACT = ('bi_encoder', 'sentence_transformers')


def synthetic_pairs(documents: pd.DataFrame, num_queries: Optional[int] = None) -> pd.DataFrame:
    """One ``(query, text)`` training pair per generated query of each document.

    Args:
        documents: Frame with ``text`` and ``querygen`` (a list of queries per document).
        num_queries: Use only each document's first this many queries (M); all when None.

    Returns:
        Frame with ``query``, ``text`` (and ``docno`` when the input has it).
    """
    pt.validate.columns(documents, includes=['text', 'querygen'])
    columns = [c for c in ('docno', 'text') if c in documents.columns]
    pairs = documents[columns].assign(query=[list(q)[:num_queries] for q in documents['querygen']]).explode('query')
    return pairs.dropna(subset=['query'])[['query'] + columns].reset_index(drop=True)


def train_bi_encoder(pairs: pd.DataFrame, model: Union[str, Path], output: Union[str, Path], *, epochs: int = 1,
                     batch_size: int = 32, learning_rate: float = 2e-5, scale: float = 20.0, seed: int = 0,
                     max_seq_length: Optional[int] = None, mixed_precision: Optional[str] = None,
                     gradient_accumulation_steps: int = 1) -> Path:
    """Fine-tunes a sentence-transformers model with InfoNCE over in-batch negatives
    (``MultipleNegativesRankingLoss`` at ``scale``, i.e. temperature 1/scale), and saves it to ``output``.

    Where ``pairs`` has a ``negative`` column (a hard negative text per pair), it joins the in-batch negatives.

    Batches never hold the same document twice (a document's other queries would be false negatives). Under
    ``accelerate launch`` each process takes its share of every batch and the in-batch negatives are gathered from
    all of them, so the model trains as in one process; the main process saves it.

    Args:
        pairs: Frame with ``query`` and ``text`` (see :func:`synthetic_pairs`), and optionally ``negative``.
        model: The starting checkpoint (a sentence-transformers or Hugging Face path).
        output: Where the trained model is saved (written under a temporary name, renamed when complete).
        epochs: Passes over the pairs.
        batch_size: Pairs per optimiser step over all processes (each pair's negatives are its micro-batch's other
            documents); a multiple of the processes times ``gradient_accumulation_steps``.
        learning_rate: AdamW learning rate.
        scale: Inverse temperature of the cosine similarities.
        seed: Seeds shuffling and initialisation.
        max_seq_length: Token limit of the model's inputs (the checkpoint's own when None).
        mixed_precision: ``'no'``, ``'fp16'`` or ``'bf16'``; None takes ``accelerate launch``'s setting.
        gradient_accumulation_steps: Micro-batches per batch (one backward each).

    Returns:
        The output path.
    """
    with requires('train'):
        from accelerate import PartialState
        from datasets import Dataset
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from sentence_transformers.sentence_transformer.trainer import SentenceTransformerTrainer
        from sentence_transformers.sentence_transformer.training_args import (BatchSamplers,
                                                                              SentenceTransformerTrainingArguments)
    pt.validate.columns(pairs, includes=['query', 'text'])
    if len(pairs) < 2:
        raise ValueError(f'training needs at least two pairs (in-batch negatives), got {len(pairs)}')
    state = PartialState()
    shares = state.num_processes * gradient_accumulation_steps
    if batch_size % shares:
        raise ValueError(f'batch_size {batch_size} must be a multiple of the {state.num_processes} processes times '
                         f'gradient_accumulation_steps={gradient_accumulation_steps}')
    encoder = SentenceTransformer(str(model), device=str(state.device))
    if max_seq_length:
        encoder.max_seq_length = max_seq_length
    with tempfile.TemporaryDirectory() as scratch:
        args = SentenceTransformerTrainingArguments(
            output_dir=scratch, num_train_epochs=epochs, per_device_train_batch_size=batch_size // shares,
            gradient_accumulation_steps=gradient_accumulation_steps, fp16=mixed_precision == 'fp16',
            bf16=mixed_precision == 'bf16', learning_rate=learning_rate, seed=seed,
            batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy='no', report_to='none', logging_steps=10)
        columns = {'anchor': list(pairs['query']), 'positive': list(pairs['text'])}
        if 'negative' in pairs.columns:
            columns['negative'] = list(pairs['negative'])
        dataset = Dataset.from_dict(columns)
        loss = MultipleNegativesRankingLoss(encoder, scale=scale, gather_across_devices=state.num_processes > 1)
        SentenceTransformerTrainer(model=encoder, args=args, train_dataset=dataset, loss=loss).train()
    if state.is_main_process:
        with building(output) as tmp:
            encoder.save_pretrained(str(tmp), create_model_card=False)   # the card records the training time
            artifact, form = BI_ENCODER_ARTIFACT
            (tmp / 'pt_meta.json').write_text(json.dumps({'type': artifact, 'format': form,
                                                          'package_hint': 'pyterrier-multiquery'}))
    state.wait_for_everyone()
    return Path(output)


def load_bi_encoder(path: Union[str, Path], **kwargs) -> pt.Transformer:
    """A bi-encoder saved by :func:`train_bi_encoder`, as pyterrier_dr's ``SBertBiEncoder`` (what
    ``pt.Artifact.load(path)`` returns for its folder).

    Args:
        path: The saved model's folder.
        kwargs: ``SBertBiEncoder``'s settings (``batch_size``, ``device``, ``verbose``).
    """
    with requires('dense'):
        from pyterrier_dr import SBertBiEncoder
    return SBertBiEncoder(str(path), **kwargs)
