"""GGUF checkpoints converted once into transformers' own format, so that later loads skip the GGUF reader."""
import contextlib
import hashlib
import importlib.metadata
import io
import os
from pathlib import Path

from pyterrier_multiquery import _files
from pyterrier_multiquery._extras import requires


def gguf_dir() -> Path:
    """Where this machine keeps converted GGUF checkpoints: ``$PYTERRIER_MULTIQUERY_GGUF``, else
    ``~/.cache/pyterrier_multiquery/gguf``."""
    return Path(os.environ.get('PYTERRIER_MULTIQUERY_GGUF', Path.home() / '.cache' / 'pyterrier_multiquery' / 'gguf'))


def converted_gguf(folder: str, gguf_file: str, *, verbose: bool = False) -> Path:
    """The folder of ``folder/gguf_file`` converted into a safetensors checkpoint with its tokenizer, converting it
    on first use.

    transformers reads a GGUF file three times per load (tokenizer, configuration, weights) and dequantises it each
    time; the converted folder holds the dequantised float32 weights, so a load of it gives the same model (the same
    weights, tokens and generation settings) in a fraction of the time. It is kept under :func:`gguf_dir`, named by
    the file's stem and a key of its bytes and the transformers and gguf versions that converted it, and written
    under a temporary name, so that a conversion that fails or is killed leaves none.

    Args:
        folder: The folder holding the GGUF file.
        gguf_file: The GGUF file's name in ``folder``.
        verbose: Whether to show transformers' bars while it converts.
    """
    source = Path(folder) / gguf_file
    if not source.is_file():
        raise FileNotFoundError(f'{folder} has no GGUF file {gguf_file!r}')
    versions = [importlib.metadata.version(package) for package in ('transformers', 'gguf')]
    key = hashlib.sha256('|'.join([_files.file_sha256(source), *versions]).encode()).hexdigest()[:16]
    target = gguf_dir() / f'{source.stem}-{key}'
    with _files.exclusive_lock(target):
        if not target.is_dir():
            _convert(folder, gguf_file, target, verbose)
    return target


def _convert(folder: str, gguf_file: str, target: Path, verbose: bool) -> None:
    with requires('generation'):
        from transformers import AutoModelForCausalLM, AutoTokenizer
    # transformers shows bars while it reads and writes, whatever its progress-bar setting
    with contextlib.nullcontext() if verbose else contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
        del quantised.config.quantization_config  # the weights are dequantised: nothing is left quantised
        # a model loaded from GGUF refuses to be saved; the same weights in a model made from its configuration do not
        model = AutoModelForCausalLM.from_config(quantised.config)
        model.load_state_dict(quantised.state_dict())
        model.generation_config = quantised.generation_config
        with _files.building(target) as tmp:
            tokenizer.save_pretrained(tmp)
            model.save_pretrained(tmp)
