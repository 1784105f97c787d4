"""Exact MaxSim search by a screening pass with a bounded error: the bound checked against float64 products, the
rankings and scores against a float64 search written out, on near ties that the screening cannot separate."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index import exact
from pyterrier_multiquery.index.errors import CorruptIndexError

DTYPES = [torch.float32, torch.bfloat16]


def wide_range_vectors(rng, count, dim):
    """Vectors of norms from 1e-3 to 1e3, heavy-tailed entries, some with a single large component."""
    vectors = rng.standard_t(2, size=(count, dim)) * 10.0 ** rng.uniform(-3, 3, size=(count, 1))
    vectors[::7, 0] *= 1e3
    return vectors.astype(np.float32)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('dim', [8, 128, 384])
def test_every_screened_product_is_within_the_bound(dtype, dim):
    rng = np.random.default_rng(dim)
    queries, docs = wide_range_vectors(rng, 300, dim), wide_range_vectors(rng, 2000, dim)
    screened = (torch.from_numpy(docs).to(dtype) @ torch.from_numpy(queries).to(dtype).T).double().numpy().T
    true = queries.astype(np.float64) @ docs.astype(np.float64).T
    norms = np.linalg.norm(queries.astype(np.float64), axis=1)[:, None] * \
        np.linalg.norm(docs.astype(np.float64), axis=1)[None, :]
    ratio = np.abs(screened - true) / norms
    bound = exact.similarity_error(dtype, dim)
    assert ratio.max() <= bound
    assert ratio.max() > bound / 100  # the bound is of the size of the errors, not vacuous


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize('aggregate', ['mean', 'sum'])
def test_each_querys_error_bound_is_the_formula_written_out(dtype, aggregate):
    rng = np.random.default_rng(11)
    queries = [wide_range_vectors(rng, count, 16) for count in (1, 3, 2, 5)]  # ragged, norms 1e-3 to 1e6
    found = exact.screening_errors(queries, 7.5, dtype, aggregate)
    u32, similarity, underflow = 2.0 ** -24, exact.similarity_error(dtype, 16), exact.UNDERFLOW[dtype]
    for query, error in zip(queries, found):
        count, total = len(query), 0.0
        summed = (1 + count * u32 / (1 - count * u32)) * (1 + u32) ** 2
        for vector in query.astype(np.float64):
            norm = float(np.sqrt(vector @ vector))
            total += ((1 + similarity) * summed - 1) * 7.5 * norm
            total += summed * (1 + similarity) ** 2 * (underflow * 4.0 * (norm + 7.5) + 16 * underflow ** 2)
        assert error == pytest.approx(total / count if aggregate == 'mean' else total, rel=1e-12)


@pytest.mark.parametrize('aggregate', ['mean', 'sum'])
def test_queries_of_one_length_are_screened_as_by_the_weights(aggregate):
    rng = np.random.default_rng(5)
    queries = [rng.normal(size=(4, 16)).astype(np.float32) for _ in range(3)]
    tile = torch.from_numpy(rng.normal(size=(12, 16)).astype(np.float32))  # documents of 3, 4 and 5 vectors
    batch = exact.ScreenedBatch(queries, k=2, aggregate=aggregate, max_norm=10.0, device='cpu', dtype=torch.float32)
    assert batch.query_length == 4
    summed = batch.tile_scores(tile, np.array([3, 4, 5]))
    batch.query_length = None  # the product with each query's weights, as for queries of several lengths
    weighted = batch.tile_scores(tile, np.array([3, 4, 5]))
    sims = tile.double().numpy() @ np.concatenate(queries).astype(np.float64).T
    maxima = np.maximum.reduceat(sims, [0, 3, 7], axis=0).reshape(3, 3, 4)
    expected = maxima.mean(axis=2) if aggregate == 'mean' else maxima.sum(axis=2)
    np.testing.assert_allclose(summed.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(summed.numpy(), weighted.numpy(), rtol=1e-6)


def test_a_block_says_which_screened_scores_are_not_finite_and_keeps_those_documents():
    queries = [np.ones((1, 2), dtype=np.float32), np.ones((1, 2), dtype=np.float32)]
    batch = exact.ScreenedBatch(queries, k=1, aggregate='sum', max_norm=1.0, device='cpu', dtype=torch.float32)
    assert batch.add(torch.tensor([[0.5, 0.1], [0.2, 0.3]]), 0) is None  # every score finite: nothing to say
    unknown = batch.add(torch.tensor([[torch.inf, 0.0], [0.1, torch.nan]]), 2)  # documents 2 and 3
    assert unknown.tolist() == [[True, False], [False, True]]
    assert batch.top[:, 0].tolist() == [0.5, 0.30000001192092896]  # the infinite score raised no floor
    # each query keeps its best finite document (floor: it, less a bound of about 1e-7) and its non-finite one
    assert batch.candidates().tolist() == [[0, 2], [1, 3]]


def float64_search(vectors, offsets, queries, aggregate, k):
    """Every document scored in float64, rounded to float32, sorted by score and then docid."""
    vectors = np.asarray(vectors, dtype=np.float64)
    out = []
    for query in queries:
        sims = query.astype(np.float64) @ vectors.T
        maxima = np.maximum.reduceat(sims, offsets[:-1], axis=1)
        scores = (maxima.mean(axis=0) if aggregate == 'mean' else maxima.sum(axis=0)).astype(np.float32)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        out.append((order, scores[order]))
    return out


def near_tie_collection(rng, doc_count, dim, ragged):
    """Documents copied from a few originals with perturbations of 1e-5, far below bfloat16's resolution."""
    originals = rng.normal(size=(20, 6, dim)).astype(np.float32)
    docs = []
    for i in range(doc_count):
        length = int(rng.integers(1, 7)) if ragged else 6
        embs = originals[i % 20, :length] + 1e-5 * rng.normal(size=(length, dim)).astype(np.float32)
        docs.append({'docno': f'd{i}', 'doc_embs': embs})
    queries = [originals[j, :int(rng.integers(1, 5))] + 0.3 * rng.normal(size=(1, dim)).astype(np.float32)
               for j in range(12)]
    return docs, [q.astype(np.float32) for q in queries]


