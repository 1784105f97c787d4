"""AMER over a document encoder: the encoder's own query vector plus a learned residual for each next vector."""
import json
from pathlib import Path
from typing import Optional, Union

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building
from pyterrier_multiquery._saved_model import write_meta
from pyterrier_multiquery.amer.model import AMERModel, CONFIG_NAME, PROJECTIONS, with_lora
from pyterrier_multiquery.training.departure import checked_departure

with requires('dense'):
    import torch
    import torch.nn.functional as F
    from torch import nn

ENCODER_LORA_TARGETS = ('query', 'key', 'value', 'dense', 'q_proj', 'k_proj', 'v_proj', 'o_proj')
ENCODER_TRAINING = ('none', 'lora', 'full')


def _pooling(path: Path) -> str:
    """The pooling of a sentence-transformers checkpoint (``'mean'`` or ``'cls'``); mean without a pooling config."""
    config = path / '1_Pooling' / 'config.json'
    if not config.exists():
        return 'mean'
    settings = json.loads(config.read_text())
    # sentence-transformers 2-4 write a flag per mode, 5 and later one 'pooling_mode'
    if settings.get('pooling_mode_mean_tokens') or settings.get('pooling_mode') == 'mean':
        return 'mean'
    if settings.get('pooling_mode_cls_token') or settings.get('pooling_mode') == 'cls':
        return 'cls'
    raise ValueError(f'{config}: only mean or CLS pooling is supported, got {settings}')


def _max_length(path: Path, tokenizer) -> int:
    """The sentence-transformers ``max_seq_length`` of a checkpoint, else (sentence-transformers 6 keeps it in the
    tokenizer) the tokenizer's limit, at most 512."""
    config = path / 'sentence_bert_config.json'
    if config.exists() and 'max_seq_length' in json.loads(config.read_text()):
        return int(json.loads(config.read_text())['max_seq_length'])
    return min(int(tokenizer.model_max_length), 512)


