"""The index over Ray: every retriever ranks and scores as the same index in one process, bit for bit; an actor
killed mid-batch is restarted and its part retried, past the bound a clear error; a sharded index built by Ray tasks
is the one-process build, and a failing task leaves nothing. Ray runs locally on 2 CPUs, started once per module."""
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.index import MultiVectorIndex, ShardedMultiVectorIndex, ShardUnavailableError

ROOT = Path(__file__).resolve().parents[1]
DIM = 8


def documents(start, stop, seed=0):
    """Documents ``start`` to ``stop - 1`` of 1 to 6 Gaussian vectors, each from its own seed."""
    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])
        yield {'docno': f'd{i}', 'doc_embs': rng.normal(size=(rng.integers(1, 7), DIM)).astype(np.float32)}


def topics(count=12, seed=1):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({'qid': [f'q{i}' for i in range(count)], 'query': 'x',
                         'query_embs': [rng.normal(size=(rng.integers(1, 8), DIM)).astype(np.float32)
                                        for _ in range(count)]})


@pytest.fixture(scope='module')
def ray():
    ray = pytest.importorskip('ray', reason="Ray is not installed (pip install 'pyterrier-multiquery[ray]')")
    # the workers import this checkout, as the tests do
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={'env_vars': {'PYTHONPATH': str(ROOT)}})
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the tasks' parts call this module's functions
    yield ray
    ray.shutdown()


@pytest.fixture(scope='module')
def indexes(ray, tmp_path_factory):
    """One index of 150 documents in 3 shards, searched in this process and by its default actors, one per shard
    (`faulty` groups the shards unevenly over 2 actors, and a one-shard index has its own test)."""
    folder = tmp_path_factory.mktemp('ray')
    sharded = ShardedMultiVectorIndex(folder / 'sharded', verbose=False).indexer(num_shards=3).index(
        list(documents(0, 150)))
    # 3 actors here and 2 more in `faulty` at once on 2 CPUs: each reserves a fifth of one
    return sharded, sharded.ray(num_cpus=0.2)


RETRIEVERS = {
    'exact': lambda index: index.maxsim_retriever(num_results=40),
    'exact sum': lambda index: index.maxsim_retriever(num_results=40, aggregate='sum'),
    # blocks and tiles smaller than a shard
    'exact small blocks': lambda index: index.maxsim_retriever(num_results=200, block_vectors=70, tile_bytes=900),
    'flat': lambda index: index.ann_retriever(ann='flat', candidates=6, num_results=30),
    'flat SQ8': lambda index: index.ann_retriever(ann='flat', quantizer='SQ8', candidates=6,
                                                     num_results=30),
    'ivf SQ8': lambda index: index.ann_retriever(ann='ivf', candidates=6, num_results=30),
    'ivf Flat': lambda index: index.ann_retriever(ann='ivf', quantizer='Flat', candidates=6,
                                                     num_results=30, batch_size=5, tile_bytes=2000),
    'hnsw': lambda index: index.ann_retriever(ann='hnsw', candidates=6, num_results=30),
    'multiquery round_robin': lambda index: index.multiquery_retriever('round_robin', num_results=25),
    'multiquery score_sum': lambda index: index.multiquery_retriever('score_sum', num_results=25),
    'multiquery rrf': lambda index: index.multiquery_retriever('rrf', num_results=25),
    'multiquery approximate': lambda index: index.multiquery_retriever(num_results=25, search='ann', ann='flat',
                                                                       candidates=4),
    'mean': lambda index: index.mean_retriever(num_results=20),
    'mean normalised': lambda index: index.mean_retriever(num_results=20, normalise=True),
}


@pytest.mark.parametrize('kind', list(RETRIEVERS))
def test_every_retriever_ranks_and_scores_as_one_process(indexes, kind):
    sharded, over_ray = indexes
    queries = topics()
    expected = RETRIEVERS[kind](sharded)(queries)
    assert len(expected) > 0 and expected['score'].nunique() > 20  # a ranking, not a trivial frame
    pd.testing.assert_frame_equal(RETRIEVERS[kind](over_ray)(queries), expected, check_exact=True)


def test_the_scorer_scores_as_one_process_and_names_an_unknown_docno(indexes):
    sharded, over_ray = indexes
    assert over_ray.num_actors == 3  # the default: an actor for each shard
    results = sharded.maxsim_retriever(num_results=60)(topics()).assign(score=0.)
    expected = sharded.scorer()(results)
    numbers = expected['docno'].str[1:].astype(int)
    assert numbers.min() < 50 and numbers.max() >= 100  # documents of the first and the last shard
    pd.testing.assert_frame_equal(over_ray.scorer()(results), expected, check_exact=True)
    with pytest.raises(KeyError, match="docno 'nope' is not in the index"):
        over_ray.scorer()(results.assign(docno=results['docno'].where(results.index != 7, 'nope')))


