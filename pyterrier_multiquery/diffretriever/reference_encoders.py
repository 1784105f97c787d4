"""The paper's baselines on DiffRetriever's interface: DiffEmbed (mean-pooled hidden states, no prompt) and
PromptReps (the same prompt on an autoregressive LM, N tokens generated one at a time)."""
from typing import List, Optional

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.diffretriever.encoder import MaskedBackbone, mask_representations
from pyterrier_multiquery.diffretriever.prompts import prompt_ids
from pyterrier_multiquery.diffretriever.sparse import content_token_ids
from pyterrier_multiquery.multivector_encoder import Encoded, MultiVectorEncoder


class DiffEmbed(MultiVectorEncoder):
    """DiffEmbed: the attention-masked mean of the last hidden states of the bare text, L2-normalised, as a single
    row of ``query_embs``/``doc_embs`` (a dense-only baseline: no sparse columns). Queries and documents are
    encoded alike."""
    settings = ('max_length',)

    def __init__(self, backbone: MaskedBackbone, *, max_length: int = 256, batch_size: int = 16,
                 text_field: str = 'text', device: Optional[str] = None, verbose: bool = False):
        """
        Args:
            backbone: The bidirectional model.
            max_length: Tokens read at most.
            batch_size: Texts per forward pass.
            text_field: The column holding the document text.
            device: Torch device (default: CUDA when available).
            verbose: Whether to show progress bars.
        """
        self.backbone, self.max_length = backbone, max_length
        super().__init__(batch_size=batch_size, text_field=text_field, verbose=verbose, device=device)

    @property
    def module(self):
        return self.backbone.model

    @classmethod
    def from_pretrained(cls, path: str, *, trust_remote_code: bool = False, **kwargs) -> 'DiffEmbed':
        return cls(MaskedBackbone.load(str(path), trust_remote_code=trust_remote_code), **kwargs)

    def pooled(self, texts: List[str]):
        """``(B, d)`` normalised mean-pooled hidden states, with gradients when enabled."""
        with requires('dense'):
            import torch
        batch = self.backbone.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                        return_tensors='pt').to(self.device)
        hidden, _ = self.backbone.forward(batch['input_ids'], batch['attention_mask'])
        mask = batch['attention_mask'].unsqueeze(-1).to(hidden.dtype)
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    def encode_query_batch(self, texts: List[str]) -> Encoded:
        return Encoded([v[None] for v in self.pooled(texts).float().cpu().numpy()])

    encode_doc_batch = encode_query_batch


class PromptReps(MultiVectorEncoder):
    """PromptReps: the retrieval prompt on a causal LM, greedy generation of ``n`` tokens one step at a time (KV
    cache); each step's last hidden state is a dense vector and its logits feed the sparse vector
    (``max_steps log(1 + ReLU)`` on the input's content words), as in DiffRetriever.

    Generation runs one text at a time (no padding, as in the paper's latency comparison); ``batch_size`` sets how
    many texts one :meth:`encode_query_batch` call takes.
    """
    sparse = True
    settings = ('n_query', 'n_doc', 'max_length')
    query_settings = ('n_query',)

    def __init__(self, model, tokenizer, *, n_query: int = 4, n_doc: int = 4, max_length: int = 256,
                 batch_size: int = 16, text_field: str = 'text', device: Optional[str] = None, verbose: bool = False):
        """
        Args:
            model: A Hugging Face causal LM.
            tokenizer: Its tokenizer.
            n_query: Tokens generated (vectors) per query.
            n_doc: Tokens generated (vectors) per document.
            max_length: Text tokens read at most (the prompt comes on top).
            batch_size: Texts per :meth:`encode_query_batch`/:meth:`encode_doc_batch` call.
            text_field: The column holding the document text.
            device: Torch device (default: CUDA when available).
            verbose: Whether to show progress bars.
        """
        for name, value in (('n_query', n_query), ('n_doc', n_doc)):
            if value < 1:
                raise ValueError(f'{name} must be at least 1, got {value}')
        self.model, self.tokenizer = model, tokenizer
        self.n_query, self.n_doc, self.max_length = n_query, n_doc, max_length
        super().__init__(batch_size=batch_size, text_field=text_field, verbose=verbose, device=device)

    @property
    def module(self):
        return self.model

    @classmethod
    def from_pretrained(cls, path: str, *, gguf_file: Optional[str] = None, **kwargs) -> 'PromptReps':
        with requires('dense'):
            from transformers import AutoModelForCausalLM, AutoTokenizer
        extra = {'gguf_file': gguf_file} if gguf_file else {}
        return cls(AutoModelForCausalLM.from_pretrained(path, **extra), AutoTokenizer.from_pretrained(path, **extra),
                   **kwargs)

    def generate(self, text: str, n: int, side: str):
        """``(hidden (n, d), logits (n, V), content ids)`` for one text, ``n`` sequential forward steps."""
        with requires('dense'):
            import torch
        text_ids = self.tokenizer(text, add_special_tokens=False, truncation=True,
                                  max_length=self.max_length)['input_ids']
        ids = torch.tensor([prompt_ids(self.tokenizer, text_ids, n, side)], device=self.device)
        hidden, logits, past = [], [], None
        for _ in range(n):
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True, output_hidden_states=True)
            past = out.past_key_values
            hidden.append(out.hidden_states[-1][0, -1])
            logits.append(out.logits[0, -1])
            ids = out.logits[:, -1].argmax(-1, keepdim=True)
        return torch.stack(hidden), torch.stack(logits), content_token_ids(self.tokenizer, text_ids)

    def encode_query_batch(self, texts: List[str]) -> Encoded:
        return self._encode_batch(texts, self.n_query, 'query')

    def encode_doc_batch(self, texts: List[str]) -> Encoded:
        return self._encode_batch(texts, self.n_doc, 'doc')

    def _encode_batch(self, texts: List[str], n: int, side: str) -> Encoded:
        with requires('dense'):
            import torch
        hidden, logits, content = zip(*(self.generate(text, n, side) for text in texts))
        return mask_representations(self.tokenizer, torch.stack(hidden), torch.stack(logits), list(content))
