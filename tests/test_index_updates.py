"""Documents added to and removed from an index: rankings equal a fresh build's, bad updates leave it as it was."""
import multiprocessing
import os
import signal
import time

import numpy as np
import pandas as pd
import pytest

pytest.importorskip('torch')

from pyterrier_multiquery.index import MultiVectorIndex  # noqa: E402


def documents(count: int, first: int = 0, seed: int = 0, dim: int = 8) -> list:
    """``count`` documents of 1 to 5 random vectors each, docnos ``d<first>``, ..."""
    rng = np.random.default_rng(seed)
    return [{'docno': f'd{first + i}', 'doc_embs': rng.standard_normal((int(rng.integers(1, 6)), dim))
             .astype(np.float32)} for i in range(count)]


def queries(count: int = 10, dim: int = 8) -> pd.DataFrame:
    rng = np.random.default_rng(9)
    return pd.DataFrame({'qid': [f'q{i}' for i in range(count)],
                         'query_embs': [rng.standard_normal((3, dim)).astype(np.float32) for _ in range(count)]})


def rankings(index) -> pd.DataFrame:
    return index.retriever(num_results=20)(queries())[['qid', 'docno', 'score', 'rank']]


def test_added_and_removed_documents_rank_as_a_fresh_build_of_the_same_documents(tmp_path):
    first, more = documents(40), documents(25, first=40, seed=1)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(first)
    before = rankings(index)
    build_id = index.payload()[0]['build_id']
    index.add_documents(more)
    assert index.payload()[0]['build_id'] != build_id and len(index) == 65
    fresh = MultiVectorIndex(tmp_path / 'fresh', verbose=False).index(first + more)
    pd.testing.assert_frame_equal(rankings(index), rankings(fresh))
    gone = [f'd{i}' for i in range(0, 65, 3)]
    index.remove_documents(gone)
    kept = [d for d in first + more if d['docno'] not in gone]
    fresh = MultiVectorIndex(tmp_path / 'fresh', verbose=False).indexer(overwrite=True).index(kept)
    pd.testing.assert_frame_equal(rankings(index), rankings(fresh))
    assert not set(rankings(index)['docno']) & set(gone) and len(index) == len(kept)
    index.verify()
    assert not rankings(index).equals(before)


def test_a_bad_update_names_its_problem_and_leaves_the_index_as_it_was(tmp_path):
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(documents(10))
    before, build_id = rankings(index), index.payload()[0]['build_id']
    with pytest.raises(ValueError, match="docno 'd3' is in the index .* already: remove it first"):
        index.add_documents(documents(2, first=20) + documents(1, first=3))
    with pytest.raises(ValueError, match="docno 'd20' occurs more than once"):
        index.add_documents(documents(1, first=20) + documents(1, first=20, seed=2))
    with pytest.raises(ValueError, match='has vectors of size 4, expected 8'):
        index.add_documents(documents(1, first=30, dim=4))
    with pytest.raises(KeyError, match="docno 'x' is not in the index"):
        index.remove_documents(['d1', 'x'])
    with pytest.raises(TypeError, match=r"the single string 'd1': pass \['d1'\]"):   # not d and 1
        index.remove_documents('d1')
    with pytest.raises(ValueError, match='removing every document'):
        index.remove_documents([f'd{i}' for i in range(10)])
    assert index.payload()[0]['build_id'] == build_id
    pd.testing.assert_frame_equal(rankings(index), before)
    assert sorted(p.name for p in index.path.parent.iterdir()) == ['index']   # no temporary folder left


def _add_forever(path: str, started) -> None:
    index = MultiVectorIndex(path, verbose=False)
    started.set()
    while True:
        index.add_documents(documents(2000, first=10_000 + len(index), seed=len(index)))


@pytest.mark.parametrize('delay', [0.2, 0.6, 1.1])
def test_an_update_killed_midway_leaves_the_index_as_before_or_after(tmp_path, delay):
    """A process adding documents is SIGKILLed at a point of its loop: the index opens, verifies and ranks as the
    whole of one of its builds, and the next update removes what the killed one left beside it."""
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(documents(500))
    context = multiprocessing.get_context('spawn')
    started = context.Event()
    writer = context.Process(target=_add_forever, args=(str(index.path), started))
    writer.start()
    started.wait(60)
    time.sleep(delay)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    survivor = MultiVectorIndex(tmp_path / 'index', verbose=False)
    survivor.verify()
    count = len(survivor)
    assert count >= 500 and (count - 500) % 2000 == 0
    fresh = MultiVectorIndex(tmp_path / 'fresh', verbose=False).index(
        list(survivor.get_corpus_iter(verbose=False)))
    pd.testing.assert_frame_equal(rankings(survivor), rankings(fresh))
    survivor.add_documents(documents(1, first=99_999))
    assert len(survivor) == count + 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith('.lock')) == ['fresh', 'index']