def test_a_one_shard_index_over_ray(ray, tmp_path):
    index = MultiVectorIndex(tmp_path / 'one', verbose=False).index(list(documents(0, 40)))
    over_ray = index.ray(num_cpus=0.2)
    try:
        assert (over_ray.num_actors, len(over_ray), over_ray.shard_paths) == (1, 40, [index.path])
        for kind in ('exact', 'ivf SQ8', 'multiquery rrf', 'mean'):
            pd.testing.assert_frame_equal(RETRIEVERS[kind](over_ray)(topics()), RETRIEVERS[kind](index)(topics()),
                                          check_exact=True)
    finally:
        over_ray.close()


def test_arguments_are_checked(indexes):
    sharded, _ = indexes
    for bad in (0, 4, 1.5, True):
        with pytest.raises(ValueError, match=f'num_actors must be an integer from 1 to the 3 shards of the index, '
                                             f'got {bad!r}'):
            sharded.ray(num_actors=bad)
    with pytest.raises(ValueError, match='retries must be a non-negative integer, got -1'):
        sharded.ray(retries=-1)
    with pytest.raises(TypeError, match='actor_class must be ShardActor or a subclass of it, got <class .dict.>'):
        sharded.ray(actor_class=dict)


def crashing_actor(fault_file):
    """A ShardActor whose process ends after its first shard's part of a call (a crash mid-batch) while
    ``fault_file`` holds a positive count, which each crash decrements (restarts keep the file)."""
    from pyterrier_multiquery.index.distributed import ShardActor

    class CrashingShardActor(ShardActor):
        def searched(self, searcher, method, shard_args, args, kwargs):
            result = super().searched(searcher, method, shard_args, args, kwargs)
            with open(fault_file, 'r+') as counter:
                fcntl.flock(counter, fcntl.LOCK_EX)  # one actor at a time
                count = int(counter.read() or 0)
                if count <= 0:
                    return result
                counter.seek(0)
                counter.write(str(count - 1))
                counter.truncate()
            os._exit(1)

    return CrashingShardActor


@pytest.fixture
def faulty(indexes, tmp_path):
    """The sharded index over 2 actors (shards 0 and 1; shard 2) that crash mid-call while the count in the file
    (0 at first) is positive."""
    sharded, _ = indexes
    fault_file = tmp_path / 'crashes'
    fault_file.write_text('0')
    index = sharded.ray(num_actors=2, num_cpus=0.2, retries=2, actor_class=crashing_actor(str(fault_file)))
    yield sharded, index, fault_file
    index.close()


def test_an_actor_killed_mid_batch_is_restarted_and_the_batch_retried(faulty, ray):
    sharded, index, fault_file = faulty
    queries = topics()
    expected = sharded.maxsim_retriever(num_results=40)(queries)
    pids = ray.get([actor.ready.remote() for actor in index.actors])
    fault_file.write_text('2')  # the first two calls to reach a shard end their actor's process after one shard
    out = index.maxsim_retriever(num_results=40)(queries)
    assert fault_file.read_text() == '0'  # both crashes happened
    pd.testing.assert_frame_equal(out, expected, check_exact=True)
    restarted = ray.get([actor.ready.remote() for actor in index.actors])
    assert set(restarted) != set(pids)
    # an actor ended from outside, between batches, is restarted as well
    ray.kill(index.actors[1], no_restart=False)
    pd.testing.assert_frame_equal(index.maxsim_retriever(num_results=40)(queries), expected, check_exact=True)


def test_past_the_retries_the_error_names_the_shard_and_nothing_is_returned(faulty):
    _, index, fault_file = faulty
    fault_file.write_text('100')  # every call crashes
    with pytest.raises(ShardUnavailableError, match=r"the Ray actor holding shard (0 \('.*shard-000'\), 1 \('.*"
                                                    r"shard-001'\)|2 \('.*shard-002'\)) died 3 times during one exact "
                                                    r"call \(retries=2\); no results are returned"):
        index.maxsim_retriever(num_results=40)(topics())
    fault_file.write_text('0')  # the actors come back
    assert len(index.maxsim_retriever(num_results=40)(topics())) == 12 * 40


def test_ray_tasks_build_the_sharded_index_of_one_process(ray, tmp_path):
    parts = [(0, 50), (50, 110), (110, 150)]
    expected = ShardedMultiVectorIndex.from_shards(
        tmp_path / 'one', [MultiVectorIndex(tmp_path / f'part{i}', verbose=False).index(list(documents(a, b))).path
                           for i, (a, b) in enumerate(parts)], verbose=False)
    index = ShardedMultiVectorIndex(tmp_path / 'ray', verbose=False).ray_indexer(num_cpus=0.5).index(
        # a function called in the task, or the records themselves
        [lambda: documents(0, 50), list(documents(50, 110)), pd.DataFrame(list(documents(110, 150)))])
    assert [len(shard) for shard in index.shards()] == [50, 60, 40]
    meta, vectors, offsets, docnos = index.payload()
    expected_meta, expected_vectors, expected_offsets, expected_docnos = expected.payload()
    assert (meta['doc_count'], meta['vec_count']) == (expected_meta['doc_count'], expected_meta['vec_count'])
    np.testing.assert_array_equal(offsets, expected_offsets)
    np.testing.assert_array_equal(vectors[0:len(vectors)], expected_vectors[0:len(expected_vectors)])
    assert docnos.fwd[np.arange(150)].tolist() == [f'd{i}' for i in range(150)]
    assert sorted(p.name for p in (tmp_path / 'ray').iterdir()) == ['pt_meta.json', 'shard-000', 'shard-001',
                                                                      'shard-002']


