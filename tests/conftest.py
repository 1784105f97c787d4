import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pyterrier as pt
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / 'notebooks'
EXPERIMENTS = Path(__file__).resolve().parents[1] / 'experiments'
CHECK = 'NOTEBOOK CHECK '  # what the cell execute_notebook adds prints before its JSON


@pytest.fixture(scope='module')
def experiment_script():
    """Loads a script of ``experiments/`` by name as a module, with ``experiments/`` on ``sys.path`` for the test
    module, as when the script runs from there (some import their neighbours)."""
    sys.path.insert(0, str(EXPERIMENTS))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f'{name}.py')
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    yield load
    sys.path.remove(str(EXPERIMENTS))


@pytest.fixture(scope='session')
def data_dir():
    """The shared collections beside the checkout; tests that read them are skipped where they are absent, and fail
    in CI (``CI=true``), where they must run."""
    path = Path(os.environ.get('PYTERRIER_MULTIQUERY_DATA', Path(__file__).resolve().parents[2] / 'shared' / 'data'))
    if not path.is_dir():
        message = f'shared data folder {str(path)!r} not found (set PYTERRIER_MULTIQUERY_DATA)'
        if os.environ.get('CI', '').lower() == 'true':
            pytest.fail(message + ': in CI the tests that read it must run')
        pytest.skip(message)
    return path


@pytest.fixture(scope='session', autouse=True)
def machine_caches(tmp_path_factory):
    """The caches a machine keeps outside any cache folder a job names, GGUF checkpoints' conversions and approximate
    search's calibrations, are folders of the session's (the notebooks' kernels and Ray's workers inherit them): a
    GGUF file is converted once per run, and nothing is written into the user's cache (every index a test builds has
    a new build id, so its calibrations would pile up there run after run)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('PYTERRIER_MULTIQUERY_GGUF', str(tmp_path_factory.mktemp('gguf')))
        patch.setenv('PYTERRIER_MULTIQUERY_CALIBRATIONS', str(tmp_path_factory.mktemp('calibrations')))
        yield


@pytest.fixture
def execute_notebook(data_dir, tmp_path, monkeypatch):
    """``execute(name, cache, check, limit_s)`` runs ``notebooks/NAME.ipynb`` top to bottom within ``limit_s`` seconds
    in all, with a last cell added that prints ``check`` (an expression) as JSON; returns the executed notebook and
    the printed value.

    It runs from an in-memory copy (the stored file is never written) with ``notebooks/`` as its working directory,
    as ``jupyter nbconvert --execute`` runs it, the shared data and the folder ``cache`` in its environment; the
    executed copy is written to the test's temporary folder.
    """
    nbformat = pytest.importorskip('nbformat')
    nbclient = pytest.importorskip('nbclient')
    pytest.importorskip('ipykernel')
    monkeypatch.setenv('PYTERRIER_MULTIQUERY_DATA', str(data_dir))

    def execute(name: str, cache: Path, check: str, limit_s: float):
        monkeypatch.setenv('PYTERRIER_MULTIQUERY_CACHE', str(cache))
        notebook = nbformat.read(NOTEBOOKS / f'{name}.ipynb', as_version=4)
        notebook.cells.append(nbformat.v4.new_code_cell(f'import json\nprint({CHECK!r} + json.dumps({check}))'))
        deadline = time.monotonic() + limit_s
        client = nbclient.NotebookClient(notebook, kernel_name='python3',
                                         timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
                                         resources={'metadata': {'path': str(NOTEBOOKS)}})
        try:
            client.execute()
        finally:
            nbformat.write(notebook, tmp_path / f'{name}.ipynb')
        printed = ''.join(o.get('text', '') for o in notebook.cells[-1].outputs if o['output_type'] == 'stream')
        return notebook, json.loads(printed[printed.index(CHECK) + len(CHECK):])
    return execute


@pytest.fixture(scope='session')
def save_tiny_bert(tmp_path_factory):
    """``save(words)``: a random 2-layer BERT (seed 0) with a word-level tokenizer over ``words`` and BERT's special
    tokens (a mask token included), saved as a checkpoint in a new folder; returns the folder."""
    def save(words):
        import torch
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import BertConfig, BertModel, PreTrainedTokenizerFast
        path = tmp_path_factory.mktemp('tiny') / 'bert'
        vocab = {w: i for i, w in enumerate(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + list(words))}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token='[UNK]'))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64)).save_pretrained(path)
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token='[PAD]', unk_token='[UNK]', cls_token='[CLS]',
                                sep_token='[SEP]', mask_token='[MASK]').save_pretrained(path)
        return path
    return save


@pytest.fixture(scope='session')
def triple_frames():
    """``make(triples)``: the ``(results, qrels, texts)`` whose hard-negative triples are the ``(query, positive,
    negative)`` ``triples``: question i's first stage ranks its negative n{i} above its relevant passage p{i}."""
    def make(triples):
        import pandas as pd
        results = pd.DataFrame([{'qid': str(i), 'query': q, 'docno': d, 'rank': r}
                                for i, (q, _, _) in enumerate(triples) for d, r in ((f'n{i}', 0), (f'p{i}', 1))])
        qrels = pd.DataFrame({'qid': [str(i) for i in range(len(triples))],
                              'docno': [f'p{i}' for i in range(len(triples))], 'label': 1})
        texts = {**{f'p{i}': t[1] for i, t in enumerate(triples)}, **{f'n{i}': t[2] for i, t in enumerate(triples)}}
        return results, qrels, texts
    return make


@pytest.fixture(scope='session')
def fine_tune(triple_frames):
    """``train(encoder, triples, **settings)``: one DiffRetrieverTrainer run on ``triples``; returns its history."""
    def train(encoder, triples, **settings):
        from pyterrier_multiquery.diffretriever.training import DiffRetrieverTrainer
        results, qrels, texts = triple_frames(triples)
        return DiffRetrieverTrainer(encoder, texts, verbose=False, **settings).fit(results, qrels)
    return train


@pytest.fixture
def declared_entry_points(monkeypatch):
    """``pt.utils.entry_points('pyterrier.artifact')`` as this checkout's pyproject.toml declares them (the installed
    metadata may be another checkout's)."""
    import tomllib
    declared = tomllib.loads((Path(__file__).resolve().parents[1] / 'pyproject.toml').read_text())
    declared = declared['project']['entry-points']['pyterrier.artifact']
    installed = pt.utils.entry_points

    def entry_points(group):
        if group == 'pyterrier.artifact':
            return tuple(importlib.metadata.EntryPoint(name, value, group) for name, value in declared.items())
        return installed(group)
    monkeypatch.setattr(pt.utils, 'entry_points', entry_points)


class FaultCases:
    """The generated cases the fault suite ran (``fault_cases()`` counts one) and the time of its tests."""

    def __init__(self):
        self.count, self.tests, self.seconds = 0, 0, 0.

    def __call__(self, cases: int = 1) -> None:
        self.count += cases


FAULT_CASES = FaultCases()


@pytest.fixture(scope='session')
def fault_cases():
    """Counts the cases of a fault-suite test; the total and the suite's time are printed at the end of the run."""
    return FAULT_CASES


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.perf_counter()
    yield
    if 'fault_cases' in getattr(item, 'fixturenames', ()):
        FAULT_CASES.tests += 1
        FAULT_CASES.seconds += time.perf_counter() - start


def pytest_terminal_summary(terminalreporter):
    if FAULT_CASES.tests:
        terminalreporter.write_line(f'fault suite: {FAULT_CASES.count} generated cases in {FAULT_CASES.tests} tests, '
                                    f'{FAULT_CASES.seconds:.1f} s')
