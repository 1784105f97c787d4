"""Fine-tuning a single-vector sentence-transformers encoder (MiniLM-FT, CDP's and QAEncoder's encoders)."""
import json
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building
from pyterrier_multiquery.training.contrastive import ContrastiveTrainer, Texts
from pyterrier_multiquery.training.losses import in_batch_infonce

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

#: ``(type, format)`` in the ``pt_meta.json`` of a bi-encoder saved by :meth:`BiEncoderTrainer.save`, through which
#: ``pt.Artifact.load`` finds :func:`load_bi_encoder`.
BI_ENCODER_ARTIFACT = ('bi_encoder', 'sentence_transformers')


class BiEncoderTrainer(ContrastiveTrainer):
    """Fine-tunes a sentence-transformers encoder with InfoNCE over cosine similarities (sentence-transformers'
    ``MultipleNegativesRankingLoss``): each query's candidates are the batch's relevant passages and hard negatives.

    AdamW without weight decay, the learning rate decaying linearly to 0 over the training (as sentence-transformers
    trains). Under ``accelerate launch`` each process takes its share of every batch and the candidates are gathered
    from all of them, so the model trains as in one process. :meth:`save` writes the model as a PyTerrier artifact
    that loads as pyterrier_dr's ``SBertBiEncoder``.
    """
    description = 'bi-encoder'

    def __init__(self, model: Union[str, Path, 'SentenceTransformer'], texts: Texts, *, hard_negatives: int = 1,
                 temperature: float = 0.05, learning_rate: float = 2e-5, epochs: int = 1, batch_size: int = 32,
                 max_length: Optional[int] = None, seed: int = 0, device: Optional[str] = None,
                 threads: Optional[int] = None, choose_epoch: bool = False, mixed_precision: Optional[str] = None,
                 gradient_accumulation_steps: int = 1, verbose: bool = True):
        """
        Args:
            model: A sentence-transformers model, or the checkpoint (a sentence-transformers or Hugging Face path).
            texts: The passages' texts (:data:`~pyterrier_multiquery.training.contrastive.Texts`).
            hard_negatives: Hard negatives per relevant passage (0: in-batch negatives alone, as CDP trains).
            temperature: InfoNCE temperature (sentence-transformers' ``scale`` is its inverse).
            learning_rate: AdamW's peak learning rate.
            epochs: Passes over the triples.
            batch_size: Triples per optimiser step over all processes.
            max_length: Token limit of the inputs (the checkpoint's own when None).
            seed: Seed of the batches' order.
            device: Where the model trains (None: accelerate's device, a GPU when there is one).
            threads: torch's CPU threads while training (None: as they are).
            choose_epoch: Keep the epoch that scores best on the validation questions.
            mixed_precision: ``'no'``, ``'fp16'``, ``'bf16'``; None takes ``accelerate launch``'s setting.
            gradient_accumulation_steps: Micro-batches per batch (one backward each).
            verbose: Whether to show progress.
        """
        with requires('train'):
            import torch
            from sentence_transformers import SentenceTransformer
        from pyterrier_multiquery.training.distributed import DataParallel
        if not isinstance(model, SentenceTransformer):
            model = SentenceTransformer(str(model), device='cpu')
        if max_length:
            model.max_seq_length = max_length
        super().__init__(model, texts, hard_negatives=hard_negatives, temperature=temperature,
                         learning_rate=learning_rate, epochs=epochs, batch_size=batch_size, seed=seed, device=device,
                         threads=threads, choose_epoch=choose_epoch, verbose=verbose)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.)
        self.parallel = DataParallel(model, self.optimizer, device=self.device, mixed_precision=mixed_precision,
                                     gradient_accumulation_steps=gradient_accumulation_steps)
        self.scheduler = None

    def _fit(self, train, dev):
        with requires('dense'):
            import torch
        total = max(1, self.epochs * -(-len(train) // self.batch_size))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: max(0., 1 - step / total))
        return super()._fit(train, dev)

    def embed(self, texts: List[str]) -> 'torch.Tensor':
        """The model's unit vectors of ``texts``, with gradients."""
        with requires('dense'):
            import torch
        features = {k: v.to(self.parallel.device) if isinstance(v, torch.Tensor) else v
                    for k, v in self.model.tokenize(texts).items()}
        return torch.nn.functional.normalize(self.model(features)['sentence_embedding'], dim=-1)

    def optimiser_step(self, batch: pd.DataFrame) -> float:
        with requires('dense'):
            import torch
        self.model.train()
        negatives = 'negative' in batch.columns

        def loss_of(share):
            local = batch.iloc[share.local]
            queries = self.embed(list(local['query']))
            candidates = [share.gather(self.embed(list(local['text'])))]
            if negatives:
                candidates.append(share.gather(self.embed(list(local['negative']))))
            scores = queries @ torch.cat(candidates).T
            return in_batch_infonce(scores, self.temperature, share.local - share.batch[0], reduction='sum')

        loss = self.parallel.step(len(batch), loss_of)
        self.scheduler.step()
        return loss

    def pair_scores(self, queries: List[str], passages: List[str]) -> np.ndarray:
        q = self.model.encode(queries, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        p = self.model.encode(passages, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return (q * p).sum(-1)

    def save(self, path: Union[str, Path]) -> Path:
        """Writes the model, its training record (``training.json``) and ``pt_meta.json`` to ``path`` atomically (the
        main process only, under ``accelerate launch``); returns the path."""
        if self.parallel.accelerator.is_main_process:
            with building(path) as tmp:
                self.model.save_pretrained(str(tmp), create_model_card=False)   # the card records the time
                record = {**self.record(), 'history': None if self.history is None else self.history.to_dict()}
                (tmp / 'training.json').write_text(json.dumps(record, indent=2))
                artifact, form = BI_ENCODER_ARTIFACT
                (tmp / 'pt_meta.json').write_text(json.dumps({'type': artifact, 'format': form,
                                                              'package_hint': 'pyterrier-multiquery'}))
        self.parallel.accelerator.wait_for_everyone()
        return Path(path)


def load_bi_encoder(path: Union[str, Path], **kwargs) -> pt.Transformer:
    """A bi-encoder saved by :meth:`BiEncoderTrainer.save`, as pyterrier_dr's ``SBertBiEncoder`` (what
    ``pt.Artifact.load(path)`` returns for its folder).

    Args:
        path: The saved model's folder.
        kwargs: ``SBertBiEncoder``'s settings (``batch_size``, ``device``, ``verbose``).
    """
    with requires('dense'):
        from pyterrier_dr import SBertBiEncoder
    return SBertBiEncoder(str(path), **kwargs)
