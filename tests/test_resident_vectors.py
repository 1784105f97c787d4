"""Stored vectors kept resident on the search device (a GPU's memory, where they fit): the searches index the
resident tensor instead of reading the memory-mapped file, and rank and score exactly as they do from the file.
On the CPU the rule never keeps them, so these tests make it keep them there to run the same code."""
import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index import shardwise


def collection(seed, count=300):
    rng = np.random.default_rng(seed)
    return [{'docno': f'd{i}', 'doc_embs': rng.normal(size=(int(rng.integers(1, 9)), 16)).astype(np.float32)}
            for i in range(count)]


@pytest.fixture
def index_and_topics(tmp_path):
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(collection(0))
    rng = np.random.default_rng(1)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(12)],
                           'query_embs': [rng.normal(size=(int(rng.integers(1, 6)), 16)).astype(np.float32)
                                          for _ in range(12)]})
    return index, topics


def searches(index, topics):
    """Exact search, approximate search at a fixed candidate count, and the scorer on exact search's results."""
    exact = index.retriever(num_results=20, device='cpu')(topics)
    approx = index.ann_retriever(candidates=8, ann='flat', num_results=20, device='cpu')(topics)
    rescored = index.scorer(device='cpu')(exact[['qid', 'docno']].merge(topics, on='qid'))
    return exact, approx, rescored


def test_the_cpu_never_keeps_them():
    assert not shardwise.fits_on_device(1, 'cpu')


def test_resident_vectors_rank_and_score_as_the_file(index_and_topics, monkeypatch):
    index, topics = index_and_topics
    from_file = searches(index, topics)
    monkeypatch.setattr(shardwise, 'fits_on_device', lambda nbytes, device: True)
    resident = searches(index, topics)
    searcher = index.searchers().searchers[0]
    copy = searcher._resident['cpu'][1]
    np.testing.assert_array_equal(copy.numpy(), np.asarray(index.payload()[1]))
    searches(index, topics)
    assert searcher._resident['cpu'][1] is copy  # made once, kept while the index is unchanged
    for ours, theirs in zip(resident, from_file):
        pd.testing.assert_frame_equal(ours, theirs)


def test_a_rebuilt_index_replaces_its_resident_copy(index_and_topics, monkeypatch):
    index, topics = index_and_topics
    monkeypatch.setattr(shardwise, 'fits_on_device', lambda nbytes, device: True)
    index.retriever(num_results=5, device='cpu')(topics)
    MultiVectorIndex(index.path, verbose=False).indexer(overwrite=True).index(collection(2, count=40))
    after = index.retriever(num_results=5, device='cpu')(topics)
    fresh = MultiVectorIndex(index.path, verbose=False)
    monkeypatch.setattr(shardwise, 'fits_on_device', lambda nbytes, device: False)
    pd.testing.assert_frame_equal(after, fresh.retriever(num_results=5, device='cpu')(topics))
    assert set(after['docno']) <= {f'd{i}' for i in range(40)}
