"""Exact search shaped for a GPU (documents grouped by length, 16-bit screening with the maxima taken where the
products are made), run here on the CPU: its bound against float64 products, its rankings and scores against the
CPU's search on near ties, a memory budget that streams chunks, and the Triton kernel through its interpreter."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from pyterrier_multiquery.index import MultiVectorIndex, shardwise
from pyterrier_multiquery.index import grouped
from pyterrier_multiquery.index.exact import UNDERFLOW, underflow_error

from test_exact_search import near_tie_collection, wide_range_vectors


def test_documents_are_padded_to_powers_of_two():
    lengths = np.array([1, 2, 3, 4, 5, 63, 64, 65])
    np.testing.assert_array_equal(grouped.padded_lengths(lengths), [1, 2, 4, 4, 8, 64, 64, 128])


def test_a_padded_document_repeats_its_last_vector():
    vectors = np.arange(12, dtype=np.float32).reshape(6, 2)  # documents of 1, 3 and 2 vectors
    offsets = np.array([0, 1, 4, 6])
    block = grouped._padded_block(vectors, offsets, np.diff(offsets), np.array([1]), 4, torch.bfloat16)
    np.testing.assert_array_equal(block.float().numpy(), [[[2, 3], [4, 5], [6, 7], [6, 7]]])


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bfloat16', 'float16'])
@pytest.mark.parametrize('dim', [8, 128, 384])
def test_every_screened_product_is_within_the_bound(dim, dtype):
    rng = np.random.default_rng(dim)
    queries, docs = wide_range_vectors(rng, 200, dim), wide_range_vectors(rng, 1500, dim)
    if dtype == torch.float16:  # documents up to float16's limit, with values far below its normal range
        docs *= np.float32(grouped.FLOAT16_LIMIT / 2 / np.linalg.norm(docs, axis=1).max())
        assert (np.abs(docs[docs != 0]) < 2.0 ** -14).mean() > 0.01
    padded, weights, scale = grouped.padded_query_tensors([q[None] for q in queries], 'sum', 'cpu', dtype)
    screened = grouped.screen(torch.from_numpy(docs)[:, None].to(dtype), padded, weights, 'torch',
                              4 << 20).double().numpy()
    true = queries.astype(np.float64) @ docs.astype(np.float64).T
    query_norms = np.linalg.norm(queries.astype(np.float64), axis=1)[:, None]
    doc_norms = np.linalg.norm(docs.astype(np.float64), axis=1)[None, :]
    similarity = grouped.grouped_similarity_error(dim, 'torch', dtype)
    bound = similarity * query_norms * doc_norms + \
        underflow_error(dim, UNDERFLOW[dtype] / scale, query_norms, doc_norms, similarity)
    assert (np.abs(screened - true) <= bound).all()
    assert (np.abs(screened - true) / bound).max() > 1 / 100  # of the size of the errors, not vacuous


def test_float16_screening_is_tighter_and_exact_for_a_float16_index():
    bfloat16 = grouped.grouped_similarity_error(128, 'triton', torch.bfloat16)
    float16 = grouped.grouped_similarity_error(128, 'triton', torch.float16)
    held = grouped.grouped_similarity_error(128, 'triton', torch.float16, exact_documents=True)
    assert held < float16 < bfloat16 / 5
    assert grouped.group_dtype(grouped.FLOAT16_LIMIT / 2) == torch.float16
    assert grouped.group_dtype(grouped.FLOAT16_LIMIT) == torch.bfloat16


@pytest.mark.parametrize('largest', [1e-6, 1.0, 3e6])
def test_queries_are_scaled_into_float16_and_their_weights_back(largest):
    query = np.array([[largest, -largest / 3], [largest / 7, 0.0]], dtype=np.float32)
    padded, weights, scale = grouped.padded_query_tensors([query], 'mean', 'cpu', torch.float16)
    assert 2.0 ** 13 < float(padded.abs().max()) <= 2.0 ** 14 and np.log2(scale) == round(np.log2(scale))
    np.testing.assert_allclose(padded[0].double().numpy() / scale, query, rtol=2.0 ** -11)
    np.testing.assert_array_equal(weights.numpy() * scale, [[0.5, 0.5]])


def test_the_fused_kernel_bound_is_tighter_than_the_torch_one():
    # the kernel returns float32 sums, where torch rounds its product to bfloat16
    assert grouped.grouped_similarity_error(128, 'triton') < grouped.grouped_similarity_error(128, 'torch') * 0.8


@pytest.fixture
def grouped_on_cpu(monkeypatch):
    """Exact search on the CPU through the GPU's code: documents grouped by length."""
    monkeypatch.setattr(shardwise, 'uses_length_groups', lambda device: True)


