"""The IVF candidate stage in torch (for a GPU that FAISS cannot search on), run on the CPU: its hits against a hand
-worked example, against the probed lists searched by brute force in NumPy, and wired into the approximate search."""
import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index.errors import CorruptIndexError

faiss = pytest.importorskip('faiss')
from pyterrier_multiquery.index import ann, device_ivf  # noqa: E402  (needs the dense extra)
from pyterrier_multiquery.index.device_ivf import DeviceIVF  # noqa: E402


def ivf_with_centroids(centroids: np.ndarray, vectors: np.ndarray, storage: str = 'Flat'):
    """A FAISS IVF index over ``vectors`` whose lists are the given centroids (no training of its own)."""
    quantizer = faiss.IndexFlatIP(centroids.shape[1])
    quantizer.add(centroids)
    if storage == 'Flat':
        index = faiss.IndexIVFFlat(quantizer, centroids.shape[1], len(centroids), faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexIVFScalarQuantizer(quantizer, centroids.shape[1], len(centroids),
                                              faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)  # the scalar quantizer's ranges; the lists are the centroids given
    index.add(vectors)
    return index


def test_hits_worked_out_by_hand():
    # list 0 around (1, 0): vectors 0 and 2; list 1 around (0, 1): vectors 1 and 3
    centroids = np.array([[1, 0], [0, 1]], dtype=np.float32)
    vectors = np.array([[1, 0.1], [0.2, 1], [0.9, -0.1], [-0.1, 0.8]], dtype=np.float32)
    stage = DeviceIVF(ivf_with_centroids(centroids, vectors), vectors, 'cpu', 2.0)
    assert stage.sizes.tolist() == [2, 2]
    query = np.array([[1, 0.5]], dtype=np.float32)  # nearer list 0 (1 against 0.5)
    scores, hits = stage.search(query, 3, 1)
    assert hits.tolist() == [[0, 2, -1]]  # only list 0's two members: 1.05 and 0.85, then nothing
    np.testing.assert_allclose(scores[0, :2], [1.05, 0.85], rtol=1e-6)
    assert np.isneginf(scores[0, 2])
    scores, hits = stage.search(query, 3, 2)  # both lists: v1 scores 0.7, v3 0.3
    assert hits.tolist() == [[0, 2, 1]]
    np.testing.assert_allclose(scores[0], [1.05, 0.85, 0.7], rtol=1e-6)


def test_a_zero_query_vector_finds_members_at_score_0_and_pads_with_no_hit():
    # list 0 holds vector 0, list 1 vectors 1 to 3; the first query probes list 1, so the tile is 3 members wide,
    # and the zero vector (all centroids tie at 0) probes one list: list 0 with this torch's tie order, so that two
    # of its three columns are padding, which its norm of 0 must leave at -inf (-inf times 0 is NaN)
    centroids = np.array([[1, 0], [0, 1]], dtype=np.float32)
    vectors = np.array([[1, 0.1], [0.2, 1], [-0.1, 0.8], [0.1, 0.9]], dtype=np.float32)
    queries = np.array([[0, 1], [0, 0]], dtype=np.float32)
    scores, hits = DeviceIVF(ivf_with_centroids(centroids, vectors), vectors, 'cpu', 2.0).search(queries, 3, 1)
    assert not np.isnan(scores).any()
    found = hits[1] >= 0
    assert (scores[1][found] == 0).all() and np.isneginf(scores[1][~found]).all()
    assert sorted(hits[1][found].tolist()) in ([0], [1, 2, 3])  # the members of the list it probed


def probed_brute_force(centroids, assignment, vectors, queries, k, nprobe):
    """Each query vector's ``k`` best stored vectors among those assigned to its ``nprobe`` best centroids, in NumPy."""
    probes = np.argsort(-(queries @ centroids.T), axis=1, kind='stable')[:, :nprobe]
    hits = np.full((len(queries), k), -1)
    for row, query in enumerate(queries):
        members = np.flatnonzero(np.isin(assignment, probes[row]))
        best = members[np.argsort(-(vectors[members] @ query), kind='stable')[:k]]
        hits[row, :len(best)] = best
    return hits


@pytest.mark.parametrize('storage', ['Flat', 'SQ8'])
@pytest.mark.parametrize('nprobe', [1, 3, 16])
def test_hits_are_the_best_members_of_the_probed_lists(storage, nprobe, monkeypatch):
    rng = np.random.default_rng(nprobe)
    centroids = rng.normal(size=(16, 12)).astype(np.float32)
    vectors = (centroids[rng.integers(0, 16, 900)] + rng.normal(size=(900, 12))).astype(np.float32)
    queries = rng.normal(size=(40, 12)).astype(np.float32)
    index = ivf_with_centroids(centroids, vectors, storage)
    _, assignment = index.quantizer.search(vectors, 1)
    monkeypatch.setattr(device_ivf, 'TILE_BYTES', 12 * 4 * 200)  # a few query vectors a tile
    scores, hits = DeviceIVF(index, vectors, 'cpu', 10.0).search(queries, 25, nprobe)
    # scored from the stored vectors, not from the 8-bit codes: the same hits whatever the storage
    np.testing.assert_array_equal(hits, probed_brute_force(centroids, assignment[:, 0], vectors, queries, 25, nprobe))
    expected = np.where(hits >= 0, np.einsum('qd,qkd->qk', queries, vectors[hits]), -np.inf)  # -1: none found
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)


