"""The harness's cache: an entry is reused only while everything that made it is unchanged, and never when damaged."""
import json
import multiprocessing
import shutil
import time

import pandas as pd
import pytest

from pyterrier_multiquery.experiment import cache as cache_module
from pyterrier_multiquery.experiment.cache import (Cache, code_fingerprint, data_fingerprint, entry_key,
                                                   script_fingerprint)

TOPICS = pd.DataFrame({'qid': ['1', '2'], 'query': ['who won', 'where is it']})
QRELS = pd.DataFrame({'qid': ['1', '2'], 'docno': ['d1', 'd2'], 'label': [1, 1]})


class Builds:
    """A build function that writes one file and counts its calls."""

    def __init__(self, content='model'):
        self.count, self.content = 0, content

    def __call__(self, path):
        self.count += 1
        path.mkdir()
        (path / 'weights.bin').write_text(self.content)


def material(**changes):
    base = {'data': data_fingerprint(TOPICS, QRELS), 'settings': {'epochs': 2, 'seed': 0},
            'code': 'code-1', 'first_stage': 'minilm-1'}
    return {**base, **changes}


def test_an_unchanged_entry_is_built_once_and_reused(tmp_path):
    build = Builds()
    first = Cache(tmp_path).get('amer', build, **material())
    again = Cache(tmp_path).get('amer', build, **material())
    assert first == again and build.count == 1
    assert (first / 'weights.bin').read_text() == 'model'
    manifest = json.loads((first.parent / 'manifest.json').read_text())
    assert manifest['key']['settings'] == {'epochs': 2, 'seed': 0} and manifest['digest'] == entry_key(first)


@pytest.mark.parametrize('change', [
    {'data': data_fingerprint(TOPICS.assign(query=['who won', 'where is it now']), QRELS)},   # a question's text
    {'data': data_fingerprint(TOPICS, QRELS.assign(label=[1, 2]))},                         # a judgement
    {'settings': {'epochs': 3, 'seed': 0}},
    {'settings': {'epochs': 2, 'seed': 1}},
    {'code': 'code-2'},
    {'first_stage': 'minilm-2'},
])
def test_a_change_of_what_made_an_entry_builds_a_new_one(tmp_path, change):
    build = Builds()
    old = Cache(tmp_path).get('amer', build, **material())
    new = Cache(tmp_path).get('amer', build, **material(**change))
    assert build.count == 2 and new != old


def test_a_new_package_or_library_version_builds_a_new_entry(tmp_path, monkeypatch):
    import pyterrier_multiquery
    build = Builds()
    old = Cache(tmp_path).get('amer', build, **material())
    monkeypatch.setattr(pyterrier_multiquery, '__version__', '99.0')
    assert Cache(tmp_path).get('amer', build, **material()) != old and build.count == 2
    monkeypatch.undo()
    versions = cache_module.library_versions()
    monkeypatch.setattr(cache_module, 'library_versions', lambda: {**versions, 'torch': '0.0.1'})
    assert Cache(tmp_path).get('amer', build, **material()) != old and build.count == 3


#: The package's third-party imports whose versions change no cached entry, and why.
NOT_KEYED = {'matplotlib': 'plots', 'more-itertools': 'batching', 'requests': 'HTTP of the OpenAI-compatible backend',
             'sacrebleu': "Self-BLEU, computed on each run, never cached", 'ray': "the distributed index's runtime",
             'triton': "the GPU kernel, whose rankings equal the CPU's", 'pyserini': 'Lucene, outside the cache'}


def test_every_library_the_package_computes_with_is_in_the_cache_key():
    """A library imported anywhere in the package either keys the cache or is named in NOT_KEYED: a new import
    that changes what an index or model holds cannot be left out of the key unnoticed."""
    import ast
    import importlib.metadata
    import sys
    distributions = importlib.metadata.packages_distributions()
    imported = set()
    for source in cache_module.PACKAGE_DIR.rglob('*.py'):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            imported |= {name.split('.')[0] for name in names}
    third_party = {distributions[name][0] for name in imported - set(sys.stdlib_module_names)
                   if name in distributions and name != 'pyterrier_multiquery'}
    keyed = {name.replace('_', '-').lower() for name in cache_module.LIBRARIES}
    assert {name.replace('_', '-').lower() for name in third_party} - keyed <= set(NOT_KEYED)   # where installed


def test_a_damaged_entry_is_rebuilt_not_used(tmp_path):
    build = Builds()
    path = Cache(tmp_path).get('amer', build, **material())
    (path / 'weights.bin').write_text('modem')   # one byte changed, same size
    assert Cache(tmp_path).get('amer', build, **material()) == path and build.count == 2
    assert (path / 'weights.bin').read_text() == 'model'
    (path / 'weights.bin').unlink()
    Cache(tmp_path).get('amer', build, **material())
    (path.parent / 'manifest.json').write_text('{not json')
    Cache(tmp_path).get('amer', build, **material())
    assert build.count == 4 and (path / 'weights.bin').read_text() == 'model'