@pytest.mark.parametrize('aggregate', ['mean', 'sum'])
@pytest.mark.parametrize('ragged', [False, True])
def test_grouped_search_ranks_and_scores_as_the_cpu(tmp_path, monkeypatch, aggregate, ragged):
    docs, queries = near_tie_collection(np.random.default_rng(7), 400, 16, ragged)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(docs)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    retriever = index.retriever(num_results=15, aggregate=aggregate, device='cpu', batch_size=5)
    blockwise = retriever(topics)
    monkeypatch.setattr(shardwise, 'uses_length_groups', lambda device: True)
    by_length = retriever(topics)
    groups = index.searchers().searchers[0]._resident[('groups', 'cpu')][1]
    assert {chunk.vectors.shape[1] for chunk in groups.chunk_list} == ({1, 2, 4, 8} if ragged else {8})  # 1-6, 6
    assert groups.dtype == torch.float16 and not groups.exact  # a float32 index's values, rounded
    pd.testing.assert_frame_equal(by_length[['qid', 'docno', 'rank', 'score']],
                                  blockwise[['qid', 'docno', 'rank', 'score']])


def test_float16_groups_leave_fewer_documents_to_score_in_float64(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(10, 6, 32))
    docs = [{'docno': f'd{i}', 'doc_embs': centres[i % 10] + 0.2 * rng.normal(size=(6, 32))} for i in range(1000)]
    queries = [centres[j % 10, :3] + 0.3 * rng.normal(size=(3, 32)) for j in range(20)]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer(dtype='float16').index(docs)
    meta, vectors, offsets, _ = index.payload()
    scored = []

    def counted(batches, *args, **kwargs):
        scored.append(sum(int((batch.candidates() >= 0).sum()) for batch in batches))
        return original(batches, *args, **kwargs)
    original = grouped.scored_candidates
    monkeypatch.setattr(grouped, 'scored_candidates', counted)
    settings = dict(num_results=10, aggregate='mean', batch_size=8, tile_bytes=1 << 20, device='cpu',
                    max_norm=meta['max_norm'])
    found = {}
    for dtype in (torch.bfloat16, torch.float16):
        groups = grouped.LengthGroups.build(vectors, offsets, 'cpu', dtype=dtype)
        assert groups.exact == (dtype == torch.float16)  # a float16 index, held exactly
        found[dtype] = grouped.grouped_exact_top([q.astype(np.float32) for q in queries], groups, vectors, offsets,
                                                 **settings)
    assert scored[1] < scored[0] / 3 and scored[1] >= 10 * len(queries)
    for (scores, docids), (other_scores, other_docids) in zip(*found.values()):
        np.testing.assert_array_equal(docids, other_docids)
        np.testing.assert_array_equal(scores, other_scores)


def test_vectors_beyond_float16_are_grouped_in_bfloat16_and_rank_as_the_cpu(tmp_path, monkeypatch):
    docs, queries = near_tie_collection(np.random.default_rng(2), 100, 16, True)
    docs = [{**doc, 'doc_embs': doc['doc_embs'] * 2e4} for doc in docs]  # norms of about 10^5
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(docs)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    blockwise = index.retriever(num_results=10, device='cpu')(topics)
    monkeypatch.setattr(shardwise, 'uses_length_groups', lambda device: True)
    by_length = index.retriever(num_results=10, device='cpu')(topics)
    assert index.searchers().searchers[0]._resident[('groups', 'cpu')][1].dtype == torch.bfloat16
    pd.testing.assert_frame_equal(by_length[['qid', 'docno', 'rank', 'score']],
                                  blockwise[['qid', 'docno', 'rank', 'score']])