def test_probing_every_list_finds_the_nearest_vectors():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(2000, 16)).astype(np.float32)
    index = faiss.index_factory(16, 'IVF20,Flat', faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    queries = rng.normal(size=(30, 16)).astype(np.float32)
    _, hits = DeviceIVF(index, vectors, 'cpu', 10.0).search(queries, 10, 50)  # more probes than lists: all of them
    np.testing.assert_array_equal(hits, np.argsort(-(queries @ vectors.T), axis=1, kind='stable')[:, :10])


def test_lists_of_other_vectors_are_refused():
    centroids = np.eye(2, dtype=np.float32)
    index = ivf_with_centroids(centroids, np.eye(2, dtype=np.float32))
    with pytest.raises(CorruptIndexError, match='not each of the 3 stored vectors once'):
        DeviceIVF(index, np.ones((3, 2), dtype=np.float32), 'cpu', 1.5)


def test_torch_is_chosen_for_an_ivf_stage_on_a_gpu_that_faiss_cannot_search_on(monkeypatch):
    vectors = np.zeros((10, 4), dtype=np.float32)
    monkeypatch.setattr(ann, 'fits_on_device', lambda nbytes, device: nbytes == 2 * 10 * 4)
    monkeypatch.setattr(ann, 'faiss_gpus', lambda: 0)
    assert ann.searched_in_torch('ivf', 'cuda', vectors) and ann.searched_in_torch('ivf', 'cuda:1', vectors)
    assert not ann.searched_in_torch('ivf', 'cpu', vectors)
    assert not ann.searched_in_torch('hnsw', 'cuda', vectors) and not ann.searched_in_torch('flat', 'cuda', vectors)
    monkeypatch.setattr(ann, 'fits_on_device', lambda nbytes, device: False)
    assert not ann.searched_in_torch('ivf', 'cuda', vectors)  # no room for the 16-bit copy: FAISS on the CPU
    monkeypatch.setattr(ann, 'fits_on_device', lambda nbytes, device: True)
    monkeypatch.setattr(ann, 'faiss_gpus', lambda: 1)
    assert not ann.searched_in_torch('ivf', 'cuda', vectors)  # FAISS's own GPU index


def test_the_approximate_search_through_the_torch_stage_ranks_as_through_faiss(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    docs = [{'docno': f'd{i}', 'doc_embs': rng.normal(size=(rng.integers(1, 6), 8)).astype(np.float32)}
            for i in range(400)]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(docs)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(12)],
                           'query_embs': [rng.normal(size=(3, 8)).astype(np.float32) for _ in range(12)]})
    setting = {'ann': 'ivf', 'quantizer': 'Flat', 'candidates': 20, 'search_effort': 4, 'num_results': 10,
               'device': 'cpu'}
    through_faiss = index.ann_retriever(**setting)(topics)
    monkeypatch.setattr(ann, 'searched_in_torch', lambda kind, device, vectors: True)
    stages = index.searchers().searchers[0]._stages
    stages.clear()  # the FAISS stage the first search kept
    through_torch = index.ann_retriever(**setting)(topics)
    assert [type(stage.ann) for _, stage in stages.values()] == [DeviceIVF]
    pd.testing.assert_frame_equal(through_torch, through_faiss)


def test_the_16_bit_format_follows_the_largest_norm_on_a_gpu_only():
    import torch
    assert device_ivf.stored_dtype('cuda', 1.0) == torch.float16
    assert device_ivf.stored_dtype('cuda:1', 2.0 ** 16) == torch.bfloat16  # float16 tops out at 65,504
    assert device_ivf.stored_dtype('cpu', 1.0) == torch.float32


def test_products_beyond_float16s_range_keep_their_ranking_and_scores(monkeypatch):
    import torch
    rng = np.random.default_rng(1)
    centroids = rng.normal(size=(4, 8)).astype(np.float32)
    vectors = (100 * (centroids[rng.integers(0, 4, 300)] + rng.normal(size=(300, 8)))).astype(np.float32)
    queries = (1e4 * rng.normal(size=(20, 8))).astype(np.float32)  # products up to about 1e7: inf in float16
    index = ivf_with_centroids(centroids, vectors)
    expected_scores, expected = DeviceIVF(index, vectors, 'cpu', 1e3).search(queries, 5, 2)
    monkeypatch.setattr(device_ivf, 'stored_dtype', lambda device, max_norm: torch.float16)  # a GPU's format
    scores, hits = DeviceIVF(index, vectors, 'cpu', 1e3).search(queries, 5, 2)
    assert np.isfinite(scores).all()
    assert (hits == expected).mean() > 0.95  # float16 may swap near ties
    np.testing.assert_allclose(scores, expected_scores, rtol=2e-3)
