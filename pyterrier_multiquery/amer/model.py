"""The AMER network: a causal LM that emits query vectors one after another, each fed back as the next input."""
import json
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building
from pyterrier_multiquery._saved_model import SavedModel, check_saved, read_json, read_meta, read_training, write_meta

with requires('dense'):
    import torch
    import torch.nn.functional as F
    from torch import nn

CONFIG_NAME = 'amer_config.json'
PROJECTIONS = 'projections.pt'
LORA_TARGETS = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj')


def with_lora(model, target_modules: Sequence[str], r: int, alpha: int, dropout: float, *, name: str):
    """``model`` with LoRA adapters (peft) on those of ``target_modules`` it has; a ValueError naming it if none."""
    with requires('train'):
        from peft import LoraConfig, get_peft_model
    names = {module.rsplit('.', 1)[-1] for module, _ in model.named_modules()}
    targets = [t for t in target_modules if t in names]
    if not targets:
        raise ValueError(f'{name} has none of the LoRA target modules {tuple(target_modules)}')
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets))


class AMERModel(nn.Module, SavedModel):
    """Autoregressive Multi-Embedding Retriever (the AMER paper).

    The query is read by a causal LM; the last hidden state, through ``out_proj``, is the first query vector q1.
    Each q_t goes back into the LM through ``in_proj`` as the next input embedding, and the next last hidden state
    gives q_{t+1}, for ``num_vectors`` steps. All q_t are L2-normalised. For the synthetic task the query is itself
    a vector, fed through ``in_proj`` as the only input.

    A saved AMER is a PyTerrier artifact (``amer_model.hf``): ``pt.Artifact.load(path)`` loads it and
    ``to_hf``/``from_hf`` share it.
    """
    ARTIFACT_TYPE = 'amer_model'

    def __init__(self, lm, tokenizer, doc_dim: int, *, num_vectors: int = 3, source: Optional[dict] = None):
        """
        Args:
            lm: A Hugging Face causal LM (a peft model for LoRA).
            tokenizer: Its tokenizer, or None for vector inputs only.
            doc_dim: Size of the document embeddings the query vectors are compared with.
            num_vectors: Query vectors emitted by default (N).
            source: How the backbone was made (kept by :meth:`save_pretrained`).
        """
        super().__init__()
        self.path = SavedModel.NO_PATH
        if num_vectors < 1:
            raise ValueError(f'num_vectors must be positive, got {num_vectors}')
        self.lm = lm
        self.tokenizer = tokenizer
        self.doc_dim = doc_dim
        self.num_vectors = num_vectors
        self.source = source or {}
        hidden = lm.config.hidden_size
        self.in_proj = nn.Linear(doc_dim, hidden)
        self.out_proj = nn.Linear(hidden, doc_dim)

    @classmethod
    def from_backbone(cls, backbone, doc_dim: int, *, num_vectors: int = 3, lora: bool = True, lora_r: int = 64,
                      lora_alpha: int = 16, lora_dropout: float = 0.1, gguf_file: Optional[str] = None) -> 'AMERModel':
        """A new AMER over a pretrained causal LM (a path or hub name) or a random one (a transformers config).

        Args:
            backbone: Checkpoint path, or a ``PretrainedConfig`` for a randomly initialised LM (full fine-tuning).
            doc_dim: Document embedding size.
            num_vectors: Query vectors emitted by default.
            lora: Train LoRA adapters (the paper's r=64, alpha=16, dropout 0.1 on the attention and MLP
                projections) instead of every weight. Needs pretrained weights.
            lora_r: LoRA rank.
            lora_alpha: LoRA scaling.
            lora_dropout: LoRA dropout.
            gguf_file: A GGUF file inside ``backbone`` to load (transformers dequantises it).
        """
        with requires('dense'):
            from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig
        if isinstance(backbone, PretrainedConfig):
            if lora:
                raise ValueError('LoRA needs a pretrained backbone; use lora=False with a config')
            return cls(AutoModelForCausalLM.from_config(backbone), None, doc_dim, num_vectors=num_vectors,
                       source={'config': backbone.to_dict(), 'lora': False})
        lm = AutoModelForCausalLM.from_pretrained(str(backbone), gguf_file=gguf_file, torch_dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(backbone), gguf_file=gguf_file)
        if lora:
            lm = with_lora(lm, LORA_TARGETS, lora_r, lora_alpha, lora_dropout, name=str(backbone))
        return cls(lm, tokenizer, doc_dim, num_vectors=num_vectors,
                   source={'path': str(backbone), 'gguf_file': gguf_file, 'lora': lora})

    def embed_text(self, texts: Sequence[str]):
        """Input embeddings and attention mask of ``texts`` (left-padded, so the last position is the last token)."""
        if self.tokenizer is None:
            raise ValueError('this AMER has no tokenizer (a random-config backbone): give vectors, not text')
        self.tokenizer.padding_side = 'left'
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        batch = self.tokenizer(list(texts), padding=True, return_tensors='pt').to(self.in_proj.weight.device)
        return self.lm.get_input_embeddings()(batch['input_ids']), batch['attention_mask']

    def embed_vectors(self, vectors):
        """Input embeddings of vector queries: ``in_proj`` of each, a sequence of one."""
        vectors = torch.as_tensor(vectors, dtype=torch.float32, device=self.in_proj.weight.device)
        if vectors.ndim != 2 or vectors.shape[1] != self.doc_dim:
            raise ValueError(f'vector queries must be (n, {self.doc_dim}), got {tuple(vectors.shape)}')
        return self.in_proj(vectors).unsqueeze(1), torch.ones(len(vectors), 1, dtype=torch.long, device=vectors.device)

    def forward(self, inputs_embeds, attention_mask, num_vectors: Optional[int] = None, feed=None):
        """The normalised query vectors, (batch, N, doc_dim).

        Args:
            inputs_embeds: (batch, length, hidden) input embeddings (:meth:`embed_text` or :meth:`embed_vectors`).
            attention_mask: (batch, length), left-padded.
            num_vectors: N (default: ``self.num_vectors``).
            feed: Teacher vectors (batch, N - 1, doc_dim): step t+1's input is feed[:, t] instead of the own
                (detached) q_t; rows of NaN mean "no teacher vector" (the own vector is fed).
        """
        steps = self.num_vectors if num_vectors is None else num_vectors
        if steps < 1:
            raise ValueError(f'num_vectors must be positive, got {steps}')
        vectors, state = [], None
        for t in range(steps):
            vector, state = self.step_vector(inputs_embeds, attention_mask, state)
            vectors.append(vector)
            if t + 1 < steps:
                following = vectors[-1].detach()
                if feed is not None:
                    teacher = feed[:, t]
                    use_teacher = ~torch.isnan(teacher).any(-1)
                    following = torch.where(use_teacher.unsqueeze(-1), torch.nan_to_num(teacher), following)
                inputs_embeds = torch.cat([inputs_embeds, self.in_proj(following).unsqueeze(1)], 1)
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(attention_mask), 1)], 1)
        return torch.stack(vectors, 1)

    def step_vector(self, inputs_embeds, attention_mask, state=None):
        """One step's normalised query vector: the last position's hidden state through ``out_proj``.

        Args:
            inputs_embeds: (batch, length, hidden): the query, then the vectors fed so far.
            attention_mask: (batch, length).
            state: What the previous step returned as its state (None at the first step).

        Returns:
            ``(vector, state)``: the (batch, doc_dim) vectors and the state the next step receives.
        """
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.lm.get_decoder()(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                       position_ids=positions).last_hidden_state[:, -1]
        return F.normalize(self.out_proj(hidden), dim=-1), None

    @torch.no_grad()
    def encode(self, queries: Union[Sequence[str], np.ndarray], num_vectors: Optional[int] = None,
               batch_size: int = 32) -> np.ndarray:
        """Query vectors of texts (or of vector queries) as a (n, N, doc_dim) float32 array."""
        self.eval()
        out = []
        for begin in range(0, len(queries), batch_size):
            batch = queries[begin:begin + batch_size]
            embeds = self.embed_vectors(batch) if isinstance(queries, np.ndarray) else self.embed_text(batch)
            out.append(self(*embeds, num_vectors=num_vectors).float().cpu().numpy())
        steps = self.num_vectors if num_vectors is None else num_vectors
        return np.concatenate(out) if out else np.zeros((0, steps, self.doc_dim), dtype=np.float32)

    def save_pretrained(self, path: Union[str, Path]) -> None:
        """Writes the LM (adapters only for LoRA), tokenizer, projections and settings to ``path`` atomically."""
        with building(path) as tmp:
            tmp.mkdir()
            self.lm.save_pretrained(tmp / 'lm')
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(tmp / 'lm')
            torch.save({'in_proj': self.in_proj.state_dict(), 'out_proj': self.out_proj.state_dict()},
                       tmp / PROJECTIONS)
            (tmp / CONFIG_NAME).write_text(json.dumps({'doc_dim': self.doc_dim, 'num_vectors': self.num_vectors,
                                                       'source': self.source}, indent=2))
            write_meta(tmp, self)
        self.path = Path(path)

    @classmethod
    def from_pretrained(cls, path: Union[str, Path]) -> 'AMERModel':
        """An AMER saved by :meth:`save_pretrained`, its files checked against its ``pt_meta.json``."""
        path = Path(path)
        meta = read_meta(path)
        if meta is not None and meta.get('type') == cls.ARTIFACT_TYPE and meta.get('format') != cls.ARTIFACT_FORMAT:
            # another kind of AMER (over an encoder, say): pt.Artifact.load finds its class by the format it saved
            return pt.Artifact.load(str(path))
        if not check_saved(path, cls, CONFIG_NAME):
            raise FileNotFoundError(f'{path} is not a saved AMER model (no {CONFIG_NAME})')
        config = read_json(path / CONFIG_NAME)
        model = cls.from_saved(path, config)
        model.path = path
        model.training_record = read_training(path)
        return model

    @classmethod
    def from_saved(cls, path: Path, config: dict) -> 'AMERModel':
        """The model saved at ``path`` whose settings ``config`` were read from it."""
        with requires('dense'):
            from transformers import AutoModelForCausalLM, AutoTokenizer
        source = config['source']
        if source.get('lora'):
            with requires('train'):
                from peft import PeftModel
            base = AutoModelForCausalLM.from_pretrained(source['path'], gguf_file=source.get('gguf_file'),
                                                        torch_dtype=torch.float32)
            lm = PeftModel.from_pretrained(base, path / 'lm')
        else:
            lm = AutoModelForCausalLM.from_pretrained(path / 'lm', torch_dtype=torch.float32)
        has_tokenizer = (path / 'lm' / 'tokenizer_config.json').exists()
        tokenizer = AutoTokenizer.from_pretrained(path / 'lm') if has_tokenizer else None
        model = cls(lm, tokenizer, config['doc_dim'], num_vectors=config['num_vectors'], source=source)
        projections = torch.load(path / PROJECTIONS, map_location='cpu', weights_only=True)
        model.in_proj.load_state_dict(projections['in_proj'])
        model.out_proj.load_state_dict(projections['out_proj'])
        return model.eval()

    def trainable_parameters(self) -> List[nn.Parameter]:
        """The parameters that train: the projections and the LM's (LoRA adapters only, for LoRA)."""
        return [p for p in self.parameters() if p.requires_grad]