def bad_part():
    yield {'docno': 'x1', 'doc_embs': np.ones((2, DIM))}
    yield {'docno': 'x2', 'doc_embs': np.ones((2, DIM + 1))}


def test_a_failing_task_leaves_nothing(ray, tmp_path):
    indexer = ShardedMultiVectorIndex(tmp_path / 'index', verbose=False).ray_indexer(num_cpus=0.5)
    with pytest.raises(ValueError, match="document 'x2' has vectors of size 9, expected 8") as failure:
        indexer.index([lambda: documents(0, 30), bad_part, lambda: documents(30, 60)])
    assert 'in the Ray task shard-001' in failure.value.__notes__
    assert list(tmp_path.iterdir()) == []  # no index, no temporary folder
    with pytest.raises(ValueError, match="docno 'd3' occurs in shard-000 and shard-001"):
        indexer.index([lambda: documents(0, 10), lambda: documents(3, 5)])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match='nothing to index: no parts were given'):
        indexer.index([])


def slow_part():
    """A part whose documents come after a minute of interruptible work: a task a failure elsewhere must stop."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.01)
    return list(documents(0, 5))


def test_a_failing_task_interrupts_the_tasks_still_running(ray, tmp_path):
    # a tenth of a CPU each: both run at once beside the module's actors
    indexer = ShardedMultiVectorIndex(tmp_path / 'index', verbose=False).ray_indexer(num_cpus=0.1)
    start = time.monotonic()
    with pytest.raises(ValueError, match="document 'x2' has vectors of size 9, expected 8"):
        indexer.index([slow_part, bad_part])
    assert time.monotonic() - start < 30  # the slow task was interrupted, not waited for
    assert list(tmp_path.iterdir()) == []
    assert len(indexer.index([lambda: documents(0, 5)])) == 5  # the interrupted task's worker serves on


def test_the_index_never_imports_ray(tmp_path):
    code = ('import sys, numpy as np, pandas as pd\n'
            'from pyterrier_multiquery.index import ShardedMultiVectorIndex\n'
            'index = ShardedMultiVectorIndex(sys.argv[1], verbose=False).indexer(num_shards=2).index('
            f'[{{"docno": f"d{{i}}", "doc_embs": np.ones((2, {DIM})) * i}} for i in range(6)])\n'
            f'index.maxsim_retriever(num_results=3)(pd.DataFrame({{"qid": ["q"], "query_embs": [np.ones((1, {DIM}))]}}'
            '))\n'
            'print("ray" in sys.modules)')
    result = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'index')], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'False'


def test_an_actor_refuses_a_shard_copy_that_is_not_the_indexed_one(ray, tmp_path):
    from pyterrier_multiquery.index import CorruptIndexError
    from pyterrier_multiquery.index.distributed import ShardActor
    shard = MultiVectorIndex(tmp_path / 'shard', verbose=False).index(list(documents(0, 5)))
    build_id = shard.payload()[0]['build_id']
    assert len(ShardActor([(MultiVectorIndex, str(shard.path), build_id, 10)]).searchers) == 1
    with pytest.raises(CorruptIndexError, match=r"shard '.*shard' on the node .* is not the shard the sharded index "
                                                r"was built with \(its build id differs\): copy it again"):
        ShardActor([(MultiVectorIndex, str(shard.path), 'another build', 10)])


def test_documents_added_and_removed_over_ray_rank_as_one_fresh_index(ray, tmp_path):
    sharded = ShardedMultiVectorIndex(tmp_path / 'sharded', verbose=False).indexer(num_shards=2).index(
        list(documents(0, 60)))
    over_ray = sharded.ray(num_cpus=0.2)
    try:
        over_ray.add_documents(list(documents(60, 80)))
        assert (over_ray.num_actors, len(over_ray)) == (2, 80) and len(over_ray.shard_paths) == 3
        removed = [f'd{i}' for i in range(0, 80, 4)]
        over_ray.remove_documents(removed)
        fresh = MultiVectorIndex(tmp_path / 'fresh', verbose=False).index(
            [d for d in documents(0, 80) if d['docno'] not in removed])
        for kind in ('exact', 'flat', 'mean'):
            pd.testing.assert_frame_equal(RETRIEVERS[kind](over_ray)(topics()), RETRIEVERS[kind](fresh)(topics()),
                                          check_exact=True)
    finally:
        over_ray.close()
