"""The README's and the documentation pages' code is the package's: the marked examples run, every block parses, and
every ``pyterrier_multiquery`` name they mention imports.

A ```` ```python ```` block preceded by the line ``<!-- test -->`` is runnable on the tiny data it builds itself (no
download, no shared data folder); the marked blocks of one page run in order in one namespace, in an empty
folder. Unmarked blocks show what needs a real collection or model; they are only parsed.
"""
import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / 'README.md'] + sorted((ROOT / 'docs').glob('*.md')) + [ROOT / 'notebooks' / 'README.md']
TEST_MARK = '<!-- test -->'
BLOCK = re.compile(r'^(?P<mark><!-- test -->\n)?```python\n(?P<code>.*?)^```', re.MULTILINE | re.DOTALL)
DOTTED = re.compile(r'\bpyterrier_multiquery(?:\.[A-Za-z_]\w*)+')
FROM_IMPORT = re.compile(r'^\s*from (pyterrier_multiquery[\w.]*) import (?:\(([^)]*)\)|([\w ,]+))', re.MULTILINE)


def python_blocks(page: Path):
    """``(runnable, code)`` of each python block of ``page``, in order."""
    return [(bool(m['mark']), m['code']) for m in BLOCK.finditer(page.read_text(encoding='utf-8'))]


def resolve(dotted: str):
    """The object a dotted name denotes: its longest importable module prefix, then attributes."""
    parts = dotted.split('.')
    for end in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:end]))
        except ModuleNotFoundError as e:
            if not '.'.join(parts[:end]).startswith(e.name or ''):
                raise   # a module that exists failed to import a dependency
            continue
        for attribute in parts[end:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(dotted)


def test_block_extraction_sees_marks_and_code(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('intro\n\n<!-- test -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n\n```bash\nls\n```\n')
    assert python_blocks(page) == [(True, 'x = 1\n'), (False, 'y = 2\n')]


def test_resolve_names_the_missing_part():
    assert resolve('pyterrier_multiquery.cdp.training.synthetic_pairs').__name__ == 'synthetic_pairs'
    with pytest.raises(AttributeError, match='no_such_function'):
        resolve('pyterrier_multiquery.cdp.training.no_such_function')


def test_every_page_has_runnable_examples():
    """Each page about a part of the library shows at least one example that runs (not the reports and overviews)."""
    without = {'README.md', 'architecture.md', 'experiments.md', 'notebooks.md', 'distributed.md', 'ecosystem.md'}
    for page in PAGES:
        if page.parent.name != 'notebooks' and page.name not in without:
            assert any(runnable for runnable, _ in python_blocks(page)), f'{page.name} has no {TEST_MARK} block'


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_parse(page):
    for i, (_, code) in enumerate(python_blocks(page)):
        try:
            ast.parse(code)
        except SyntaxError as e:
            pytest.fail(f'{page.name}, python block {i + 1}: {e}')


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_objects_import(page):
    """Every ``pyterrier_multiquery.X`` in the text, and every name imported from the package in a block."""
    text = page.read_text(encoding='utf-8')
    names = set(DOTTED.findall(text))
    for module, bracketed, inline in FROM_IMPORT.findall(text):
        names |= {f'{module}.{n.strip()}' for n in (bracketed or inline).replace('\n', ',').split(',') if n.strip()}
    missing = []
    for name in sorted(names):
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            missing.append(f'{name} ({type(e).__name__}: {e})')
    assert not missing, f'{page.name} names what does not exist: ' + '; '.join(missing)


@pytest.mark.parametrize('page', [p for p in PAGES if any(r for r, _ in python_blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {'__name__': f'docs_{page.stem}'}
    for i, (runnable, code) in enumerate(python_blocks(page)):
        if runnable:
            exec(compile(code, f'{page.name}, python block {i + 1}', 'exec'), namespace)


def test_the_api_reference_names_every_public_name_and_builds_without_warnings(tmp_path):
    """pt_docs/api.rst (pyterrier_dr's layout) documents every top-level name, and Sphinx builds it with warnings
    as errors (a docstring that is not valid reStructuredText fails here)."""
    import subprocess
    import sys

    import pyterrier_multiquery as pm
    root = Path(__file__).resolve().parents[1]
    api = (root / 'pyterrier_multiquery' / 'pt_docs' / 'api.rst').read_text()
    documented = set(re.findall(r'^\.\. auto\w+:: pyterrier_multiquery\.(\w+)$', api, re.M))
    assert set(pm.__all__) - documented == set()
    build = subprocess.run([sys.executable, '-m', 'sphinx', '-W', '-q', '-c', str(root / 'docs' / 'sphinx'), '-b',
                            'html', str(root / 'pyterrier_multiquery' / 'pt_docs'), str(tmp_path / 'html')],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    assert 'pyterrier_multiquery.AMERTrainer.fit' in (tmp_path / 'html' / 'api.html').read_text()
