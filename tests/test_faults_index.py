"""Damaged index files and builds killed by PID: an index loads whole or not at all, and nothing else is touched."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyterrier_multiquery.index import CorruptIndexError, MultiVectorIndex

FILES = ('pt_meta.json', 'vecs.f4', 'offsets.i8', 'docnos.npids', 'ann.Flat.faiss')
CHECKED = settings(max_examples=40, deadline=None)
QUERIES = pd.DataFrame({'qid': ['q0', 'q1'], 'query': 'x',
                        'query_embs': list(np.random.default_rng(1).normal(size=(2, 3, 8)).astype(np.float32))})


def records(count, seed=0, dim=8):
    rng = np.random.default_rng(seed)
    for i in range(count):
        yield {'docno': f'doc-{i}', 'doc_embs': rng.normal(size=(1 + i % 3, dim)).astype(np.float32)}


@pytest.fixture(scope='module')
def original(tmp_path_factory):
    """An index with its FAISS stage, and its exact and approximate results on a few queries."""
    index = MultiVectorIndex(tmp_path_factory.mktemp('faults') / 'index', verbose=False).index(records(50))
    results = search(index)
    assert sorted(p.name for p in index.path.iterdir()) == sorted(FILES)
    return index.path, results


def search(index):
    """Exact, approximate with 16 candidates and approximate at the default candidate count (no calibration:
    the index folder holds none)."""
    return [index.retriever(num_results=10)(QUERIES)] + \
        [index.ann_retriever(num_results=10, **settings)(QUERIES) for settings in ({'ann': 'flat', 'candidates': 16},
                                                                                   {'ann': 'flat'})]


def load_and_search(path):
    return search(MultiVectorIndex(path, verbose=False))


def damaged_copy(original, name, change):
    folder = Path(tempfile.mkdtemp())
    shutil.copytree(original[0], folder / 'index')
    data = (folder / 'index' / name).read_bytes()
    (folder / 'index' / name).write_bytes(change(data))
    return folder


@CHECKED
@given(name=st.sampled_from(FILES), keep=st.floats(0, 1, exclude_max=True))
def test_truncated_files_raise(original, name, keep):
    folder = damaged_copy(original, name, lambda data: data[:int(len(data) * keep)])
    try:
        with pytest.raises(CorruptIndexError, match=name.replace('.', '\\.')):
            load_and_search(folder / 'index')
    finally:
        shutil.rmtree(folder)


def assert_caught_or_harmless(original, folder, name):
    """Loading the damaged copy raises CorruptIndexError naming the file (or, for the metadata, the file that no
    longer matches it: a changed build id disowns the FAISS file), or (only for the metadata, where a hint or white
    space may change) it gives exactly the original results."""
    try:
        results = load_and_search(folder / 'index')
    except CorruptIndexError as e:
        assert name in str(e) or (name == 'pt_meta.json' and 'another build' in str(e)), str(e)
    else:
        assert name == 'pt_meta.json'
        for got, expected in zip(results, original[1]):
            pd.testing.assert_frame_equal(got, expected)
    finally:
        shutil.rmtree(folder)


@CHECKED
@given(name=st.sampled_from(FILES[:4]), tail=st.binary(min_size=1, max_size=64))
def test_files_with_bytes_appended_raise_or_change_nothing(original, name, tail):
    assert_caught_or_harmless(original, damaged_copy(original, name, lambda data: data + tail), name)


@CHECKED
@given(name=st.sampled_from(['pt_meta.json', 'offsets.i8', 'docnos.npids']), where=st.floats(0, 1, exclude_max=True),
       flip=st.integers(1, 255))
def test_changed_bytes_raise_or_change_nothing(original, name, where, flip):
    """A changed byte of the metadata, the offsets or the docnos (the last two are checked at every open). The
    vectors and FAISS files are checked by verify() (tests/test_fault_suite.py)."""
    def change(data):
        data = bytearray(data)
        data[int(len(data) * where)] ^= flip
        return bytes(data)

    assert_caught_or_harmless(original, damaged_copy(original, name, change), name)


WORKER = textwrap.dedent('''
    import os, sys
    import numpy as np
    from pyterrier_multiquery.index import MultiVectorIndex

    def records(count):
        rng = np.random.default_rng(1)
        for i in range(count):
            yield {'docno': f'new-{i}', 'doc_embs': rng.normal(size=(4, 32)).astype(np.float32)}

    print('ready', flush=True)
    while line := sys.stdin.readline():  # "<path> <documents>": build in a child and report its pid; on the next
        path, count = line.split()       # line, wait for the child (not before: its pid stays its own) and report
        pid = os.fork()                  # how it ended
        if pid == 0:
            MultiVectorIndex(path, verbose=False).indexer(overwrite=True).index(records(int(count)))
            os._exit(0)
        print(pid, flush=True)
        sys.stdin.readline()
        print(os.waitpid(pid, 0)[1], flush=True)
''')
NEW_DOCS = 30_000


def new_vectors():
    rng = np.random.default_rng(1)
    return np.concatenate([rng.normal(size=(4, 32)).astype(np.float32) for _ in range(NEW_DOCS)])


def test_builds_killed_at_random_points(tmp_path):
    worker = subprocess.Popen([sys.executable, '-c', WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert worker.stdout.readline().strip() == 'ready'

        def build(path, kill_after=None):
            worker.stdin.write(f'{path} {NEW_DOCS}\n')
            worker.stdin.flush()
            pid, start = int(worker.stdout.readline()), time.perf_counter()
            if kill_after is not None:
                time.sleep(kill_after)
                os.kill(pid, signal.SIGKILL)  # the child of our worker, not yet waited for
            worker.stdin.write('wait\n')
            worker.stdin.flush()
            status = int(worker.stdout.readline())
            return status, time.perf_counter() - start

        # a whole build, to time it and to have the new index to compare with
        status, duration = build(tmp_path / 'complete')
        assert status == 0
        new = new_vectors()
        np.testing.assert_array_equal(MultiVectorIndex(tmp_path / 'complete').payload()[1], new)
        shutil.rmtree(tmp_path / 'complete')

        rng = np.random.default_rng(0)
        outcomes, left = [], []
        for case, delay in enumerate(np.sort(rng.uniform(0, 1.1 * duration, size=8))):
            parent = tmp_path / f'case{case}'
            parent.mkdir()
            (parent / 'keep.txt').write_text('not the index')
            old = case % 2 == 0  # half the cases replace an existing index, half build a first one
            if old:
                MultiVectorIndex(parent / 'index', verbose=False).index(records(5))
            status, _ = build(parent / 'index', kill_after=delay)
            index = MultiVectorIndex(parent / 'index', verbose=False)
            try:
                meta, vectors, _, docnos = index.payload()
            except FileNotFoundError:
                outcomes.append('nothing')  # killed before the new index was renamed into place
            else:
                if meta['doc_count'] == NEW_DOCS:
                    np.testing.assert_array_equal(vectors, new)
                    assert docnos.fwd[NEW_DOCS - 1] == f'new-{NEW_DOCS - 1}'
                    outcomes.append('new')
                else:
                    assert old and status != 0 and list(docnos) == [f'doc-{i}' for i in range(5)]
                    outcomes.append('old')
            if status == 0:
                assert outcomes[-1] == 'new'
            left += [p.name for p in parent.iterdir() if p.name.startswith('.index.building-')]
            # the next build of the same index succeeds and removes what the killed one left
            rebuilt = MultiVectorIndex(parent / 'index', verbose=False).indexer(overwrite=True).index(records(7))
            assert len(rebuilt) == 7
            assert sorted(p.name for p in parent.iterdir()) == ['index', 'keep.txt']
            assert (parent / 'keep.txt').read_text() == 'not the index'
        assert 'nothing' in outcomes or 'old' in outcomes, outcomes  # some kills did interrupt a build
        assert left, 'no kill left a half-written build folder behind to clean'
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)


def test_stale_faiss_build_files_are_removed(tmp_path):
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(records(20))
    dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    stale = index.path / f'.ann.Flat.faiss.tmp-{int(dead.stdout)}'
    stale.write_bytes(b'half a faiss index')
    index.ann_retriever(ann='flat')(QUERIES)
    assert not stale.exists() and (index.path / 'ann.Flat.faiss').exists()


def test_metadata_of_another_artifact_is_refused(original, tmp_path):
    shutil.copytree(original[0], tmp_path / 'index')
    meta = json.loads((tmp_path / 'index' / 'pt_meta.json').read_text())
    (tmp_path / 'index' / 'pt_meta.json').write_text(json.dumps({**meta, 'type': 'sparse_index'}))
    with pytest.raises(CorruptIndexError, match='sparse_index/mvi artifact, not a MultiVectorIndex'):
        MultiVectorIndex(tmp_path / 'index').payload()
    with pytest.raises(FileExistsError, match='overwrite=True only replaces an index'):
        MultiVectorIndex(tmp_path / 'index', verbose=False).indexer(overwrite=True).index(records(3))
    assert json.loads((tmp_path / 'index' / 'pt_meta.json').read_text())['type'] == 'sparse_index'