def test_a_small_budget_streams_the_chunks_and_ranks_the_same(tmp_path):
    docs, queries = near_tie_collection(np.random.default_rng(3), 300, 16, True)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(docs)
    meta, vectors, offsets, _ = index.payload()
    settings = dict(num_results=10, aggregate='mean', batch_size=4, tile_bytes=1 << 16, device='cpu',
                    max_norm=meta['max_norm'])
    whole = grouped.LengthGroups.build(vectors, offsets, 'cpu', chunk_vectors=64)
    budget = whole.resident_bytes // 3
    streamed = grouped.LengthGroups.build(vectors, offsets, 'cpu', chunk_vectors=64, budget_bytes=budget)
    assert whole.streamed_bytes == 0 and 0 < streamed.resident_bytes <= budget
    assert streamed.resident_bytes + streamed.streamed_bytes == whole.resident_bytes
    expected = grouped.grouped_exact_top(queries, whole, vectors, offsets, **settings)
    found = grouped.grouped_exact_top(queries, streamed, vectors, offsets, **settings)
    assert streamed.copies == sum(not chunk.resident for chunk in streamed.chunk_list) > 1
    for (scores, docids), (expected_scores, expected_docids) in zip(found, expected):
        np.testing.assert_array_equal(docids, expected_docids)
        np.testing.assert_array_equal(scores, expected_scores)


def test_chunks_taken_into_the_top_k_together_rank_as_one_at_a_time(tmp_path, monkeypatch):
    docs, queries = near_tie_collection(np.random.default_rng(4), 300, 16, True)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(docs)
    meta, vectors, offsets, _ = index.payload()
    groups = grouped.LengthGroups.build(vectors, offsets, 'cpu', chunk_vectors=64)
    settings = dict(num_results=10, aggregate='mean', batch_size=4, tile_bytes=1 << 16, device='cpu',
                    max_norm=meta['max_norm'])
    takes = []
    add = grouped.ScreenedBatch.add
    monkeypatch.setattr(grouped.ScreenedBatch, 'add', lambda self, scores, first: takes.append(scores.shape[1]) or
                        add(self, scores, first))
    one_by_one = grouped.grouped_exact_top(queries, groups, vectors, offsets, merge_bytes=0, **settings)
    assert takes == [len(chunk.docids) for chunk in groups.chunk_list] and len(takes) > 2
    takes.clear()
    together = grouped.grouped_exact_top(queries, groups, vectors, offsets, **settings)
    assert takes == [len(offsets) - 1]  # every chunk's scores at once: far below MERGE_BYTES
    for (scores, docids), (expected_scores, expected_docids) in zip(together, one_by_one):
        np.testing.assert_array_equal(docids, expected_docids)
        np.testing.assert_array_equal(scores, expected_scores)


def test_a_non_finite_stored_vector_is_reported_by_document(tmp_path, grouped_on_cpu):
    from pyterrier_multiquery.index.errors import CorruptIndexError
    rng = np.random.default_rng(0)
    docs = [{'docno': f'd{i}', 'doc_embs': rng.normal(size=(3, 8)).astype(np.float32)} for i in range(20)]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(docs)
    meta = index.payload()[0]
    with open(tmp_path / 'index' / 'vecs.f4', 'r+b') as f:  # document d7's first value becomes NaN
        f.seek(7 * 3 * 8 * 4)
        f.write(np.float32(np.nan).tobytes())
    index._payload = None
    assert index.payload()[0] == meta
    topics = pd.DataFrame({'qid': ['q1'], 'query_embs': [rng.normal(size=(2, 8)).astype(np.float32)]})
    with pytest.raises(CorruptIndexError, match="'d7'"):
        index.retriever(device='cpu')(topics)


