"""The fault suite: generated damage, kills and races against the index, the saved models and the main job's cache.

No silent wrong result is allowed: a changed byte of any file is refused when the index or model opens, or by
``verify()`` (the vectors and FAISS files, which opening does not read whole), or changes nothing; a build killed at
any point leaves the old index or none; concurrent builders never both succeed and a reader never mixes two builds.
Every generated case is counted by the ``fault_cases`` fixture; the run prints the total and the suite's time.
"""
import functools
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pyterrier_multiquery.index import CorruptIndexError, MultiVectorIndex, ShardedMultiVectorIndex

DIM = 8
FAST = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
QUERIES = pd.DataFrame({'qid': ['q0', 'q1'], 'query': 'x',
                        'query_embs': list(np.random.default_rng(1).normal(size=(2, 3, DIM)).astype(np.float32))})
ANN_KINDS = ('flat', 'hnsw')


def records(count, seed=0, prefix='doc'):
    rng = np.random.default_rng(seed)
    return [{'docno': f'{prefix}-{i}', 'doc_embs': rng.normal(size=(1 + i % 3, DIM)).astype(np.float32)}
            for i in range(count)]


def search(index):
    """The exact and approximate (every FAISS kind) results of QUERIES."""
    return [index.maxsim_retriever(num_results=10)(QUERIES)] + \
        [index.ann_retriever(num_results=10, ann=kind)(QUERIES) for kind in ANN_KINDS]


def same_results(got, expected) -> bool:
    try:
        for a, b in zip(got, expected):
            pd.testing.assert_frame_equal(a, b)
    except AssertionError:
        return False
    return True


class Flipped:
    """A byte of a file xor-ed with a mask within the block, restored after it."""

    def __init__(self, file: Path, where: float, mask: int):
        self.file, self.mask = file, mask
        self.position = int(file.stat().st_size * where)

    def __enter__(self):
        with open(self.file, 'r+b') as f:
            f.seek(self.position)
            self.original = f.read(1)
            f.seek(self.position)
            f.write(bytes([self.original[0] ^ self.mask]))

    def __exit__(self, *exc):
        with open(self.file, 'r+b') as f:
            f.seek(self.position)
            f.write(self.original)


def index_files(folder: Path):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob('*') if p.is_file())


@pytest.fixture(scope='module', params=['single', 'sharded'])
def index_tree(request, tmp_path_factory):
    """A single or sharded index with its FAISS stages, its file names and its original results."""
    path = tmp_path_factory.mktemp('suite') / 'index'
    if request.param == 'single':
        index = MultiVectorIndex(path, verbose=False).index(records(40))
    else:
        index = ShardedMultiVectorIndex(path, verbose=False).indexer(shard_size=15).index(records(40))
    results = search(index)
    return type(index), path, index_files(path), results


