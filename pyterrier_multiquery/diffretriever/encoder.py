"""The DiffRetriever encoder: a retrieval prompt with K appended mask positions, read in one bidirectional pass."""
import json
from pathlib import Path
from typing import List, Optional

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building
from pyterrier_multiquery._saved_model import SavedModel, check_saved, read_json, write_meta
from pyterrier_multiquery.diffretriever.prompts import layout
from pyterrier_multiquery.diffretriever.sparse import content_token_ids, sparse_weights, to_toks
from pyterrier_multiquery.multivector_encoder import Encoded, MultiVectorEncoder

CONFIG_NAME = 'diffretriever.json'


class MaskedBackbone:
    """A bidirectional model with a mask token: hidden states and vocabulary logits at given positions.

    ``head='lm'`` uses the model's own masked-LM head; ``head='tied'`` (encoder-only checkpoints such as
    all-MiniLM-L6-v2) scores the last hidden state against the input embedding matrix.
    """

    def __init__(self, model, tokenizer, head: str):
        if head not in ('lm', 'tied'):
            raise ValueError(f"head must be 'lm' or 'tied', got {head!r}")
        if tokenizer.mask_token_id is None:
            raise ValueError('the backbone needs a mask token; its tokenizer has none')
        self.model, self.tokenizer, self.head = model, tokenizer, head

    @classmethod
    def load(cls, path: str, *, trust_remote_code: bool = False, head: Optional[str] = None):
        """Loads ``AutoModelForMaskedLM`` when the checkpoint has an LM head (its ``architectures`` name one), else
        ``AutoModel`` with a tied head; remote-code diffusion LMs (LLaDA, Dream) load through ``AutoModel``, which
        returns their logits."""
        with requires('dense'):
            from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        if head is None:
            archs = config.architectures or []
            head = 'lm' if trust_remote_code or any('LM' in a for a in archs) else 'tied'
        auto = AutoModelForMaskedLM if head == 'lm' and not trust_remote_code else AutoModel
        model = auto.from_pretrained(path, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, head)

    def forward(self, input_ids, attention_mask):
        """``(hidden, logits)`` of the last layer, each ``(B, L, ·)``."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        hidden = out.hidden_states[-1]
        if self.head == 'tied':
            return hidden, hidden @ self.model.get_input_embeddings().weight.T
        return hidden, out.logits


def mask_representations(tokenizer, hidden, logits, content: List[List[int]]) -> Encoded:
    """The representations read at the mask (or generated) positions of a batch: ``(B, k, d)`` hidden states as
    L2-normalised float32 ``(k, d)`` arrays, ``(B, k, V)`` logits as ``max_k log(1 + ReLU)`` weights over each
    text's ``content`` token ids."""
    with requires('dense'):
        import torch
    hidden = torch.nn.functional.normalize(hidden.float(), dim=-1).cpu().numpy()
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
    settings = ('k_query', 'k_doc', 'steps', 'max_length')

    def __init__(self, backbone: MaskedBackbone, *, k_query: int = 4, k_doc: int = 4, steps: int = 1,
                 max_length: int = 256, batch_size: int = 16, text_field: str = 'text', device: Optional[str] = None,
                 verbose: bool = False):
        """
        Args:
            backbone: The bidirectional model.
            k_query: Mask positions (vectors) per query.
            k_doc: Mask positions (vectors) per document.
            steps: Forward passes (iterative unmasking when more than 1).
            max_length: Text tokens read at most (the prompt comes on top).
            batch_size: Texts per forward pass.
            text_field: The column holding the document text.
            device: Torch device (default: CUDA when available).
            verbose: Whether to show progress bars.
        """
        for name, value in (('k_query', k_query), ('k_doc', k_doc), ('steps', steps)):
            if value < 1:
                raise ValueError(f'{name} must be at least 1, got {value}')
        self.backbone = backbone
        self.path = SavedModel.NO_PATH
        self.k_query, self.k_doc, self.steps, self.max_length = k_query, k_doc, steps, max_length
        super().__init__(batch_size=batch_size, text_field=text_field, verbose=verbose, device=device)

    @property
    def module(self):
        return self.backbone.model

    @classmethod
    def from_pretrained(cls, path: str, k_query: Optional[int] = None, k_doc: Optional[int] = None, *,
                        trust_remote_code: bool = False, head: Optional[str] = None, **kwargs) -> 'DiffRetriever':
        """Loads any bidirectional model with a mask token (masked LMs, LLaDA/Dream with ``trust_remote_code``,
        encoder-only checkpoints with a tied head), or a checkpoint written by :meth:`save_pretrained` (its files
        checked against its ``pt_meta.json``)."""
        saved = Path(path).is_dir() and check_saved(path, cls, CONFIG_NAME)
        config = read_json(Path(path) / CONFIG_NAME) if saved else {}
        head = head or config.get('head')
        backbone = MaskedBackbone.load(str(path), trust_remote_code=trust_remote_code, head=head)
        encoder = cls(backbone, k_query=k_query or config.get('k_query', 4), k_doc=k_doc or config.get('k_doc', 4),
                      **kwargs)
        if saved:
            encoder.path = Path(path)
        return encoder

    def save_pretrained(self, path) -> None:
        """Writes the model (LoRA adapters merged), tokenizer and K settings, atomically."""
        model = self.backbone.model
        if hasattr(model, 'merge_and_unload'):
            model = model.merge_and_unload()
            self.backbone.model = model
        with building(path) as tmp:
            model.save_pretrained(tmp)
            self.backbone.tokenizer.save_pretrained(tmp)
            (tmp / CONFIG_NAME).write_text(json.dumps({'k_query': self.k_query, 'k_doc': self.k_doc,
                                                       'head': self.backbone.head}))
            write_meta(tmp, type(self))
        self.path = Path(path)

    def with_k(self, k_query: Optional[int] = None, k_doc: Optional[int] = None) -> 'DiffRetriever':
        """The same backbone with other budgets."""
        return DiffRetriever(self.backbone, k_query=k_query or self.k_query, k_doc=k_doc or self.k_doc,
                             steps=self.steps, max_length=self.max_length, batch_size=self.batch_size,
                             text_field=self.text_field, device=self.device, verbose=self.verbose)

    def batch(self, texts: List[str], k: int, side: str):
        """Input tensors for ``texts``: ``(input_ids, attention_mask, mask_positions (B, k), content ids per text)``."""
        with requires('dense'):
            import torch
        tok = self.backbone.tokenizer
        rows, positions, content = [], [], []
        for text in texts:
            text_ids = tok(text, add_special_tokens=False, truncation=True, max_length=self.max_length)['input_ids']
            ids, pos = layout(tok, text_ids, k, side, tok.mask_token_id)
            rows.append(ids)
            positions.append(pos)
            content.append(content_token_ids(tok, text_ids))
        width = max(len(r) for r in rows)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, :len(r)] = torch.tensor(r)
            attention[i, :len(r)] = 1
        positions = torch.tensor(positions, device=self.device)
        return input_ids.to(self.device), attention.to(self.device), positions, content

    def represent(self, input_ids, attention_mask, positions):
        """Hidden states ``(B, k, d)`` and logits ``(B, k, V)`` at the mask positions, after ``steps`` passes."""
        with requires('dense'):
            import torch
        input_ids = input_ids.clone()
        rows = torch.arange(len(input_ids), device=input_ids.device)[:, None]
        k = positions.shape[1]
        per_step = -(-k // self.steps)
        masked = torch.ones_like(positions, dtype=torch.bool)
        for step in range(self.steps):
            hidden, logits = self.backbone.forward(input_ids, attention_mask)
            hidden, logits = hidden[rows, positions], logits[rows, positions]
            if step == self.steps - 1:
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
        input_ids, attention, positions, content = self.batch(texts, k, side)
        hidden, logits = self.represent(input_ids, attention, positions)
        return mask_representations(self.backbone.tokenizer, hidden, logits, content)