KERNEL_CHECK = textwrap.dedent('''
    import numpy as np, pandas as pd, torch
    from pyterrier_multiquery.index import MultiVectorIndex, grouped
    from pyterrier_multiquery.index.exact import UNDERFLOW, underflow_error
    from pyterrier_multiquery.index.maxsim_kernel import CONFIGS, launch

    rng = np.random.default_rng(0)
    # the kernel against float64, for every launch shape (float16: the first): short and long documents (a long one
    # in sub-tiles), dimensions that are and are not multiples of the k-tile, queries of one and several vectors
    for count, length, queries, width, dim in [(5, 4, 3, 2, 16), (37, 8, 5, 8, 96), (3, 256, 2, 4, 32),
                                               (20, 1, 7, 1, 8)]:
        for dtype, configs in ((torch.bfloat16, CONFIGS), (torch.float16, CONFIGS[:1])):
            docs = torch.from_numpy(rng.normal(size=(count, length, dim)).astype(np.float32)).to(dtype)
            query = torch.from_numpy(rng.normal(size=(queries, width, dim)).astype(np.float32)).to(dtype)
            weights = torch.from_numpy(rng.uniform(size=(queries, width)).astype(np.float32))
            sims = docs.double().reshape(-1, dim) @ query.double().reshape(-1, dim).T
            expected = (sims.view(count, length, -1).amax(1).view(count, queries, width) * weights.double()).sum(-1).T
            for config in configs:
                found = launch(docs, query, weights, config).double()
                assert found.shape == (queries, count)
                assert float((found - expected).abs().max()) < 1e-4 * float(expected.abs().max()), config
    # each product within the kernel's bound (one vector a document and a query), on wide-ranging vectors (float16:
    # documents up to its limit, queries scaled into it)
    from test_exact_search import near_tie_collection, wide_range_vectors
    for dim in (8, 128):
        for dtype in (torch.bfloat16, torch.float16):
            queries, docs = wide_range_vectors(rng, 60, dim), wide_range_vectors(rng, 300, dim)
            if dtype == torch.float16:
                docs *= np.float32(grouped.FLOAT16_LIMIT / 2 / np.linalg.norm(docs, axis=1).max())
            padded, weights, scale = grouped.padded_query_tensors([q[None] for q in queries], 'sum', 'cpu', dtype)
            found = launch(torch.from_numpy(docs)[:, None].to(dtype), padded, weights, CONFIGS[0]).double().numpy()
            true = queries.astype(np.float64) @ docs.astype(np.float64).T
            query_norms = np.linalg.norm(queries.astype(np.float64), axis=1)[:, None]
            doc_norms = np.linalg.norm(docs.astype(np.float64), axis=1)[None, :]
            similarity = grouped.grouped_similarity_error(dim, 'triton', dtype)
            bound = similarity * query_norms * doc_norms + \\
                underflow_error(dim, UNDERFLOW[dtype] / scale, query_norms, doc_norms, similarity)
            assert (np.abs(found - true) <= bound).all(), dtype
    # the search through the kernel ranks and scores as the CPU's, on near ties, in either format
    docs, queries = near_tie_collection(np.random.default_rng(7), 200, 16, True)
    index = MultiVectorIndex(INDEX, verbose=False).indexer().index(docs)
    meta, vectors, offsets, _ = index.payload()
    topics = pd.DataFrame({'qid': [str(i) for i in range(len(queries))], 'query_embs': queries})
    blockwise = index.retriever(num_results=10, device='cpu')(topics)
    for dtype in (torch.bfloat16, torch.float16):
        groups = grouped.LengthGroups.build(vectors, offsets, 'cpu', dtype=dtype)
        found = grouped.grouped_exact_top(queries, groups, vectors, offsets, num_results=10, aggregate='mean',
                                          batch_size=5, tile_bytes=1 << 20, device='cpu', max_norm=meta['max_norm'],
                                          backend='triton')
        docnos = np.concatenate([docids for _, docids in found]).ravel()
        assert (index.payload()[3].fwd[docnos] == blockwise['docno'].to_numpy()).all(), dtype
        assert (np.concatenate([scores for scores, _ in found]).ravel() == blockwise['score'].to_numpy()).all()
    print('kernel ok')
''')


def test_the_triton_kernel_in_its_interpreter(tmp_path):
    pytest.importorskip('triton')
    paths = [os.path.dirname(__file__), *filter(None, os.environ.get('PYTHONPATH', '').split(os.pathsep))]
    env = {**os.environ, 'TRITON_INTERPRET': '1', 'PYTHONPATH': os.pathsep.join(paths)}  # the tests' helpers too
    script = f'INDEX = {str(tmp_path / "index")!r}\n' + KERNEL_CHECK
    run = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'kernel ok' in run.stdout