class EncoderAMERModel(AMERModel):
    """AMER whose backbone is the bidirectional encoder that also encodes the documents (all-MiniLM-L6-v2, say).

    Step t reads the query's tokens followed by the vectors emitted so far (each through ``in_proj`` as one more
    input position). The first vector is q, the encoder's own query vector (its pooling over the query alone,
    normalised); vector t > 1 is ``normalise(q + out_proj(h_t))``, h_t being the hidden state of the last fed
    vector. ``out_proj`` starts at zero and the encoder at its pretrained weights, so an untrained model emits q
    N times and its merged ranking is the encoder's: training learns only the departure from it (q itself moves
    only when the encoder trains). ``departure`` (saved with the model) scales the residual: 0 gives q N times
    whatever the weights, 1 the trained model; a value between keeps the model near its encoder on collections
    it never saw (:func:`~pyterrier_multiquery.training.departure.choose_departure` picks it on training questions).

    It saves as an ``amer_model.encoder_hf`` artifact, which ``AMERModel.from_pretrained`` and ``pt.Artifact.load``
    load.
    """
    ARTIFACT_FORMAT = 'encoder_hf'

    def __init__(self, encoder, tokenizer, doc_dim: int, *, num_vectors: int = 3, pooling: str = 'mean',
                 max_length: int = 256, source: Optional[dict] = None, departure: float = 1.):
        """
        Args:
            encoder: A Hugging Face encoder (``AutoModel``, a peft model for LoRA).
            tokenizer: Its tokenizer.
            doc_dim: Size of the document vectors (the encoder's output size).
            num_vectors: Query vectors emitted by default (N).
            pooling: ``'mean'`` or ``'cls'``, as the encoder's sentence-transformers configuration says.
            max_length: Query tokens read at most.
            source: How the model was made (kept by :meth:`save_pretrained`).
            departure: The weight of the residual (1: as trained).
        """
        super().__init__(encoder, tokenizer, doc_dim, num_vectors=num_vectors, source=source)
        self.departure = departure
        if encoder.config.hidden_size != doc_dim:
            raise ValueError(f'the encoder emits {encoder.config.hidden_size}-dimensional states but the documents '
                             f'are {doc_dim}-dimensional: AMER over an encoder needs the same encoder on both sides')
        if pooling not in ('mean', 'cls'):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.pooling = pooling
        self.max_length = max_length
        nn.init.zeros_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    @property
    def departure(self) -> float:
        """The weight of the learned residual added to the encoder's query vector."""
        return self._departure

    @departure.setter
    def departure(self, value: float) -> None:
        self._departure = checked_departure(value)

    @classmethod
    def from_encoder(cls, path: Union[str, Path], *, num_vectors: int = 3, train_encoder: str = 'lora',
                     lora_r: int = 8, lora_alpha: int = 16, lora_dropout: float = 0.1) -> 'EncoderAMERModel':
        """A new AMER over a sentence-transformers (or pyterrier_dr) encoder checkpoint.

        Args:
            path: The checkpoint folder (its ``1_Pooling`` and ``sentence_bert_config.json`` are read if present).
            num_vectors: Query vectors emitted by default.
            train_encoder: ``'lora'`` (adapters on the attention and feed-forward layers), ``'full'`` (every weight)
                or ``'none'`` (only the projections train).
            lora_r: LoRA rank.
            lora_alpha: LoRA scaling.
            lora_dropout: LoRA dropout.
        """
        with requires('dense'):
            from transformers import AutoModel, AutoTokenizer
        if train_encoder not in ENCODER_TRAINING:
            raise ValueError(f'train_encoder must be one of {ENCODER_TRAINING}, got {train_encoder!r}')
        path = Path(path)
        if not (path / 'config.json').exists():
            raise FileNotFoundError(f'{path} is not a Hugging Face encoder checkpoint (no config.json)')
        encoder = AutoModel.from_pretrained(str(path), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        encoder.requires_grad_(train_encoder == 'full')
        if train_encoder == 'lora':
            encoder = with_lora(encoder, ENCODER_LORA_TARGETS, lora_r, lora_alpha, lora_dropout, name=str(path))
        return cls(encoder, tokenizer, encoder.config.hidden_size, num_vectors=num_vectors, pooling=_pooling(path),
                   max_length=_max_length(path, tokenizer),
                   source={'backbone': 'encoder', 'path': str(path), 'train_encoder': train_encoder})

    def embed_text(self, texts):
        """Input embeddings and attention mask of ``texts`` (right-padded, truncated to ``max_length``)."""
        self.tokenizer.padding_side = 'right'
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                               return_tensors='pt').to(self.in_proj.weight.device)
        return self.lm.get_input_embeddings()(batch['input_ids']), batch['attention_mask']

    def embed_vectors(self, vectors):
        raise ValueError('AMER over an encoder reads text queries, not vectors')

    def step_vector(self, inputs_embeds, attention_mask, state=None):
        """The encoder's query vector at the first step; normalise(it + out_proj(last fed state)) after it.

        The query vector (the encoder's own pooling over the query alone, normalised) is the state kept for the
        later steps, whose input also holds the fed vectors.
        """
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.lm(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                         position_ids=positions).last_hidden_state
        if state is None:
            if self.pooling == 'mean':
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            else:
                pooled = hidden[:, 0]
            return F.normalize(pooled, dim=-1), F.normalize(pooled, dim=-1)
        residual = self.out_proj(hidden[:, -1])    # the last fed vector: fed positions follow the padded query
        return F.normalize(state + self.departure * residual, dim=-1), state

    def save_pretrained(self, path: Union[str, Path]) -> None:
        """Writes the encoder (LoRA adapters merged into it), tokenizer, projections and settings atomically."""
        encoder = self.lm
        if hasattr(encoder, 'merge_and_unload'):
            import copy
            encoder = copy.deepcopy(encoder).merge_and_unload()
        with building(path) as tmp:
            tmp.mkdir()
            encoder.save_pretrained(tmp / 'lm')
            self.tokenizer.save_pretrained(tmp / 'lm')
            torch.save({'in_proj': self.in_proj.state_dict(), 'out_proj': self.out_proj.state_dict()},
                       tmp / PROJECTIONS)
            (tmp / CONFIG_NAME).write_text(json.dumps({
                'doc_dim': self.doc_dim, 'num_vectors': self.num_vectors, 'pooling': self.pooling,
                'max_length': self.max_length, 'source': self.source, 'departure': self.departure}, indent=2))
            write_meta(tmp, self)
        self.path = Path(path)

    @classmethod
    def from_saved(cls, path: Path, config: dict) -> 'EncoderAMERModel':
        """The model saved at ``path`` whose settings ``config`` were read from it."""
        with requires('dense'):
            from transformers import AutoModel, AutoTokenizer
        if cls is EncoderAMERModel and config['source'].get('residual') == 'linear':
            return LinearResidualAMERModel.from_saved(path, config)
        encoder = AutoModel.from_pretrained(str(path / 'lm'), dtype=torch.float32)
        model = cls(encoder, AutoTokenizer.from_pretrained(str(path / 'lm')), config['doc_dim'],
                    num_vectors=config['num_vectors'], pooling=config['pooling'], max_length=config['max_length'],
                    source=config['source'], departure=config.get('departure', 1.))
        projections = torch.load(path / PROJECTIONS, map_location='cpu', weights_only=True)
        model.in_proj.load_state_dict(projections['in_proj'])
        model.out_proj.load_state_dict(projections['out_proj'])
        return model.eval()


class LinearResidualAMERModel(EncoderAMERModel):
    """The simplest AMER over an encoder (an ablation): vector t > 1 is ``normalise(q + W q_{t-1})``.

    q is the encoder's query vector and W (``out_proj``) starts at zero; the encoder is read once, for q, and
    ``in_proj`` is a fixed identity that hands the previous vector to W. What
    :class:`EncoderAMERModel` adds over this is the encoder reading the fed vectors together with the query.
    """

    def __init__(self, encoder, tokenizer, doc_dim: int, **settings):
        super().__init__(encoder, tokenizer, doc_dim, **settings)
        with torch.no_grad():
            self.in_proj.weight.copy_(torch.eye(doc_dim))
            self.in_proj.bias.zero_()
        self.in_proj.requires_grad_(False)

    @classmethod
    def from_encoder(cls, path: Union[str, Path], *, num_vectors: int = 2, **settings) -> 'LinearResidualAMERModel':
        """A new linear-residual AMER over an encoder checkpoint, the encoder frozen (only W trains)."""
        model = super().from_encoder(path, num_vectors=num_vectors, train_encoder='none', **settings)
        model.source['residual'] = 'linear'
        return model

    def step_vector(self, inputs_embeds, attention_mask, state=None):
        """The encoder's query vector at the first step; ``normalise(q + W q_{t-1})`` after it."""
        if state is None:
            return super().step_vector(inputs_embeds, attention_mask)
        return F.normalize(state + self.departure * self.out_proj(inputs_embeds[:, -1]), dim=-1), state