@pytest.fixture(params=DTYPES, ids=['float32', 'bfloat16'])
def screening(request, monkeypatch):
    """Screens in the given dtype, whichever the machine's timing would choose."""
    monkeypatch.setattr(exact, 'screening_dtype', lambda device: request.param)
    return request.param


@pytest.mark.parametrize('ragged', [False, True])
@pytest.mark.parametrize('aggregate, k, batch_size, block_vectors', [
    ('mean', 10, 64, 65536),  # one block
    ('sum', 25, 5, 200),      # several blocks and batches: the exact k-th score carries over
    ('mean', 3, 4, 1),        # a block per document
])
def test_rankings_and_scores_are_the_float64_ones(tmp_path, screening, ragged, aggregate, k, batch_size,
                                                   block_vectors):
    docs, queries = near_tie_collection(np.random.default_rng(3), 400, 16, ragged)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    _, vectors, offsets, _ = index.payload()
    out = index.maxsim_retriever(num_results=k, aggregate=aggregate, batch_size=batch_size,
                                 block_vectors=block_vectors)(
        pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries}))
    for i, (docids, scores) in enumerate(float64_search(vectors, offsets, queries, aggregate, k)):
        got = out[out['qid'] == f'q{i}']
        assert got['docid'].tolist() == docids.tolist()
        np.testing.assert_array_equal(got['score'].to_numpy(), scores)