@pytest.mark.parametrize('docnos', [[f'd{i}' for i in range(500)] + ['d99999'],
                                    [f'{i:05d}' for i in range(700)] + ['99999999']])
def test_a_run_of_numbered_docnos_then_another_docno_is_found(tmp_path, docnos):
    """npids 0.1.3's integer-sequence codecs lose the inverse lookup of a lone id after a numbered run (an index of
    d0 ... d499 given d99999 reported it as occurring twice): the index leaves them out."""
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(
        {'docno': d, 'doc_vec': np.ones(4, dtype=np.float32)} for d in docnos)
    _, _, _, lookup = index.payload()
    assert list(lookup.fwd[np.arange(len(docnos))]) == docnos
    assert list(lookup.inv[docnos]) == list(range(len(docnos)))


def test_a_sharded_index_grows_by_shards_and_ranks_as_one_fresh_index(tmp_path):
    from pyterrier_multiquery.index import ShardedMultiVectorIndex
    first, more, last = documents(30), documents(12, first=30, seed=1), documents(7, first=42, seed=2)
    sharded = ShardedMultiVectorIndex(tmp_path / 'sharded', verbose=False).indexer(shard_size=10).index(first)
    sharded.add_documents(more)
    sharded.add_documents(last)
    assert [len(s) for s in sharded.shards()] == [10, 10, 10, 12, 7]
    fresh = MultiVectorIndex(tmp_path / 'fresh', verbose=False).index(first + more + last)
    pd.testing.assert_frame_equal(rankings(sharded), rankings(fresh))
    gone = [f'd{i}' for i in range(10, 20)] + ['d3', 'd45']   # the whole second shard, and one of two others
    sharded.remove_documents(gone)
    kept = [d for d in first + more + last if d['docno'] not in gone]
    assert [len(s) for s in sharded.shards()] == [9, 10, 12, 6]
    fresh = MultiVectorIndex(tmp_path / 'fresh', verbose=False).indexer(overwrite=True).index(kept)
    pd.testing.assert_frame_equal(rankings(sharded), rankings(fresh))
    sharded.compact(shard_size=20)
    assert [len(s) for s in sharded.shards()] == [20, 17]
    pd.testing.assert_frame_equal(rankings(sharded), rankings(fresh))
    sharded.verify()
    with pytest.raises(ValueError, match="docno 'd1' is in the index .* already"):
        sharded.add_documents(documents(1, first=1))
    with pytest.raises(KeyError, match="docno 'd10' is not in the index"):
        sharded.remove_documents(['d10'])
    with pytest.raises(TypeError, match="the single string 'd11'"):
        sharded.remove_documents('d11')
    with pytest.raises(ValueError, match='removing every document'):
        sharded.remove_documents([d['docno'] for d in kept])
    pd.testing.assert_frame_equal(rankings(sharded), rankings(fresh))


def _add_in_steps(path: str, steps: int) -> None:
    index = MultiVectorIndex(path, verbose=False)
    for step in range(steps):
        index.add_documents(documents(300, first=1000 + 300 * step, seed=10 + step))


def test_readers_during_updates_see_one_whole_build_each_time(tmp_path):
    """A process adds documents in five steps while this one searches again and again: every ranking is that of a
    fresh build of the documents of one of the six states (none mixes two builds, none fails)."""
    base = documents(400)
    added = [documents(300, first=1000 + 300 * step, seed=10 + step) for step in range(5)]
    expected = []
    for state in range(6):
        fresh = MultiVectorIndex(tmp_path / f'fresh{state}', verbose=False).index(
            base + [d for part in added[:state] for d in part])
        expected.append(rankings(fresh))
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(base)
    writer = multiprocessing.get_context('spawn').Process(target=_add_in_steps, args=(str(index.path), 5))
    writer.start()
    seen = set()
    while writer.is_alive() or len(seen) < 1:
        run = rankings(index)
        matches = [state for state, ranking in enumerate(expected) if ranking.equals(run)]
        assert len(matches) == 1, 'a search mixed two builds or matched none'
        seen.add(matches[0])
    writer.join()
    assert writer.exitcode == 0
    pd.testing.assert_frame_equal(rankings(index), expected[5])
    assert len(seen) >= 2   # the searches ran across updates