@settings(max_examples=250, **FAST)
@given(data=st.data(), where=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_a_changed_byte_in_any_index_file_is_caught_or_harmless(index_tree, fault_cases, data, where, mask):
    cls, path, files, original = index_tree
    name = data.draw(st.sampled_from(files), label='file')
    fault_cases()
    with Flipped(path / name, where, mask):
        try:
            results = search(cls(path, verbose=False))
        except (CorruptIndexError, FileNotFoundError):
            return  # refused at open or load
        except ValueError as e:   # a flipped exponent bit: finite stored values whose scores overflow, named
            assert 'float32 overflows' in str(e) and 'document' in str(e)
            return
        if name.endswith('.json'):  # checksummed as parsed (pt_meta.json: the reference of every check, and the
            # calibrations): a change they allow, such as one whitespace character for another, changes nothing
            assert same_results(results, original), f'a changed byte of {name} changed the results silently'
            return
        with pytest.raises(CorruptIndexError, match=Path(name).name.replace('.', r'\.')):
            cls(path, verbose=False).verify()


SPECIAL_VALUES = [None, 0., np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45]


@settings(max_examples=150, **FAST)
@given(docs=st.lists(st.tuples(st.integers(1, 3), st.sampled_from(SPECIAL_VALUES), st.integers(0, 3 * DIM - 1)),
                     min_size=1, max_size=6),
       seed=st.integers(0, 2 ** 32 - 1), query=arrays(np.float32, (2, 2), elements=st.floats(-2, 2, width=32)),
       query_scale=st.sampled_from([1., 1e19, 3e38]))
def test_generated_vectors_index_and_score_exactly_or_are_refused(tmp_path_factory, fault_cases, docs, seed, query,
                                                                   query_scale):
    """Documents whose vectors hold NaN, inf or values near float32's limit or below its normal range at a drawn
    place, and queries scaled towards the limit: the indexer names a non-finite document, a score that overflows
    names its query, and every other score is the brute-force MaxSim."""
    fault_cases()
    rng = np.random.default_rng(seed)
    query = np.tile(query, (1, DIM // 2))
    embs = []
    for count, special, place in docs:
        block = rng.uniform(-2, 2, size=(count, DIM)).astype(np.float32)
        if special is not None:
            block.flat[place % block.size] = special
        embs.append(block)
    path = tmp_path_factory.mktemp('vectors') / 'index'
    frame = [{'docno': f'd{i}', 'doc_embs': e} for i, e in enumerate(embs)]
    bad = [i for i, e in enumerate(embs) if not np.isfinite(e).all()]
    if bad:
        with pytest.raises(ValueError, match=f"document 'd{bad[0]}' has non-finite values"):
            MultiVectorIndex(path, verbose=False).index(frame)
        return
    index = MultiVectorIndex(path, verbose=False).index(frame)
    topics = pd.DataFrame({'qid': ['q'], 'query': 'x', 'query_embs': [query * np.float32(1)]})
    with np.errstate(over='ignore'):
        query = query * np.float32(query_scale)
    topics['query_embs'] = [query]
    if not np.isfinite(query).all():
        with pytest.raises(ValueError, match="query 'q': query_embs has non-finite values"):
            index.maxsim_retriever()(topics)
        return
    with np.errstate(over='ignore', invalid='ignore'):
        expected = np.array([(query.astype(np.float64) @ e.T.astype(np.float64)).max(axis=1).mean() for e in embs])
        representable = np.isfinite(expected.astype(np.float32)).all()
    if not representable:  # MaxSim beyond float32's range
        with pytest.raises(ValueError, match="query 'q'.*float32 overflows"):
            index.maxsim_retriever()(topics)
        return
    out = index.maxsim_retriever()(topics)
    got = dict(zip(out['docno'], out['score']))
    for i, (score, e) in enumerate(zip(expected, embs)):
        # exact search scores in float64 and rounds once to float32 (tests/test_exact_search.py): the brute-force
        # score so rounded, within a few float32 units; near zero, within float64's rounding of the products' sum
        # (far below the terms' magnitudes) and a few of float32's smallest subnormals
        terms = float((np.abs(query.astype(np.float64)) @ np.abs(e.T.astype(np.float64))).max())
        assert got[f'd{i}'] == pytest.approx(np.float32(score), rel=1e-6, abs=1e-12 * terms + 1e-44), (i, score)


qid_cells = st.one_of(st.text(max_size=3), st.integers(-5, 5), st.none(), st.just(np.nan), st.floats(allow_nan=False),
                      st.booleans(), st.binary(max_size=2))


@settings(max_examples=100, **FAST)
@given(qids=st.lists(qid_cells, min_size=1, max_size=4))
def test_generated_qids_are_kept_or_refused(index_tree, fault_cases, qids):
    """A frame's qids: non-null strings and integers, each once, come back as they were; anything else is named."""
    fault_cases()
    cls, path, _, _ = index_tree
    frame = pd.DataFrame({'qid': pd.Series(qids, dtype=object), 'query': 'x',
                          'query_embs': [QUERIES['query_embs'][0]] * len(qids)})
    retriever = cls(path, verbose=False).maxsim_retriever(num_results=2)
    valid = [isinstance(q, (str, int)) and not isinstance(q, bool) for q in qids]
    if not all(valid):
        with pytest.raises(ValueError, match='is not a non-null string or integer'):
            retriever(frame)
    elif len(set(qids)) < len(qids):
        with pytest.raises(ValueError, match='has more than one row'):
            retriever(frame)
    else:
        out = retriever(frame)
        assert out['qid'].tolist() == [q for q in qids for _ in range(2)]


@pytest.fixture(scope='module')
def saved_model(save_tiny_bert, tmp_path_factory):
    """A JPR model saved to a folder, its file names and its output."""
    torch = pytest.importorskip('torch')
    from pyterrier_multiquery.jpr import JPRModel
    model = JPRModel(str(save_tiny_bert(['who', 'won', 'the', 'cup', 'city'])), decoder_layers=1, decoder_heads=2,
                     decoder_dropout=0.)
    path = tmp_path_factory.mktemp('model') / 'jpr'
    model.save_pretrained(path)

    def output(m):
        memory = m.passages('who won the cup', ['the cup', 'city']).unsqueeze(0)
        with torch.no_grad():
            return m(memory, torch.tensor([[1]]), ranks=torch.tensor([[0, 1]])).numpy()
    return type(model), path, index_files(path), output, output(model)


@settings(max_examples=100, **FAST)
@given(data=st.data(), where=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_a_changed_byte_in_any_saved_model_file_is_caught_or_harmless(saved_model, fault_cases, data, where, mask):
    from pyterrier_multiquery._saved_model import CorruptModelError
    cls, path, files, output, original = saved_model
    name = data.draw(st.sampled_from(files), label='file')
    fault_cases()
    with Flipped(path / name, where, mask):
        if name != 'pt_meta.json':
            with pytest.raises(CorruptModelError, match=Path(name).name.replace('.', r'\.')):
                cls.load(path)
            return
        try:
            loaded = cls.load(path)
        except (CorruptModelError, FileNotFoundError, ValueError):
            return
        np.testing.assert_array_equal(output(loaded), original)


def _write(content):
    def build(path):
        path.mkdir()
        (path / 'weights.bin').write_bytes(content)
    return build


CACHE_MATERIAL = {'data': 'data-1', 'settings': {'seed': 0}, 'code': 'code-1'}


@settings(max_examples=100, **FAST)
@given(which=st.sampled_from(['artifact/weights.bin', 'manifest.json']), where=st.floats(0, 1, exclude_max=True),
       mask=st.integers(1, 255))
def test_a_changed_byte_in_a_cache_entry_is_rebuilt_or_harmless(tmp_path_factory, fault_cases, which, where, mask):
    """The main job's cache: an entry whose artifact changed is rebuilt, not used; a manifest whose change leaves
    the key and checksums readable and equal may be used, with the artifact intact."""
    from pyterrier_multiquery.experiment.cache import Cache
    fault_cases()
    root = tmp_path_factory.mktemp('cache')
    content = bytes(range(64))
    artifact = Cache(root).get('model', _write(content), **CACHE_MATERIAL)
    calls = []

    def rebuild(path):
        calls.append(path)
        _write(content)(path)
    with Flipped(artifact.parent / which, where, mask):
        again = Cache(root).get('model', rebuild, **CACHE_MATERIAL)
    assert again == artifact and (again / 'weights.bin').read_bytes() == content
    if which.startswith('artifact'):
        assert calls, 'a damaged artifact was used'


def _cache_get(root, results):
    from pyterrier_multiquery.experiment.cache import Cache
    calls = []

    def build(path):
        calls.append(path)
        time.sleep(0.05)
        _write(b'shared')(path)
    artifact = Cache(root).get('model', build, **CACHE_MATERIAL)
    results.put(((artifact / 'weights.bin').read_bytes(), len(calls)))


def test_main_jobs_sharing_a_cache_folder_build_each_entry_once(tmp_path, fault_cases):
    context = multiprocessing.get_context('fork')
    for trial in range(10):
        fault_cases()
        results = context.Queue()
        jobs = [context.Process(target=_cache_get, args=(tmp_path / f'cache-{trial}', results)) for _ in range(3)]
        for job in jobs:
            job.start()
        outcomes = [results.get(timeout=30) for _ in jobs]
        for job in jobs:
            job.join()
        assert [content for content, _ in outcomes] == [b'shared'] * 3
        assert sum(calls for _, calls in outcomes) == 1


def _first_build(path, build, results):
    try:
        MultiVectorIndex(path, verbose=False).index(records(30, seed=build, prefix=f'b{build}'))
        results.put(build)
    except FileExistsError:
        results.put(None)


def test_concurrent_first_builds(tmp_path, fault_cases):
    """Two processes build one new index with overwrite=False: one builds it, the other is refused."""
    context = multiprocessing.get_context('fork')
    for trial in range(20):
        fault_cases()
        path, results = tmp_path / f'index-{trial}', context.Queue()
        builders = [context.Process(target=_first_build, args=(path, build, results)) for build in (1, 2)]
        for builder in builders:
            builder.start()
        for builder in builders:
            builder.join()
        winners = [w for w in (results.get(timeout=5), results.get(timeout=5)) if w is not None]
        assert len(winners) == 1
        assert MultiVectorIndex(path).payload()[3].fwd[0] == f'b{winners[0]}-0'


def tagged_build(build: int, count: int = 400):
    """Documents ``b<build>-<i>`` whose vectors are all ``build + i / 1000``: a mix of builds shows."""
    return [{'docno': f'b{build}-{i}', 'doc_embs': np.full((1 + i % 2, DIM), build + i / 1000, dtype=np.float32)}
            for i in range(count)]


def _overwrite(path, builds, stop):
    while not stop.is_set():
        for build in builds:
            MultiVectorIndex(path, verbose=False).indexer(overwrite=True).index(tagged_build(build))


def test_readers_during_concurrent_overwrites_see_one_whole_build(tmp_path, fault_cases):
    """Two processes overwrite one index again and again while this one opens and searches it: each open gives
    one whole build (docnos and vectors, exact and approximate results) or a clear error."""
    path = tmp_path / 'index'
    MultiVectorIndex(path, verbose=False).index(tagged_build(1))
    context = multiprocessing.get_context('fork')
    stop = context.Event()
    writers = [context.Process(target=_overwrite, args=(path, builds, stop)) for builds in ((2, 3), (4, 5))]
    for writer in writers:
        writer.start()
    query = pd.DataFrame({'qid': ['q'], 'query': 'x', 'query_embs': [np.ones((1, DIM), dtype=np.float32)]})
    opens, refused, deadline = 0, 0, time.monotonic() + 4
    try:
        while time.monotonic() < deadline or opens <= 10:  # a loaded machine opens fewer in the 4 s
            fault_cases()
            opens += 1
            index = MultiVectorIndex(path, verbose=False)
            try:
                meta, vectors, offsets, docnos = index.payload()
                builds = {docno.split('-')[0] for docno in docnos.fwd[np.arange(meta['doc_count'])]}
                assert len(builds) == 1
                build = int(next(iter(builds))[1:])
                expected = build + np.repeat(np.arange(meta['doc_count']) / 1000, 1 + np.arange(meta['doc_count']) % 2)
                np.testing.assert_allclose(np.asarray(vectors)[:, 0], expected, rtol=1e-6)
                for search in (index.retriever(num_results=3),  # follows the index to a newer build: one whole too
                               index.ann_retriever(num_results=3, ann='flat', candidates=16)):
                    out = search(query)
                    build = int(out['docno'][0].split('-')[0][1:])
                    assert out['docno'].tolist() == [f'b{build}-{i}' for i in (399, 398, 397)]
                    np.testing.assert_allclose(out['score'], DIM * (build + np.array([399, 398, 397]) / 1000),
                                               rtol=1e-5)
            except CorruptIndexError as e:
                assert 'replaced by another build' in str(e), str(e)
                refused += 1
    finally:
        stop.set()
        for writer in writers:
            writer.join(60)
    assert refused < opens


KILLED_BUILD_DOCS = 4000


def _build_and_wait(path, sharded):
    docs = tagged_build(9, KILLED_BUILD_DOCS)
    if sharded:
        ShardedMultiVectorIndex(path, verbose=False).indexer(shard_size=1000, overwrite=True).index(docs)
    else:
        MultiVectorIndex(path, verbose=False).indexer(overwrite=True).index(docs)


@pytest.mark.parametrize('cls', [MultiVectorIndex, ShardedMultiVectorIndex])
def test_builds_killed_at_random_points(tmp_path, fault_cases, cls):
    """A build killed at a random point leaves the old index or the new one, whole; the next build succeeds."""
    context = multiprocessing.get_context('fork')
    sharded = cls is ShardedMultiVectorIndex
    start = time.perf_counter()
    whole = context.Process(target=_build_and_wait, args=(tmp_path / 'timed', sharded))
    whole.start()
    whole.join()
    duration = time.perf_counter() - start
    outcomes = []
    for case, delay in enumerate(np.random.default_rng(0).uniform(0, 1.2 * duration, size=8)):
        fault_cases()
        path = tmp_path / f'case-{case}'
        cls(path, verbose=False).index(tagged_build(1, 20))
        builder = context.Process(target=_build_and_wait, args=(path, sharded))
        builder.start()
        time.sleep(delay)
        os.kill(builder.pid, signal.SIGKILL)
        builder.join()
        meta, _, _, docnos = cls(path, verbose=False).payload()
        outcomes.append(meta['doc_count'])
        assert (meta['doc_count'], docnos.fwd[meta['doc_count'] - 1]) in \
            ((20, 'b1-19'), (KILLED_BUILD_DOCS, f'b9-{KILLED_BUILD_DOCS - 1}'))
        cls(path, verbose=False).verify()
        rebuilt = cls(path, verbose=False).indexer(overwrite=True).index(tagged_build(2, 5))
        assert len(rebuilt) == 5
        assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f'.case-{case}')) == []
    assert 20 in outcomes, 'no kill interrupted a build'



def _parallel_build(path):
    rng = np.random.default_rng(0)
    docs = ({'docno': f'd{i}', 'doc_embs': rng.standard_normal((4, 64), dtype=np.float32)} for i in range(200_000))
    ShardedMultiVectorIndex(path, verbose=False).indexer(shard_size=25_000, processes=2, overwrite=True).index(docs)


def test_killed_parallel_builds_leave_no_worker_busy_or_idle(tmp_path, fault_cases):
    """A parallel build SIGKILLed at random points, with its workers reading, writing or waiting: within seconds no
    process of the build is left (a busy worker used to outlive it, blocked on its task pipe)."""
    psutil = pytest.importorskip('psutil')
    context = multiprocessing.get_context('fork')
    workers_seen = 0
    for case, delay in enumerate(np.random.default_rng(1).uniform(0, 3, size=6)):
        fault_cases()
        builder = context.Process(target=_parallel_build, args=(tmp_path / f'case-{case}',))
        builder.start()
        parent = psutil.Process(builder.pid)
        deadline = time.monotonic() + 60
        while not parent.children() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(delay)
        workers = parent.children(recursive=True)
        os.kill(builder.pid, signal.SIGKILL)
        builder.join()
        workers_seen += len(workers)
        _, alive = psutil.wait_procs(workers, timeout=5)
        for survivor in alive:
            survivor.kill()  # not left behind by a failing run
        assert alive == [], f'case {case} (killed {delay:.2f}s after its first worker started): {alive} outlived it'
    assert workers_seen >= 6, 'the kills did not find the workers running'


def numbered(numbers) -> list:
    """Documents ``u<n>`` whose vectors are drawn from seed ``n``: the same number, the same document."""
    return [{'docno': f'u{n}', 'doc_embs': np.random.default_rng(n).normal(size=(1 + n % 3, DIM)).astype(np.float32)}
            for n in numbers]


UPDATES = st.lists(st.tuples(st.sampled_from(['add', 'remove']), st.lists(st.integers(0, 24), min_size=1,
                                                                            max_size=5)), min_size=1, max_size=4)


@pytest.mark.parametrize('cls', [MultiVectorIndex, ShardedMultiVectorIndex])
@settings(max_examples=12, **FAST)
@given(updates=UPDATES)
def test_generated_updates_rank_as_a_fresh_build_or_are_refused(tmp_path_factory, fault_cases, cls, updates):
    """Generated sequences of additions and removals, duplicate and unknown docnos among them: each update is made
    whole or refused with the index as it was, and the index then ranks as a fresh build of its documents."""
    path = tmp_path_factory.mktemp('updates') / 'index'
    indexer = cls(path, verbose=False).indexer(**({'shard_size': 4} if cls is ShardedMultiVectorIndex else {}))
    index = indexer.index(numbered(range(8)))
    held = list(range(8))
    for action, numbers in updates:
        fault_cases()
        build_id = index.payload()[0]['build_id']
        if action == 'add':
            refused = len(set(numbers)) < len(numbers) or bool(set(numbers) & set(held))
            update, error = functools.partial(index.add_documents, numbered(numbers)), ValueError
        else:
            refused = not set(numbers) <= set(held) or set(numbers) >= set(held)
            update = functools.partial(index.remove_documents, [f'u{n}' for n in numbers])
            error = (KeyError, ValueError)
        if refused:
            with pytest.raises(error):
                update()
            assert index.payload()[0]['build_id'] == build_id
            continue
        update()
        held = held + list(numbers) if action == 'add' else [n for n in held if n not in numbers]
    index = cls(path, verbose=False)
    assert [d['docno'] for d in index.get_corpus_iter(verbose=False)] == [f'u{n}' for n in held]
    fresh = MultiVectorIndex(path.parent / 'fresh', verbose=False).index(numbered(held))
    expected = fresh.retriever(num_results=10)(QUERIES)
    pd.testing.assert_frame_equal(index.retriever(num_results=10)(QUERIES), expected)
    index.verify()


def _update_forever(path, sharded):
    index = (ShardedMultiVectorIndex if sharded else MultiVectorIndex)(path, verbose=False)
    step = 0
    while True:
        step += 1
        index.add_documents(tagged_build(10 + step, 300))
        index.remove_documents([f'b{10 + step}-{i}' for i in range(0, 300, 2)])


@pytest.mark.parametrize('cls', [MultiVectorIndex, ShardedMultiVectorIndex])
def test_updates_killed_at_random_points(tmp_path, fault_cases, cls):
    """A process adding and removing documents, killed at a random point: the index opens, verifies and holds the
    documents of a whole update (each removal takes the even-numbered half of the last addition), and ranks as a
    fresh build of them."""
    context = multiprocessing.get_context('fork')
    sharded = cls is ShardedMultiVectorIndex
    counts = set()
    for case, delay in enumerate(np.random.default_rng(2).uniform(0.05, 2.0, size=6)):
        fault_cases()
        path = tmp_path / f'case-{case}'
        (cls(path, verbose=False).indexer(shard_size=200) if sharded else cls(path, verbose=False).indexer()).index(
            tagged_build(1, 200))
        writer = context.Process(target=_update_forever, args=(path, sharded))
        writer.start()
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        index = cls(path, verbose=False)
        index.verify()
        docnos = [d['docno'] for d in index.get_corpus_iter(verbose=False)]
        last = max(int(d.split('-')[0][1:]) for d in docnos)
        tail = [d for d in docnos if d.startswith(f'b{last}-')]
        assert docnos[:200] == [f'b1-{i}' for i in range(200)]
        assert len(tail) in (150, 300) or last == 1, (case, len(tail))  # after an addition, or after its removal
        counts.add(len(docnos))
        fresh = MultiVectorIndex(tmp_path / f'fresh-{case}', verbose=False).index(
            list(index.get_corpus_iter(verbose=False)))
        pd.testing.assert_frame_equal(index.retriever(num_results=10)(QUERIES),
                                      fresh.retriever(num_results=10)(QUERIES))
        index.add_documents(tagged_build(99, 3))   # the next update clears what the killed one left
        left = [p.name for p in tmp_path.iterdir() if p.name.startswith(f'.case-{case}') and p.suffix != '.lock']
        assert left == []
    assert len(counts) > 1, 'every kill found the same state'
