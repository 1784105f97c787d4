"""The JPR network: a pretrained passage encoder and a pointer decoder that picks passages one after another."""
import hashlib
import json
import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building, encoder_digest
from pyterrier_multiquery._saved_model import SavedModel, check_saved, read_json, read_training, write_meta
from pyterrier_multiquery.training.departure import checked_departure

with requires('dense'):
    import torch
    from torch import nn

CONFIG_NAME = 'jpr_config.json'
DECODER_WEIGHTS = 'decoder.pt'


def candidate_text(question: str, index: int, passage: str) -> str:
    """The text encoded for one candidate: the question, the candidate's index number and the passage."""
    return f'question: {question} index: {index} passage: {passage}'


class PassageEncoder(nn.Module):
    """A pretrained encoder that turns (question, index, passage) texts into mean-pooled states.

    Takes an encoder-only checkpoint (such as all-MiniLM-L6-v2) or the encoder of a T5 checkpoint. When frozen,
    the states of a question's candidate list are computed once and remembered, so several decoders (folds,
    ablations) can share one encoder cheaply; with ``state_cache`` set to a folder they are also kept there
    across runs (one file per candidate list, named by a hash of its texts, ``max_length`` and the encoder's weights,
    so that encoders sharing a folder, MiniLM and a fine-tuned MiniLM say, never read each other's states).
    """

    def __init__(self, path: str, *, max_length: int = 256, freeze: bool = True, batch_size: int = 32):
        super().__init__()
        with requires('dense'):
            from transformers import AutoConfig, AutoModel, AutoTokenizer, T5EncoderModel
        config = AutoConfig.from_pretrained(path)
        encoder_class = T5EncoderModel if config.model_type in ('t5', 'mt5', 'umt5') else AutoModel
        self.model = encoder_class.from_pretrained(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.width = self.model.config.hidden_size  # T5 configs map hidden_size to d_model
        self.max_length = max_length
        self.batch_size = batch_size
        self.frozen = freeze
        self.model.requires_grad_(not freeze)
        self._states = {}
        self.state_cache: Optional[Path] = None
        self._weights_digest: Optional[str] = None

    def forward(self, question: str, passages: Sequence[str]):
        """States of ``passages`` (in index order) for ``question``: (len(passages), width)."""
        key = (question, tuple(passages))
        if self.frozen and key in self._states:
            return self._states[key]
        texts = [candidate_text(question, i, p) for i, p in enumerate(passages)]
        device = next(self.model.parameters()).device
        stored = self._stored_states(texts)
        if stored is not None and stored.exists():
            self._states[key] = torch.as_tensor(np.load(stored), device=device)
            return self._states[key]
        states = []
        with torch.set_grad_enabled(not self.frozen and torch.is_grad_enabled()):
            for begin in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(texts[begin:begin + self.batch_size], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors='pt').to(device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch['attention_mask'].unsqueeze(-1).to(hidden.dtype)
                states.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.))
        states = torch.cat(states) if states else torch.zeros(0, self.width, device=device)
        if self.frozen:
            self._states[key] = states
        if stored is not None:
            stored.parent.mkdir(parents=True, exist_ok=True)
            partial = stored.with_name(f'.{stored.name}.{os.getpid()}')
            with open(partial, 'wb') as f:
                np.save(f, states.detach().cpu().numpy())
            os.replace(partial, stored)
        return states

    def _stored_states(self, texts: Sequence[str]) -> Optional[Path]:
        """Where a frozen encoder keeps the states of ``texts`` across runs (None without ``state_cache``)."""
        if not self.frozen or self.state_cache is None:
            return None
        if self._weights_digest is None:   # frozen, so computed once
            self._weights_digest = encoder_digest(self, name=type(self.model).__name__)
        digest = hashlib.sha1(json.dumps([self._weights_digest, self.max_length, list(texts)]).encode()).hexdigest()
        return Path(self.state_cache) / f'{digest}.npy'

    def save_pretrained(self, path: Path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


class JPRModel(nn.Module, SavedModel):
    """Fusion-in-Decoder reranker over pooled passage states with a pointer output.

    Each candidate ``question: ... index: i passage: ...`` is encoded into one state by a
    :class:`PassageEncoder`. A causal transformer decoder reads the states of the passages chosen so far (after
    a start vector), cross-attends to the states of all candidates, and scores every candidate by a dot product
    with its state: a pointer over candidate positions, which are the index numbers. Already chosen candidates
    are masked out.

    With ``prior=True`` each candidate's logit also gets ``w * -log(1 + rank)``, ``rank`` being its first-stage
    rank (0 for the top passage) and ``w`` a learned scalar starting at 1. The pointer's query head starts at zero,
    so an untrained model's logits are the prior alone: every decoder then returns the first-stage order, and
    training learns only the departure from it. ``departure`` (saved with the model) scales the pointer's part of
    the logits: 0 gives the first-stage order whatever the weights, 1 the trained model; a value between keeps a
    model near its first stage on collections it never saw
    (:func:`~pyterrier_multiquery.training.departure.choose_departure` picks it on training questions).

    A saved model is a PyTerrier artifact (``jpr_model.hf``): ``pt.Artifact.load(path)`` loads it and
    ``to_hf``/``from_hf`` share it.
    """
    ARTIFACT_TYPE = 'jpr_model'

    def __init__(self, encoder: Union[str, PassageEncoder], *, decoder_layers: int = 2, decoder_heads: int = 4,
                 decoder_dropout: float = 0.1, freeze_encoder: bool = True, max_length: int = 256,
                 max_steps: int = 32, prior: bool = True, departure: float = 1.):
        """
        Args:
            encoder: A checkpoint path, or a :class:`PassageEncoder` to share with other models.
            decoder_layers: Transformer decoder layers.
            decoder_heads: Attention heads per decoder layer.
            decoder_dropout: Dropout in the decoder.
            freeze_encoder: Whether the encoder stays fixed (trained otherwise); ignored for a shared encoder.
            max_length: Tokens per candidate text; ignored for a shared encoder.
            max_steps: The longest passage sequence the decoder handles.
            prior: Whether the logits add the learned first-stage rank prior (the model then needs ``ranks``).
            departure: The weight of the pointer's logits next to the prior (1: as trained; needs the prior
                otherwise).
        """
        super().__init__()
        self.path = SavedModel.NO_PATH
        if isinstance(encoder, (str, Path)):
            encoder = PassageEncoder(str(encoder), max_length=max_length, freeze=freeze_encoder)
        self.passages = encoder
        self.settings = {'decoder_layers': decoder_layers, 'decoder_heads': decoder_heads,
                         'decoder_dropout': decoder_dropout, 'freeze_encoder': encoder.frozen,
                         'max_length': encoder.max_length, 'max_steps': max_steps, 'prior': prior}
        self.width = width = encoder.width
        layer = nn.TransformerDecoderLayer(width, decoder_heads, dim_feedforward=2 * width,
                                           dropout=decoder_dropout, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, decoder_layers)
        self.start = nn.Parameter(torch.zeros(width))
        self.positions = nn.Embedding(max_steps + 1, width)
        self.query_head = nn.Linear(width, width)
        self.key_head = nn.Linear(width, width)
        self.prior = prior
        self.departure = departure
        if prior:
            nn.init.zeros_(self.query_head.weight)
            nn.init.zeros_(self.query_head.bias)
            self.prior_weight = nn.Parameter(torch.ones(()))

    @property
    def departure(self) -> float:
        """The weight of the pointer's logits next to the first-stage prior."""
        return self._departure

    @departure.setter
    def departure(self, value: float) -> None:
        value = checked_departure(value)
        if value != 1. and not self.prior:
            raise ValueError('a JPR model without a first-stage prior has no first stage to fall back to: '
                             'departure must be 1')
        self._departure = value

    def trainable_parameters(self):
        """The decoder's parameters, and the encoder's when it is not frozen."""
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, memory, prefix, memory_mask=None, ranks=None):
        """Log-probabilities of the next passage after each prefix of ``prefix``.

        Args:
            memory: Candidate states, (batch, candidates, width).
            prefix: Chosen candidate positions, (batch, steps), -1 past each sequence's end.
            memory_mask: True for padding candidates, (batch, candidates).
            ranks: The candidates' first-stage ranks from 0, (batch, candidates); needed with the prior.

        Returns:
            (batch, steps + 1, candidates): row t is log P(next | prefix[:t]), with the candidates in
            prefix[:t] and padding at -inf.
        """
        batch, candidates, _ = memory.shape
        steps = prefix.shape[1]
        if steps + 1 > self.positions.num_embeddings:
            raise ValueError(f'at most {self.positions.num_embeddings - 1} steps, got {steps}')
        if memory_mask is None:
            memory_mask = torch.zeros(batch, candidates, dtype=torch.bool, device=memory.device)
        chosen = memory.gather(1, prefix.clamp(min=0).unsqueeze(-1).expand(-1, -1, self.width))
        inputs = torch.cat([self.start.expand(batch, 1, -1), chosen], 1)
        inputs = inputs + self.positions(torch.arange(steps + 1, device=memory.device))
        causal = nn.Transformer.generate_square_subsequent_mask(steps + 1, device=memory.device)
        hidden = self.decoder(inputs, memory, tgt_mask=causal, tgt_is_causal=True,
                              memory_key_padding_mask=memory_mask)
        logits = self.query_head(hidden) @ self.key_head(memory).transpose(1, 2) / self.width ** .5
        if self.departure != 1.:
            logits = self.departure * logits
        if self.prior:
            if ranks is None:
                raise ValueError('this JPR model has a first-stage prior: give the candidates\' ranks')
            logits = logits - self.prior_weight * torch.log1p(ranks.to(logits.dtype)).unsqueeze(1)
        taken = torch.zeros(batch, steps + 1, candidates, dtype=torch.bool, device=memory.device)
        valid = prefix >= 0
        onehot = torch.zeros(batch, steps, candidates, dtype=torch.bool, device=memory.device)
        onehot.scatter_(2, prefix.clamp(min=0).unsqueeze(-1), valid.unsqueeze(-1))
        taken[:, 1:] = onehot.cumsum(1) > 0
        logits = logits.masked_fill(taken | memory_mask.unsqueeze(1), float('-inf'))
        return logits.log_softmax(-1)

    def save_pretrained(self, path: Union[str, Path]) -> None:
        """Writes the encoder, its tokenizer, the decoder weights and the settings to ``path`` (atomically)."""
        with building(path) as tmp:
            tmp.mkdir()
            self.passages.save_pretrained(tmp / 'encoder')
            torch.save({k: v for k, v in self.state_dict().items() if not k.startswith('passages.')},
                       tmp / DECODER_WEIGHTS)
            (tmp / CONFIG_NAME).write_text(json.dumps({**self.settings, 'departure': self.departure}, indent=2))
            write_meta(tmp, self)
        self.path = Path(path)

    @classmethod
    def from_pretrained(cls, path: Union[str, Path], **settings) -> 'JPRModel':
        """A model saved by :meth:`save_pretrained`, or a fresh decoder over the encoder checkpoint ``path``.

        Models saved before the first-stage prior existed load without it.
        """
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f'no JPR model or encoder checkpoint folder at {str(path)!r} (a fresh model over '
                                    'a Hugging Face hub encoder: JPRModel(name))')
        if not check_saved(path, cls, CONFIG_NAME):
            return cls(str(path), **settings)
        saved = {'prior': False, **read_json(path / CONFIG_NAME)}
        model = cls(str(path / 'encoder'), **{**saved, **settings})
        weights = torch.load(path / DECODER_WEIGHTS, map_location='cpu', weights_only=True)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        missing = [k for k in missing if not k.startswith('passages.')]
        if missing or unexpected:
            raise ValueError(f'{path / DECODER_WEIGHTS} does not match the JPR decoder: '
                             f'missing {missing}, unexpected {unexpected}')
        model.path = path
        model.training_record = read_training(path)
        return model
