"""Quiet runs: library logs and warnings that do not concern the user of the main job stay hidden."""
import contextlib
import logging
import os
import warnings
from typing import Iterator

LOGGERS = ('transformers', 'sentence_transformers', 'pyterrier', 'pyterrier_dr', 'pyterrier_pisa', 'faiss',
           'peft', 'httpx')


@contextlib.contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """Within the block, third-party loggers show errors only, warnings are ignored and transformers shows no
    loading bars (when ``enabled``)."""
    if not enabled:
        yield
        return
    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    try:
        for name in LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            with _transformers_quiet():
                yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """transformers' own verbosity and loading bars, set to errors only within the block (when it is installed)."""
    try:
        from transformers.utils import logging as hf_logging
    except ModuleNotFoundError:
        yield
        return
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


@contextlib.contextmanager
def native_output_hidden(enabled: bool = True) -> Iterator[None]:
    """Within the block, what native code writes to the process's stdout and stderr goes to the null device."""
    if not enabled:
        yield
        return
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)
