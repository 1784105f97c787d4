"""Concurrency, corruption and crashes: an index build never collides with another or mixes with it, every file is
checksummed and bound to its build, and a damaged value never becomes a score."""
import json
import multiprocessing
import os
import time

import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.index import CorruptIndexError, MultiVectorIndex, ShardedMultiVectorIndex

DIM = 4


def tagged(build: int, count: int = 6, delay: float = 0.):
    """Documents ``b<build>-<i>`` whose vectors are all ``100 * build + i``: a docno and its vectors name their
    build, so a mix of two builds shows."""
    for i in range(count):
        if i == 1:
            time.sleep(delay)
        yield {'docno': f'b{build}-{i}', 'doc_embs': np.full((1 + i % 2, DIM), 100 * build + i, dtype=np.float32)}


def assert_one_build(payload):
    """Every document's docno and vectors come from the same build."""
    meta, vectors, offsets, docnos = payload
    for i in range(meta['doc_count']):
        build, number = docnos.fwd[i][1:].split('-')
        np.testing.assert_array_equal(vectors[offsets[i]:offsets[i + 1]], 100 * int(build) + int(number))


def _build_first(path, build, results):
    try:
        MultiVectorIndex(path, verbose=False).index(tagged(build, delay=0.5))
        results.put((build, 'built'))
    except FileExistsError as e:
        results.put((build, f'FileExistsError: {e}'))


