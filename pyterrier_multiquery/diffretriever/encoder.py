"""The DiffRetriever encoder: a retrieval prompt with K appended mask positions, read in one bidirectional pass."""
import inspect
import json
from pathlib import Path
from typing import List, Optional

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building
from pyterrier_multiquery._saved_model import SavedModel, check_saved, read_json, read_training, write_meta
from pyterrier_multiquery.diffretriever.prompts import layout
from pyterrier_multiquery.diffretriever.sparse import content_token_ids, sparse_weights, to_toks
from pyterrier_multiquery.multivector_encoder import Encoded, MultiVectorEncoder

CONFIG_NAME = 'diffretriever.json'
#: What the dense vectors are: the mask positions' states, or the text tokens' (:class:`DiffRetriever`'s ``vectors``).
VECTORS = ('masks', 'tokens')
#: Parts of the names of model classes with a vocabulary head: ``...ForMaskedLM``, ``...ForCausalLM``, LLaDA's
#: ``LLaDAModelLM``, DiffusionGemma's ``...ForBlockDiffusion``.
VOCAB_HEADS = ('LM', 'ForBlockDiffusion')


class MaskedBackbone:
    """A bidirectional model with a mask token: hidden states and vocabulary logits at given positions.

    ``head='lm'`` uses the model's own vocabulary head (a masked-LM head, a diffusion LM's head); ``head='tied'``
    (encoder-only checkpoints such as all-MiniLM-L6-v2) scores the last hidden state against the input embedding
    matrix. The mask token is ``mask_token_id``, else the tokenizer's, else the model config's (LLaDA names it
    there only).

    Most backbones read one sequence. A model whose forward also takes ``decoder_input_ids`` (DiffusionGemma: a
    prompt encoder whose cache a diffusion decoder attends to, bidirectionally over the prompt and its canvas)
    reads each row split at its first mask position: the prompt before it, the canvas from it on.
    """

    def __init__(self, model, tokenizer, head: str, mask_token_id: Optional[int] = None):
        if head not in ('lm', 'tied'):
            raise ValueError(f"head must be 'lm' or 'tied', got {head!r}")
        for source in (tokenizer, model.config):
            if mask_token_id is None:
                mask_token_id = getattr(source, 'mask_token_id', None)
        if mask_token_id is None:
            raise ValueError('the backbone needs a mask token: neither its tokenizer nor its config names one '
                             '(pass mask_token_id)')
        self.model, self.tokenizer, self.head, self.mask_token_id = model, tokenizer, head, mask_token_id
        bare = model.get_base_model() if hasattr(model, 'get_base_model') else model  # a peft model's
        self.canvas = 'decoder_input_ids' in inspect.signature(bare.forward).parameters

    @classmethod
    def load(cls, path: str, *, trust_remote_code: bool = False, head: Optional[str] = None,
             mask_token_id: Optional[int] = None):
        """Loads the model with its vocabulary head when the checkpoint has one (its ``architectures`` name a
        masked, causal or diffusion LM), else the bare model with a tied head.

        The head class is ``AutoModelForMaskedLM`` for the architectures it knows (BERT family, ModernBERT),
        else the class the checkpoint names (``DiffusionGemmaForBlockDiffusion``); remote-code diffusion LMs
        (LLaDA, Dream) load through ``AutoModel``, which returns their logits.
        """
        with requires('dense'):
            import transformers
            from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer
            from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        archs = config.architectures or []
        if head is None:
            head = 'lm' if trust_remote_code or any(h in a for a in archs for h in VOCAB_HEADS) else 'tied'
        if head == 'tied' or trust_remote_code:
            auto = AutoModel
        elif type(config) in MODEL_FOR_MASKED_LM_MAPPING:
            auto = AutoModelForMaskedLM
        else:
            named = [getattr(transformers, a) for a in archs if hasattr(transformers, a)]
            if not named:
                raise ValueError(f'{path!r} ({config.model_type}) has no masked-LM head in transformers and names '
                                 f'no transformers class in its architectures ({archs}); load it with head="tied"')
            auto = named[0]
        model = auto.from_pretrained(path, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, head, mask_token_id)

    def forward(self, input_ids, attention_mask):
        """``(hidden, logits)`` of the last layer at every position, each ``(B, L, ·)`` (one-sequence backbones)."""
        if self.canvas:
            raise ValueError(f'{type(self.model).__name__} reads a prompt and a canvas: use read() at positions')
        return self._outputs(None, False, input_ids=input_ids, attention_mask=attention_mask)

    def read(self, input_ids, attention_mask, positions, *, every_state: bool = False):
        """``(hidden (B, k, d), logits (B, k, V))`` at ``positions`` ``(B, k)`` of the right-padded rows, in one
        forward pass; with ``every_state``, ``hidden`` is that of every position, ``(B, L, d)`` (one-sequence
        backbones)."""
        with requires('dense'):
            import torch
        rows = torch.arange(len(input_ids), device=input_ids.device)[:, None]
        if not self.canvas:
            return self._outputs((rows, positions), every_state, input_ids=input_ids, attention_mask=attention_mask)
        if every_state:
            raise ValueError(f'{type(self.model).__name__} reads a prompt and a canvas: its text tokens have no '
                             "states beside the masks' (use vectors='masks')")
        start = positions[:, :1]
        return self._outputs((rows, positions - start), False, **self._split(input_ids, attention_mask, start))

    def _split(self, input_ids, attention_mask, start):
        """The model inputs of rows split at ``start`` ``(B, 1)``: the prompt left-padded (as the model generates),
        the canvas right-padded; canvas column ``j`` is row column ``start + j``."""
        with requires('dense'):
            import torch
        lengths = attention_mask.sum(1, keepdim=True)
        width, canvas_width = int(start.max()), int((lengths - start).max())
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        prompt_cols = torch.arange(width, device=input_ids.device) - width + start
        canvas_cols = torch.arange(canvas_width, device=input_ids.device) + start
        prompt_mask, canvas_mask = prompt_cols >= 0, canvas_cols < lengths
        prompt = input_ids.gather(1, prompt_cols.clamp(min=0)).masked_fill(~prompt_mask, pad)
        canvas = input_ids.gather(1, canvas_cols.clamp(max=input_ids.shape[1] - 1)).masked_fill(~canvas_mask, pad)
        return {'input_ids': prompt, 'attention_mask': prompt_mask.long(), 'decoder_input_ids': canvas,
                'decoder_attention_mask': torch.cat([prompt_mask, canvas_mask], 1)}

    def _outputs(self, at, every_state: bool, **inputs):
        """``(hidden, logits)`` of the last layer at the positions ``at`` (``(rows, columns)`` index tensors; None:
        every position), ``hidden`` at every position with ``every_state``: a tied head multiplies only the states
        at ``at`` by the vocabulary."""
        out = self.model(**inputs, output_hidden_states=True)
        states = out.hidden_states[-1]
        hidden = states if at is None else states[at]
        if self.head == 'tied':
            logits = hidden @ self.model.get_input_embeddings().weight.T
        else:
            logits = out.logits if at is None else out.logits[at]
        return (states if every_state else hidden), logits


