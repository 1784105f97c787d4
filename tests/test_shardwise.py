"""The merges of the shards' parts of a search, on inputs small enough to work out by hand."""
import numpy as np

from pyterrier_multiquery.index.ann import merge_hits
from pyterrier_multiquery.index.maxsim import merge_top, shard_documents

INF = np.inf


def test_merge_top_takes_the_best_by_score_ties_by_shard_order():
    # two queries; shard 0 holds docids 0-9, shard 1 holds 10-19
    shard0 = (np.array([[5., 3., 1.], [2., -INF, -INF]], dtype=np.float32), np.array([[4, 2, 7], [1, -1, -1]]),
              np.array([3, 1]))
    shard1 = (np.array([[3., 2.], [9., 2.]], dtype=np.float32), np.array([[11, 15], [18, 12]]), np.array([2, 2]))
    scores, docids, counts = merge_top([shard0, shard1], 4)
    # query 0: 5 (4), then the tie at 3 in shard order: 2 before 11, then 2 (15); query 1: 9 (18), the tie at 2: 1
    # before 12, then nothing more (shard 0 had one result)
    np.testing.assert_array_equal(docids, [[4, 2, 11, 15], [18, 1, 12, -1]])
    np.testing.assert_array_equal(scores, np.array([[5, 3, 3, 2], [9, 2, 2, -INF]], dtype=np.float32))
    np.testing.assert_array_equal(counts, [4, 3])
    assert scores.dtype == np.float32
    assert merge_top([shard0], 4) is shard0  # one shard: its part as it is


def test_merge_top_ignores_what_lies_beyond_a_shards_count():
    # a row's entries past its count are not results, whatever they hold
    shard0 = (np.array([[4., 8.]], dtype=np.float32), np.array([[3, 6]]), np.array([1]))
    shard1 = (np.array([[5.]], dtype=np.float32), np.array([[12]]), np.array([1]))
    scores, docids, counts = merge_top([shard0, shard1], 3)
    np.testing.assert_array_equal(docids[:, :2], [[12, 3]])
    np.testing.assert_array_equal(counts, [2])


def test_shard_documents_keeps_a_shards_candidates_as_its_own_docids():
    docids = np.array([[0, 3, 10, 12, -1], [11, 19, -1, -1, -1], [2, -1, -1, -1, -1]])
    np.testing.assert_array_equal(shard_documents(docids, 10, 10), [[0, 2], [1, 9], [-1, -1]])
    np.testing.assert_array_equal(shard_documents(docids, 0, 10), [[0, 3], [-1, -1], [2, -1]])
    assert shard_documents(docids, 20, 5).shape == (3, 0)


def test_merge_hits_keeps_each_vectors_k_best_by_score():
    shard0 = (np.array([[0.9, 0.5], [0.4, -INF]], dtype=np.float32), np.array([[1, 0], [2, -1]]))
    shard1 = (np.array([[0.7, 0.5], [0.8, 0.1]], dtype=np.float32), np.array([[13, 12], [10, 11]]))
    scores, docids = merge_hits([shard0, shard1], 3)
    np.testing.assert_array_equal(docids, [[1, 13, 0], [10, 2, 11]])  # the tie at 0.5: shard 0 first
    np.testing.assert_array_equal(scores, np.array([[0.9, 0.7, 0.5], [0.8, 0.4, 0.1]], dtype=np.float32))