def test_a_querys_results_do_not_depend_on_its_batch(tmp_path, screening):
    docs, queries = near_tie_collection(np.random.default_rng(4), 300, 16, ragged=True)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    together = index.maxsim_retriever(num_results=20, block_vectors=100)(topics)
    alone = pd.concat([index.maxsim_retriever(num_results=20, block_vectors=100)(topics.iloc[[i]])
                       for i in range(len(topics))], ignore_index=True)
    pd.testing.assert_frame_equal(alone, together, check_exact=True)


def test_screening_skips_the_documents_it_rules_out(tmp_path, monkeypatch):
    from pyterrier_multiquery.experiment.clustered_collection import clustered_collection
    docs, queries = clustered_collection(2000, dim=64, topics=200, query_count=20)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    pairs = []
    scored = exact.rescore_candidates

    def counting(queries, batches, *args, **kwargs):
        pairs.extend(int((docids >= 0).sum()) for _, _, docids in batches)
        return scored(queries, batches, *args, **kwargs)

    monkeypatch.setattr(exact, 'rescore_candidates', counting)
    index.maxsim_retriever(num_results=10, block_vectors=4000)(
        pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries}))
    # each query's top 10 at least, and a small part of the 40,000 (query, document) pairs
    assert 20 * 10 <= sum(pairs) < 40_000 // 10


def test_the_index_records_its_largest_vector_norm(tmp_path):
    docs = [{'docno': 'a', 'doc_embs': np.array([[3., 4.], [1., 0.]])}, {'docno': 'b', 'doc_embs': [[0., -6.]]}]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    assert index.payload()[0]['max_norm'] == 6.0
    assert exact.max_vector_norm(index.payload()[1]) == 6.0


def test_an_index_without_max_norm_is_searched_alike(tmp_path):
    docs, queries = near_tie_collection(np.random.default_rng(5), 100, 8, ragged=True)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    expected = index.maxsim_retriever(num_results=10)(topics)
    meta_file = tmp_path / 'index' / 'pt_meta.json'
    meta = json.loads(meta_file.read_text())
    del meta['max_norm']  # as an index built before indexes recorded it
    meta_file.write_text(json.dumps(meta))
    reopened = MultiVectorIndex(tmp_path / 'index', verbose=False)
    pd.testing.assert_frame_equal(reopened.maxsim_retriever(num_results=10)(topics), expected)


@pytest.mark.parametrize('value', [-1.0, 'big', None])
def test_a_malformed_max_norm_is_refused(tmp_path, value):
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index([{'docno': 'a', 'doc_embs': [[1., 2.]]}])
    meta_file = tmp_path / 'index' / 'pt_meta.json'
    meta = json.loads(meta_file.read_text())
    meta['max_norm'] = value
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(CorruptIndexError, match='max_norm must be a non-negative number'):
        MultiVectorIndex(index.path, verbose=False).payload()


def test_pruning_the_candidates_as_the_floor_rises_keeps_the_results(tmp_path, screening, monkeypatch):
    docs, queries = near_tie_collection(np.random.default_rng(6), 300, 16, ragged=True)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    expected = index.maxsim_retriever(num_results=15, block_vectors=50)(topics)
    monkeypatch.setattr(exact.ScreenedBatch, 'PRUNE_AT', 5)  # pruned after every block
    pd.testing.assert_frame_equal(index.maxsim_retriever(num_results=15, block_vectors=50)(topics), expected,
                                  check_exact=True)


def test_a_screened_sum_that_overflows_is_scored_exactly(tmp_path, screening):
    # 2 * 3e38 overflows float32 in the screening; the float64 MaxSim, (6e38 + 0) / 2, is within float32's range
    docs = [{'docno': 'big', 'doc_embs': [[3e38, 0.], [0., 1.]]}, {'docno': 'small', 'doc_embs': [[1., 1.]]}]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    out = index.maxsim_retriever(num_results=2)(pd.DataFrame({'qid': ['q'], 'query_embs': [[[2., 0.], [0., 0.]]]}))
    assert out['docno'].tolist() == ['big', 'small']
    assert out['score'].tolist() == [np.float32(3e38), 1.0]