def test_refresh_rebuilds_each_entry_once_per_cache_object(tmp_path):
    build = Builds()
    Cache(tmp_path).get('amer', build, **material())
    refreshing = Cache(tmp_path, refresh=True)
    refreshing.get('amer', build, **material())
    refreshing.get('amer', build, **material())
    assert build.count == 2


def test_a_failed_build_leaves_no_entry(tmp_path):
    def failing(path):
        path.mkdir()
        (path / 'half').write_text('x')
        raise RuntimeError('killed')
    with pytest.raises(RuntimeError, match='killed'):
        Cache(tmp_path).get('amer', failing, **material())
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith('.lock')] == []
    build = Builds()
    Cache(tmp_path).get('amer', build, **material())
    assert build.count == 1


def _slow_build(root, started, log):
    def build(path):
        started.set()
        time.sleep(1.)
        log.put('built')
        path.mkdir()
        (path / 'weights.bin').write_text('model')
    Cache(root).get('amer', build, **material())
    log.put('done')


def test_two_jobs_sharing_a_cache_folder_build_an_entry_once(tmp_path):
    context = multiprocessing.get_context('spawn')
    started, log = context.Event(), context.Queue()
    jobs = [context.Process(target=_slow_build, args=(tmp_path, started, log)) for _ in range(2)]
    jobs[0].start()
    assert started.wait(60)
    jobs[1].start()
    for job in jobs:
        job.join(60)
    messages = [log.get(timeout=5) for _ in range(3)]
    assert sorted(messages) == ['built', 'done', 'done'] and all(job.exitcode == 0 for job in jobs)


def test_code_fingerprint_follows_the_modules_a_module_imports(tmp_path):
    package = tmp_path / 'pyterrier_multiquery'
    shutil.copytree(cache_module.PACKAGE_DIR, package, ignore=shutil.ignore_patterns('__pycache__'))
    module = 'pyterrier_multiquery.experiment.systems'
    before = code_fingerprint(module, package_dir=package)
    assert code_fingerprint(module, package_dir=package) == before
    unrelated = package / 'cdp' / 'complexity.py'     # not imported by the systems module, at any depth
    unrelated.write_text(unrelated.read_text() + '\n# a comment\n')
    assert code_fingerprint(module, package_dir=package) == before
    imported = package / 'amer' / 'training.py'       # imported by the systems module (inside train_amer)
    imported.write_text(imported.read_text() + '\n# a comment\n')
    assert code_fingerprint(module, package_dir=package) != before
    # a module edited to import another is read again in the same process: the other module counts from then on
    imported.write_text(imported.read_text() + 'import pyterrier_multiquery.cdp.complexity\n')
    importing = code_fingerprint(module, package_dir=package)
    unrelated.write_text(unrelated.read_text() + '# another comment\n')
    assert code_fingerprint(module, package_dir=package) != importing
    with pytest.raises(ValueError, match='no module'):
        code_fingerprint('pyterrier_multiquery.nowhere', package_dir=package)


def test_script_fingerprint_follows_the_script_and_the_package_modules_it_imports(tmp_path):
    package = tmp_path / 'pyterrier_multiquery'
    shutil.copytree(cache_module.PACKAGE_DIR, package, ignore=shutil.ignore_patterns('__pycache__'))
    script = tmp_path / 'experiment.py'
    script.write_text('import json\nfrom pyterrier_multiquery.experiment.parts import StoredParts\n')
    before = script_fingerprint(script, package_dir=package)
    copy = tmp_path / 'elsewhere' / 'experiment.py'     # the same script in another clone
    copy.parent.mkdir()
    copy.write_text(script.read_text())
    assert script_fingerprint(copy, package_dir=package) == before
    unrelated = package / 'amer' / 'training.py'       # not imported by the parts module, at any depth
    unrelated.write_text(unrelated.read_text() + '\n# a comment\n')
    assert script_fingerprint(script, package_dir=package) == before
    imported = package / '_files.py'                   # imported by the parts module
    imported.write_text(imported.read_text() + '\n# a comment\n')
    changed = script_fingerprint(script, package_dir=package)
    assert changed != before
    script.write_text(script.read_text() + 'SETTINGS = ()\n')   # the script's own code counts too
    assert script_fingerprint(script, package_dir=package) != changed
    alone = tmp_path / 'alone.py'                       # a script that imports nothing of the package
    alone.write_text('import json\n')
    assert script_fingerprint(alone, package_dir=package) != script_fingerprint(script, package_dir=package)


def test_data_fingerprint_sees_every_value_and_column():
    base = data_fingerprint(TOPICS, QRELS)
    assert data_fingerprint(TOPICS.copy(), QRELS.copy()) == base
    assert data_fingerprint(TOPICS.rename(columns={'query': 'text'}), QRELS) != base
    assert data_fingerprint(TOPICS.iloc[::-1], QRELS) != base
    assert data_fingerprint(QRELS, TOPICS) != base
    assert data_fingerprint([{'docno': 'd1', 'text': 'a'}]) != data_fingerprint([{'docno': 'd1', 'text': 'b'}])