def test_concurrent_first_builds_do_not_replace_each_other(tmp_path):
    """Two processes build the same new index with overwrite=False: one builds it, the other is refused."""
    context = multiprocessing.get_context('fork')
    results = context.Queue()
    builders = [context.Process(target=_build_first, args=(tmp_path / 'index', build, results)) for build in (1, 2)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(60)
    outcomes = dict(results.get(timeout=5) for _ in builders)
    built = [build for build, outcome in outcomes.items() if outcome == 'built']
    assert len(built) == 1, outcomes
    refused = [outcome for outcome in outcomes.values() if outcome != 'built']
    assert 'an index already exists' in refused[0]
    assert list(MultiVectorIndex(tmp_path / 'index').payload()[3]) == [f'b{built[0]}-{i}' for i in range(6)]


def test_an_open_during_an_overwrite_never_mixes_builds(tmp_path, monkeypatch):
    """The index is replaced by another build of the same sizes just before its docnos are opened (the moment of
    a concurrent overwrite that mixed builds): the open gives one whole build."""
    import npids
    path = tmp_path / 'index'
    MultiVectorIndex(path, verbose=False).index(tagged(1))
    replaced = []

    class OverwrittenFirst(npids.Lookup):
        def __init__(self, *args, **kwargs):
            if not replaced:
                replaced.append(True)
                MultiVectorIndex(path, verbose=False).indexer(overwrite=True).index(tagged(2))
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(npids, 'Lookup', OverwrittenFirst)
    payload = MultiVectorIndex(path, verbose=False).payload()
    assert replaced
    assert_one_build(payload)
    assert payload[3].fwd[0] == 'b2-0'


def test_an_open_during_a_sharded_overwrite_never_mixes_builds(tmp_path, monkeypatch):
    path = tmp_path / 'sharded'
    ShardedMultiVectorIndex(path, verbose=False).indexer(shard_size=3).index(tagged(1))
    memmap = np.memmap
    replaced = []

    class OverwrittenFirst(memmap):   # a type still, as npids' np.ndarray.__new__(np.memmap, ...) needs
        def __new__(cls, *args, **kwargs):
            if not replaced:
                replaced.append(True)
                ShardedMultiVectorIndex(path, verbose=False).indexer(shard_size=3, overwrite=True).index(tagged(2))
            return memmap(*args, **kwargs)
    monkeypatch.setattr(np, 'memmap', OverwrittenFirst)
    payload = ShardedMultiVectorIndex(path, verbose=False).payload()
    assert replaced
    assert_one_build(payload)
    assert payload[3].fwd[0] == 'b2-0'


def test_an_overwrite_never_leaves_the_path_empty(tmp_path, monkeypatch):
    """While a build replaces an index, a reader finds the old index or the new one at the path, never nothing."""
    import pyterrier_multiquery._files as files
    path = tmp_path / 'index'
    MultiVectorIndex(path, verbose=False).index(tagged(1))
    replace, rmtree = os.replace, files.shutil.rmtree
    seen = []  # whether an index is at the path after each rename and before each removal of a folder

    def watched_replace(source, target):
        replace(source, target)
        seen.append((path / 'pt_meta.json').is_file())

    def watched_rmtree(folder, **kwargs):
        seen.append((path / 'pt_meta.json').is_file())
        rmtree(folder, **kwargs)
    monkeypatch.setattr(files.os, 'replace', watched_replace)
    monkeypatch.setattr(files.shutil, 'rmtree', watched_rmtree)
    MultiVectorIndex(path, verbose=False).indexer(overwrite=True).index(tagged(2))
    assert seen and all(seen), seen
    assert MultiVectorIndex(path).payload()[3].fwd[0] == 'b2-0'


@pytest.fixture
def built(tmp_path):
    """An index of ``tagged(1)`` with its flat FAISS stage, and a query frame."""
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(tagged(1))
    queries = pd.DataFrame({'qid': ['q0'], 'query': 'x', 'query_embs': [np.ones((2, DIM), dtype=np.float32)]})
    index.ann_retriever(ann='flat', candidates=4)(queries)
    return index, queries


def change_bytes(file, position, new):
    data = bytearray(file.read_bytes())
    data[position:position + len(new)] = new
    file.write_bytes(bytes(data))


def test_every_index_file_has_a_checksum_in_the_metadata(built):
    from pyterrier_multiquery._files import file_sha256
    index, _ = built
    meta = json.loads((index.path / 'pt_meta.json').read_text())
    files = ('vecs.f4', 'offsets.i8', 'docnos.npids')
    assert meta['sha256'] == {name: file_sha256(index.path / name) for name in files}


def test_verify_finds_a_changed_byte_in_the_vectors(built):
    index, _ = built
    index.verify()
    change_bytes(index.path / 'vecs.f4', 5, b'\x7f')
    with pytest.raises(CorruptIndexError, match=r"vecs\.f4.* SHA-256 differs"):
        MultiVectorIndex(index.path).verify()


def test_a_nan_in_the_vectors_is_named_instead_of_scored(built):
    index, queries = built
    offsets = index.payload()[2]
    change_bytes(index.path / 'vecs.f4', int(offsets[3]) * DIM * 4, np.float32(np.nan).tobytes())
    reopened = MultiVectorIndex(index.path, verbose=False)
    for retriever in (reopened.maxsim_retriever(), reopened.ann_retriever(ann='flat'),
                      reopened.multiquery_retriever()):
        with pytest.raises(CorruptIndexError, match="document 'b1-3' has non-finite values"):
            retriever(queries)
    results = pd.DataFrame({'qid': 'q0', 'query': 'x', 'docno': ['b1-2', 'b1-3'], 'score': 0., 'rank': [0, 1],
                            'query_embs': [queries['query_embs'][0]] * 2})
    with pytest.raises(CorruptIndexError, match="document 'b1-3' has non-finite values"):
        reopened.scorer()(results)


def test_a_damaged_faiss_file_is_refused(built):
    index, queries = built
    change_bytes(index.path / 'ann.Flat.faiss', 100, bytes(64))
    reopened = MultiVectorIndex(index.path, verbose=False)
    with pytest.raises(CorruptIndexError, match=r"ann\.Flat\.faiss"):
        reopened.verify()
    with pytest.raises(CorruptIndexError, match=r"ann\.Flat\.faiss"):
        reopened.ann_retriever(ann='flat', candidates=4)(queries)


def test_a_faiss_file_of_another_index_is_refused(built, tmp_path):
    index, queries = built
    other = MultiVectorIndex(tmp_path / 'other', verbose=False).index(tagged(2))
    (other.path / 'ann.Flat.faiss').write_bytes((index.path / 'ann.Flat.faiss').read_bytes())
    with pytest.raises(CorruptIndexError, match=r"ann\.Flat\.faiss.* another build"):
        other.ann_retriever(ann='flat', candidates=4)(queries)
    with pytest.raises(CorruptIndexError, match=r"ann\.Flat\.faiss.* another build"):
        other.verify()


@pytest.mark.parametrize('faiss_file', ['of the new build', 'none yet', 'gone when opened'])
def test_a_faiss_stage_opened_for_a_replaced_build_says_so(tmp_path, monkeypatch, faiss_file):
    """An overwrite lands between a search's open of the index and its open of the FAISS file: the new build's
    FAISS file, none yet, or the file gone between the look and the open (the race of two overwriting processes).
    Each is the replaced index, refused as such, not a FAISS file of another build nor a missing file."""
    from pyterrier_multiquery.index import ann
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(tagged(1))
    stale = index.payload()
    MultiVectorIndex(index.path, verbose=False).indexer(overwrite=True).index(tagged(2))
    if faiss_file == 'of the new build':
        ann.load_or_build(index, 'flat')
    elif faiss_file == 'gone when opened':
        ann.load_or_build(index, 'flat')

        def vanished(path, *args):
            raise FileNotFoundError(path)
        monkeypatch.setattr(ann, 'open', vanished, raising=False)
    with pytest.raises(CorruptIndexError, match='replaced by another build while this search opened it'):
        ann.load_or_build(index, 'flat', payload=stale)
    assert [f.name for f in index.path.glob('*.faiss')] == (['ann.Flat.faiss'] if faiss_file != 'none yet' else [])


@pytest.mark.parametrize('change, match', [
    (lambda meta: {**meta, 'shards': ['shard-000'] * 3, 'shard_build_ids': meta['shard_build_ids'][:1] * 3},
     "shard-000' more than once"),
    (lambda meta: {**meta, 'doc_count': meta['doc_count'] + 1}, 'doc_count 7 .* shards hold 6'),
    (lambda meta: {**meta, 'vec_count': meta['vec_count'] - 1}, 'vec_count 8 .* shards hold 9'),
    (lambda meta: {**meta, 'dim': 3}, 'dim 3 .* shards have 4'),
    (lambda meta: {**meta, 'shards': ['..', 'shard-001']}, r"'\.\.' is not a folder inside the index"),
    (lambda meta: {**meta, 'shards': ['/tmp', 'shard-001']}, "'/tmp' is not a folder inside the index"),
])
def test_sharded_metadata_that_does_not_match_its_shards_is_refused(tmp_path, change, match):
    path = tmp_path / 'sharded'
    ShardedMultiVectorIndex(path, verbose=False).indexer(shard_size=3).index(tagged(1))
    meta = json.loads((path / 'pt_meta.json').read_text())
    (path / 'pt_meta.json').write_text(json.dumps(change(meta)))
    index = ShardedMultiVectorIndex(path, verbose=False)
    with pytest.raises(CorruptIndexError, match=match):
        len(index)


UNICODE_DOCNOS = ['é', 'a', '😀', 'naïve-文書', 'è', '🦀🦀']


@pytest.mark.parametrize('sharded', [False, True])
def test_unicode_docnos_in_every_lookup(tmp_path, sharded):
    """Non-ASCII and emoji docnos are stored, retrieved, re-scored and named in errors as they are."""
    records = [{'docno': docno, 'doc_embs': np.full((1, DIM), i + 1, dtype=np.float32)}
               for i, docno in enumerate(UNICODE_DOCNOS)]
    if sharded:
        index = ShardedMultiVectorIndex(tmp_path / 'index', verbose=False).indexer(shard_size=4).index(records)
    else:
        index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(records)
    query = np.ones((1, DIM), dtype=np.float32)
    queries = pd.DataFrame({'qid': ['q'], 'query': 'x', 'query_embs': [query]})
    expected = UNICODE_DOCNOS[::-1]  # document i scores 4 * (i + 1)
    for retriever in (index.maxsim_retriever(), index.ann_retriever(ann='flat'),
                      index.multiquery_retriever('score_sum'), index.mean_retriever()):
        assert retriever(queries)['docno'].tolist() == expected
    results = pd.DataFrame({'qid': 'q', 'query': 'x', 'docno': ['é', '🦀🦀', 'naïve-文書'], 'score': 0.,
                            'rank': [0, 1, 2], 'query_embs': [query] * 3})
    rescored = index.scorer()(results)
    assert dict(zip(rescored['docno'], zip(rescored['score'], rescored['rank']))) == \
        {'🦀🦀': (24., 0), 'naïve-文書': (16., 1), 'é': (4., 2)}
    with pytest.raises(KeyError, match="docno '🐍' is not in the index"):
        index.scorer()(results.assign(docno=['é', '🐍', 'a']))
    with pytest.raises(KeyError, match="docno 3 is not in the index"):
        index.scorer()(results.assign(docno=[3, 3, 3]))


SLOW_SHARDED_BUILD = '''
import sys, time
import numpy as np
from pyterrier_multiquery.index import ShardedMultiVectorIndex

def records():
    for i in range(10 ** 6):
        time.sleep(0.002)
        yield {'docno': f'd{i}', 'doc_embs': np.ones((1, 4), dtype=np.float32)}

ShardedMultiVectorIndex(sys.argv[1], verbose=False).indexer(shard_size=1000, processes=2).index(records())
'''


def test_a_killed_parallel_build_leaves_no_worker_behind(tmp_path):
    import signal
    import subprocess
    import sys

    import psutil
    build = subprocess.Popen([sys.executable, '-c', SLOW_SHARDED_BUILD, str(tmp_path / 'sharded')])
    workers = []
    try:
        deadline = time.monotonic() + 60
        while not workers and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = psutil.Process(build.pid).children()
        assert workers, 'the build started no worker'
        time.sleep(0.5)
        os.kill(build.pid, signal.SIGKILL)
        build.wait()
        _, alive = psutil.wait_procs(workers, timeout=5)
        assert not [w for w in alive if w.status() != psutil.STATUS_ZOMBIE], 'workers outlived the killed build'
    finally:
        build.kill()
        for worker in workers:  # those that outlived it, so that a failure leaves none behind either
            try:
                worker.kill()
            except psutil.NoSuchProcess:
                pass


def test_scores_that_overflow_float32_are_refused(built):
    """Finite query values near float32's limit give inf for every document: an error naming the query instead."""
    index, _ = built
    huge = pd.DataFrame({'qid': ['big'], 'query': 'x', 'query_embs': [np.full((2, DIM), 3e38, dtype=np.float32)]})
    for retriever in (index.maxsim_retriever(), index.ann_retriever(ann='flat'),
                      index.multiquery_retriever(), index.mean_retriever()):
        with pytest.raises(ValueError, match="query 'big.*float32 overflows"):
            retriever(huge)
    results = huge.assign(docno='b1-0', score=0., rank=0)
    with pytest.raises(ValueError, match="query 'big'.*float32 overflows"):
        index.scorer()(results)


@pytest.mark.parametrize('qid', [None, np.nan, 1.5, True, b'q'])
def test_qids_must_be_non_null_strings_or_integers(built, qid):
    index, queries = built
    frame = pd.concat([queries, queries.assign(qid=[qid])], ignore_index=True)
    for retriever in (index.maxsim_retriever(), index.multiquery_retriever(), index.mean_retriever()):
        with pytest.raises(ValueError, match=r'qid .* is not a non-null string or integer'):
            retriever(frame)
    results = frame.assign(docno='b1-0', score=0., rank=0)
    with pytest.raises(ValueError, match=r'qid .* is not a non-null string or integer'):
        index.scorer()(results)


def test_integer_qids_are_kept(built):
    index, queries = built
    out = index.maxsim_retriever(num_results=2)(queries.assign(qid=[7]))
    assert out['qid'].tolist() == [7, 7]
    # kept as integers, not merely equal to them: a float qid 7.0 compares equal to 7 above
    assert out['qid'].dtype == np.int64 and [type(q) for q in out['qid'].tolist()] == [int, int]


@pytest.mark.parametrize('cls', [MultiVectorIndex, ShardedMultiVectorIndex])
def test_an_overwrite_through_a_symlink_replaces_its_target(tmp_path, cls):
    cls(tmp_path / 'target', verbose=False).index(tagged(1))
    (tmp_path / 'link').symlink_to(tmp_path / 'target')
    cls(tmp_path / 'link', verbose=False).indexer(overwrite=True).index(tagged(2))
    assert (tmp_path / 'link').is_symlink()
    assert cls(tmp_path / 'target').payload()[3].fwd[0] == 'b2-0'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['link', 'target']


def test_approximate_search_memory_is_bounded_for_a_very_long_document(tmp_path):
    """A document of 5,000 vectors among the candidates of 100 one-vector documents: the re-scoring holds about
    the candidates' vectors, not every candidate padded to the longest."""
    import tracemalloc
    dim, rng = 16, np.random.default_rng(0)
    long_doc = np.zeros((5000, dim), dtype=np.float32)
    long_doc[0] = 2
    docs = [{'docno': f'short-{i}', 'doc_embs': 1 + rng.uniform(0, .01, size=(1, dim)).astype(np.float32)}
            for i in range(300)] + [{'docno': 'long', 'doc_embs': long_doc}]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    queries = pd.DataFrame({'qid': ['q'], 'query': 'x',
                            'query_embs': [1 + rng.uniform(0, .01, size=(4, dim)).astype(np.float32)]})
    retriever = index.ann_retriever(ann='flat', candidates=100, num_results=5)
    retriever(queries)  # builds the FAISS stage
    tracemalloc.start()
    try:
        out = retriever(queries)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    exact = index.maxsim_retriever(num_results=5)(queries)
    assert out['docno'].tolist() == exact['docno'].tolist() and out['docno'][0] == 'long'
    np.testing.assert_allclose(out['score'], exact['score'], rtol=1e-6)
    candidate_bytes = (100 + 5000) * dim * 4
    assert peak < 8 * candidate_bytes, f'{peak} bytes at the peak for {candidate_bytes} bytes of candidate vectors'


def test_scores_do_not_depend_on_how_queries_are_batched(tmp_path):
    """A query's scores are the same bits whether it is searched alone or batched with others (one-vector queries
    included: a product with one row took another kernel, whose sums rounded differently)."""
    rng = np.random.default_rng(0)
    docs = [{'docno': f'd{i}', 'doc_embs': rng.normal(size=(rng.integers(1, 30), 128)).astype(np.float32)}
            for i in range(1000)]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    queries = pd.DataFrame({'qid': [f'q{i}' for i in range(12)], 'query': 'x',
                            'query_embs': [rng.normal(size=(1 if i % 3 == 0 else 1 + i, 128)).astype(np.float32)
                                           for i in range(12)]})
    for search, settings in ((index.retriever, {}), (index.ann_retriever, {'ann': 'flat'})):
        runs = [search(num_results=20, batch_size=batch_size, **settings)(queries) for batch_size in (1, 5, 64)]
        for run in runs[1:]:
            pd.testing.assert_frame_equal(run, runs[0], check_exact=True)


@pytest.mark.parametrize('kind', ['exact', 'scorer', 'mean', 'multiquery'])
def test_a_search_that_meets_a_rebuild_searches_the_new_build_once_more(tmp_path, monkeypatch, kind):
    from pyterrier_multiquery.index import IndexReplacedError
    from pyterrier_multiquery.index.shardwise import ShardSearcher
    path = tmp_path / 'index'
    build = lambda value: MultiVectorIndex(path, verbose=False).indexer(overwrite=True).index(  # noqa: E731
        [{'docno': f'v{value}', 'doc_embs': np.full((1, 2), value, dtype=np.float32)},
         {'docno': 'low', 'doc_embs': np.full((1, 2), 0.5, dtype=np.float32)}])
    build(1)
    index = MultiVectorIndex(path, verbose=False)
    search = {'exact': index.maxsim_retriever(), 'scorer': index.scorer(), 'mean': index.mean_retriever(),
              'multiquery': index.multiquery_retriever()}[kind]
    query = pd.DataFrame({'qid': ['q'], 'query_embs': [np.ones((1, 2), dtype=np.float32)]})
    search(query if kind != 'scorer' else query.assign(docno=['v1']))  # opened on build 1
    original, rebuilds = ShardSearcher.payload, []

    def rebuilt_while_searching(self, builds):
        if len(rebuilds) < builds:
            rebuilds.append(None)
            build(2 + len(rebuilds))  # another process's overwrite, as this search reads the shard
        return original(self)

    monkeypatch.setattr(ShardSearcher, 'payload', lambda self: rebuilt_while_searching(self, 1))
    out = search(query if kind != 'scorer' else query.assign(docno=['v3'])).sort_values('rank')
    assert out['docno'].iloc[0] == 'v3'  # the new build's document
    if kind != 'multiquery':  # (whose scores are its merge's)
        assert out['score'].iloc[0] == pytest.approx(6.)
    rebuilds.clear()
    monkeypatch.setattr(ShardSearcher, 'payload', lambda self: rebuilt_while_searching(self, 2))
    with pytest.raises(IndexReplacedError, match='was replaced by another build while this search opened it'):
        search(query if kind != 'scorer' else query.assign(docno=['v5']))  # replaced again: one retry only
    assert len(rebuilds) == 2
