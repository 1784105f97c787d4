"""The paper's baselines on DiffRetriever's interface: DiffEmbed (mean-pooled hidden states, no prompt) and
PromptReps (the same prompt on an autoregressive LM, N tokens generated one at a time)."""
from typing import List, Optional

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._device import resolve_device
from pyterrier_multiquery.diffretriever.encoder import MaskedBackbone, _Encoder
from pyterrier_multiquery.diffretriever.prompts import prompt_ids
from pyterrier_multiquery.diffretriever.sparse import content_token_ids, sparse_weights, to_toks


class DiffEmbed:
    """DiffEmbed: the attention-masked mean of the last hidden states of the bare text, L2-normalised, as a single
    row of ``query_embs``/``doc_embs`` (sparse weights are not part of this baseline: ``toks`` is empty)."""

    def __init__(self, backbone: MaskedBackbone, *, max_length: int = 256, batch_size: int = 16,
                 device: Optional[str] = None, verbose: bool = False):
        self.backbone, self.max_length, self.batch_size, self.verbose = backbone, max_length, batch_size, verbose
        self.device = resolve_device(device)
        self.backbone.model.to(self.device).eval()

    @classmethod
    def from_pretrained(cls, path: str, *, trust_remote_code: bool = False, **kwargs) -> 'DiffEmbed':
        return cls(MaskedBackbone.load(str(path), trust_remote_code=trust_remote_code), **kwargs)

    def pooled(self, texts: List[str]):
        """``(B, d)`` normalised mean-pooled hidden states, with gradients when enabled."""
        import torch
        batch = self.backbone.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                        return_tensors='pt').to(self.device)
        hidden, _ = self.backbone.forward(batch['input_ids'], batch['attention_mask'])
        mask = batch['attention_mask'].unsqueeze(-1).to(hidden.dtype)
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    def encode(self, texts: List[str], side: str):
        import torch
        embs = []
        starts = range(0, len(texts), self.batch_size)
        if self.verbose:
            starts = pt.tqdm(starts, desc=f'DiffEmbed {side}s', unit='batch')
        with torch.no_grad():
            for start in starts:
                embs.extend(v[None].astype(np.float32) for v in self.pooled(texts[start:start + self.batch_size]).float().cpu().numpy())
        return embs, [{} for _ in texts]

    def query_encoder(self) -> pt.Transformer:
        return _Encoder(self, 'query')

    def doc_encoder(self) -> pt.Transformer:
        return _Encoder(self, 'doc')

    def __repr__(self):
        return f'DiffEmbed({type(self.backbone.model).__name__})'


class PromptReps:
    """PromptReps: the retrieval prompt on a causal LM, greedy generation of ``n`` tokens one step at a time (KV
    cache); each step's last hidden state is a dense vector and its logits feed the sparse vector
    (``max_steps log(1 + ReLU)`` on the input's content words), as in DiffRetriever."""

    def __init__(self, model, tokenizer, *, n_query: int = 4, n_doc: int = 4, max_length: int = 256,
                 device: Optional[str] = None, verbose: bool = False):
        self.model, self.tokenizer = model, tokenizer
        self.n_query, self.n_doc, self.max_length, self.verbose = n_query, n_doc, max_length, verbose
        self.device = resolve_device(device)
        self.model.to(self.device).eval()

    @classmethod
    def from_pretrained(cls, path: str, *, gguf_file: Optional[str] = None, **kwargs) -> 'PromptReps':
        from transformers import AutoModelForCausalLM, AutoTokenizer
        extra = {'gguf_file': gguf_file} if gguf_file else {}
        return cls(AutoModelForCausalLM.from_pretrained(path, **extra), AutoTokenizer.from_pretrained(path, **extra),
                   **kwargs)

    def generate(self, text: str, n: int, side: str):
        """``(hidden (n, d), logits (n, V), content ids)`` for one text, ``n`` sequential forward steps."""
        import torch
        text_ids = self.tokenizer(text, add_special_tokens=False, truncation=True, max_length=self.max_length)['input_ids']
        ids = torch.tensor([prompt_ids(self.tokenizer, text_ids, n, side)], device=self.device)
        hidden, logits, past = [], [], None
        for _ in range(n):
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True, output_hidden_states=True)
            past = out.past_key_values
            hidden.append(out.hidden_states[-1][0, -1])
            logits.append(out.logits[0, -1])
            ids = out.logits[:, -1].argmax(-1, keepdim=True)
        return torch.stack(hidden), torch.stack(logits), content_token_ids(self.tokenizer, text_ids)

    def encode(self, texts: List[str], side: str):
        import torch
        n = self.n_query if side == 'query' else self.n_doc
        embs, toks = [], []
        with torch.no_grad():
            for text in (pt.tqdm(texts, desc=f'PromptReps {side}s') if self.verbose else texts):
                hidden, logits, allowed = self.generate(text, n, side)
                embs.append(torch.nn.functional.normalize(hidden.float(), dim=-1).cpu().numpy())
                toks.append(to_toks(self.tokenizer, sparse_weights(logits.float()).cpu().numpy(), allowed))
        return embs, toks

    def query_encoder(self) -> pt.Transformer:
        return _Encoder(self, 'query')

    def doc_encoder(self) -> pt.Transformer:
        return _Encoder(self, 'doc')

    def __repr__(self):
        return f'PromptReps({type(self.model).__name__}, n_query={self.n_query}, n_doc={self.n_doc})'