def mask_representations(tokenizer, hidden, logits, content: List[List[int]]) -> Encoded:
    """The representations read at the mask (or generated) positions of a batch: ``(B, k, d)`` hidden states as
    L2-normalised float32 ``(k, d)`` arrays, ``(B, k, V)`` logits as ``max_k log(1 + ReLU)`` weights over each
    text's ``content`` token ids."""
    hidden = unit_rows(hidden)
    weights = sparse_weights(logits.float()).cpu().numpy()
    return Encoded(list(hidden), [to_toks(tokenizer, w, allowed) for w, allowed in zip(weights, content)])


class DiffRetriever(MultiVectorEncoder, SavedModel):
    """DiffRetriever (seed 004): K mask positions after the retrieval prompt; each position's last hidden state is
    a dense vector (``query_embs``/``doc_embs``, L2-normalised) and ``max_k log(1 + ReLU(logits_k))`` over the
    content words of the input is the sparse vector (``query_toks``/``toks``).

    ``steps`` > 1 is the iterative unmasking of Appendix A.1: after each of the first ``steps - 1`` passes the
    most confident still-masked positions (``ceil(K / steps)`` of them) take their argmax token, and the
    representations are read from the last pass.

    A saved DiffRetriever is a PyTerrier artifact (``diffretriever_model.hf``): ``pt.Artifact.load(path)`` loads it
    and ``to_hf``/``from_hf`` share it.
    """
    ARTIFACT_TYPE = 'diffretriever_model'
    sparse = True
    settings = ('k_query', 'k_doc', 'steps', 'max_length', 'vectors')
    query_settings = ('k_query',)

    def __init__(self, backbone: MaskedBackbone, *, k_query: int = 4, k_doc: int = 4, steps: int = 1,
                 max_length: int = 256, vectors: str = 'masks', batch_size: int = 16, text_field: str = 'text',
                 device: Optional[str] = None, verbose: bool = False):
        """
        Args:
            backbone: The bidirectional model.
            k_query: Mask positions (vectors) per query.
            k_doc: Mask positions (vectors) per document.
            steps: Forward passes (iterative unmasking when more than 1).
            max_length: Text tokens read at most (the prompt comes on top).
            vectors: The dense vectors: ``'masks'``, the K mask positions' states (the paper), or ``'tokens'``, the
                states of the text's own tokens in the same pass (one vector per token, ColBERT-style), for
                backbones whose mask positions were never trained to summarise a text (all-MiniLM-L6-v2 zero-shot:
                docs/diffretriever.md). The sparse weights come from the masks either way.
            batch_size: Texts per forward pass.
            text_field: The column holding the document text.
            device: Torch device (default: CUDA when available).
            verbose: Whether to show progress bars.
        """
        for name, value in (('k_query', k_query), ('k_doc', k_doc), ('steps', steps)):
            if value < 1:
                raise ValueError(f'{name} must be at least 1, got {value}')
        if vectors not in VECTORS:
            raise ValueError(f'vectors must be one of {VECTORS}, got {vectors!r}')
        self.backbone = backbone
        self.path = SavedModel.NO_PATH
        self.k_query, self.k_doc, self.steps, self.max_length, self.vectors = k_query, k_doc, steps, max_length, vectors
        super().__init__(batch_size=batch_size, text_field=text_field, verbose=verbose, device=device)

    @property
    def module(self):
        return self.backbone.model

    @classmethod
    def from_pretrained(cls, path: str, k_query: Optional[int] = None, k_doc: Optional[int] = None, *,
                        trust_remote_code: bool = False, head: Optional[str] = None,
                        mask_token_id: Optional[int] = None, **kwargs) -> 'DiffRetriever':
        """Loads any bidirectional model with a mask token (masked LMs such as BERT or ModernBERT, DiffusionGemma,
        LLaDA/Dream with ``trust_remote_code``, encoder-only checkpoints with a tied head), or a checkpoint written by
        :meth:`save_pretrained` (its files checked against its ``pt_meta.json``).

        ``vectors`` (in ``kwargs``) defaults to what a saved checkpoint was saved with, else ``'tokens'`` for a tied
        head (an encoder-only checkpoint such as all-MiniLM-L6-v2, whose mask positions no objective ever trained:
        read zero-shot they collapse, nDCG@10 0.00 on SciFact) and ``'masks'`` otherwise. Fine-tuning
        (:class:`~pyterrier_multiquery.diffretriever.training.DiffRetrieverTrainer`) trains the mask positions: load
        with ``vectors='masks'`` for it."""
        saved = Path(path).is_dir() and check_saved(path, cls, CONFIG_NAME)
        config = read_json(Path(path) / CONFIG_NAME) if saved else {}
        head = head or config.get('head')
        mask_token_id = config.get('mask_token_id') if mask_token_id is None else mask_token_id
        backbone = MaskedBackbone.load(str(path), trust_remote_code=trust_remote_code, head=head,
                                       mask_token_id=mask_token_id)
        if kwargs.get('vectors') is None:  # saved: as saved; a tied head's mask positions were never trained
            kwargs['vectors'] = config.get('vectors', 'tokens' if backbone.head == 'tied' else 'masks')
        encoder = cls(backbone, k_query=config.get('k_query', 4) if k_query is None else k_query,
                      k_doc=config.get('k_doc', 4) if k_doc is None else k_doc, **kwargs)
        if saved:
            encoder.path = Path(path)
            encoder.training_record = read_training(path)
        return encoder

    def save_pretrained(self, path) -> None:
        """Writes the model (LoRA adapters merged), tokenizer and K settings, atomically."""
        from pyterrier_multiquery.diffretriever.lora import merge_lora
        model = self.backbone.model = merge_lora(self.backbone.model)
        with building(path) as tmp:
            model.save_pretrained(tmp)
            self.backbone.tokenizer.save_pretrained(tmp)
            (tmp / CONFIG_NAME).write_text(json.dumps({'k_query': self.k_query, 'k_doc': self.k_doc,
                                                       'vectors': self.vectors, 'head': self.backbone.head,
                                                       'mask_token_id': self.backbone.mask_token_id}))
            write_meta(tmp, self)
        self.path = Path(path)

    def with_k(self, k_query: Optional[int] = None, k_doc: Optional[int] = None) -> 'DiffRetriever':
        """The same backbone with other budgets."""
        return DiffRetriever(self.backbone, k_query=self.k_query if k_query is None else k_query,
                             k_doc=self.k_doc if k_doc is None else k_doc,
                             steps=self.steps, max_length=self.max_length, vectors=self.vectors,
                             batch_size=self.batch_size,
                             text_field=self.text_field, device=self.device, verbose=self.verbose)

    def batch(self, texts: List[str], k: int, side: str):
        """Input tensors for ``texts``: ``(input_ids, attention_mask, mask_positions (B, k), content ids per text,
        (start, end) of each text's tokens)``."""
        with requires('dense'):
            import torch
        tok = self.backbone.tokenizer
        rows, positions, content, spans = [], [], [], []
        for text in texts:
            text_ids = tok(text, add_special_tokens=False, truncation=True, max_length=self.max_length)['input_ids']
            ids, pos, start = layout(tok, text_ids, k, side, self.backbone.mask_token_id)
            rows.append(ids)
            positions.append(pos)
            content.append(content_token_ids(tok, text_ids))
            spans.append((start, start + len(text_ids)))
        width = max(len(r) for r in rows)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, :len(r)] = torch.tensor(r)
            attention[i, :len(r)] = 1
        positions = torch.tensor(positions, device=self.device)
        return input_ids.to(self.device), attention.to(self.device), positions, content, spans

    def represent(self, input_ids, attention_mask, positions, *, every_state: bool = False):
        """Hidden states ``(B, k, d)`` and logits ``(B, k, V)`` at the mask positions, after ``steps`` passes (with
        ``every_state``, the hidden states of every position, ``(B, L, d)``, from the last pass)."""
        with requires('dense'):
            import torch
        input_ids = input_ids.clone()
        rows = torch.arange(len(input_ids), device=input_ids.device)[:, None]
        k = positions.shape[1]
        per_step = -(-k // self.steps)
        masked = torch.ones_like(positions, dtype=torch.bool)
        for step in range(self.steps):
            last = step == self.steps - 1
            hidden, logits = self.backbone.read(input_ids, attention_mask, positions, every_state=every_state and last)
            if last:
                return hidden, logits
            confidence, tokens = logits.softmax(-1).max(-1)
            confidence = confidence.masked_fill(~masked, -1.)
            chosen = confidence.topk(min(per_step, k), dim=1).indices
            chosen_mask = torch.zeros_like(masked).scatter_(1, chosen, True) & masked
            input_ids[rows.expand_as(positions)[chosen_mask], positions[chosen_mask]] = tokens[chosen_mask]
            masked &= ~chosen_mask

    def encode_query_batch(self, texts: List[str]) -> Encoded:
        return self._encode_batch(texts, self.k_query, 'query')

    def encode_doc_batch(self, texts: List[str]) -> Encoded:
        return self._encode_batch(texts, self.k_doc, 'doc')

    def _encode_batch(self, texts: List[str], k: int, side: str) -> Encoded:
        input_ids, attention, positions, content, spans = self.batch(texts, k, side)
        if self.vectors == 'masks':
            hidden, logits = self.represent(input_ids, attention, positions)
            return mask_representations(self.backbone.tokenizer, hidden, logits, content)
        with requires('dense'):
            import torch
        states, logits = self.represent(input_ids, attention, positions, every_state=True)
        rows = torch.arange(len(states), device=states.device)[:, None]
        encoded = mask_representations(self.backbone.tokenizer, states[rows, positions], logits, content)
        embs = [unit_rows(states[i, start:end]) if end > start else masks  # a text of no tokens: its masks' states
                for i, ((start, end), masks) in enumerate(zip(spans, encoded.embs))]
        return encoded._replace(embs=embs)


def unit_rows(hidden):
    """``(..., d)`` hidden states as L2-normalised float32 numpy rows."""
    with requires('dense'):
        import torch
    return torch.nn.functional.normalize(hidden.float(), dim=-1).cpu().numpy()
