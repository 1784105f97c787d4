"""MaxSim search at the speed of the hardware: batched approximate re-scoring, exact search over tiles read once,
and one threading policy for torch and FAISS, each against a plain per-query reference computation."""
import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_multiquery.index import MultiVectorIndex

DIM = 8


def collection(doc_count, integer, seed):
    """Documents of 1 to 6 vectors; integer-valued vectors make every score exact, so ties are many and exact."""
    rng = np.random.default_rng(seed)
    draw = (lambda n: rng.integers(-2, 3, size=(n, DIM))) if integer else (lambda n: rng.normal(size=(n, DIM)))
    return [{'docno': f'd{i}', 'doc_embs': draw(rng.integers(1, 7)).astype(np.float32)} for i in range(doc_count)]


def query_set(count, integer, seed):
    """Queries of 1 to 7 vectors."""
    return [doc['doc_embs'] for doc in collection(count, integer, seed + 100)] + \
        [np.ones((7, DIM), dtype=np.float32)]


def topics(queries):
    return pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query': 'x', 'query_embs': queries})


def maxsim(query, vectors, offsets, docids, aggregate):
    """MaxSim written out, one document at a time."""
    best = np.stack([(query @ np.asarray(vectors[offsets[d]:offsets[d + 1]], dtype=np.float32).T).max(axis=1)
                     for d in docids])
    return best.mean(axis=1) if aggregate == 'mean' else best.sum(axis=1)


def per_query_reference(index, queries, candidates, aggregate, num_results):
    """The approximate search written out: one FAISS search, then each query on its own: its distinct candidate
    documents (np.unique), scored, sorted by score and then docid (np.lexsort); a query whose candidates hold fewer
    than ``num_results`` documents (of an index holding that many) has every document scored instead."""
    from pyterrier_multiquery.index.ann import load_or_build
    _, vectors, offsets, _ = index.payload()
    _, hits = load_or_build(index, 'flat').search(np.concatenate(queries), candidates)
    hit_docs = np.searchsorted(offsets, hits, side='right') - 1
    rankings, row = [], 0
    for query in queries:
        docids = np.unique(hit_docs[row:row + len(query)])
        docids = docids[docids >= 0]
        row += len(query)
        if len(docids) < min(num_results, len(offsets) - 1):
            docids = np.arange(len(offsets) - 1)
        scores = maxsim(query, vectors, offsets, docids, aggregate)
        order = np.lexsort((docids, -scores))[:num_results]
        rankings.append((docids[order], scores[order]))
    return rankings


def exact_reference(index, queries, aggregate, num_results):
    """Every document scored, sorted by score and then docid."""
    _, vectors, offsets, _ = index.payload()
    docids = np.arange(len(offsets) - 1)
    rankings = []
    for query in queries:
        scores = maxsim(query, vectors, offsets, docids, aggregate)
        order = np.lexsort((docids, -scores))[:num_results]
        rankings.append((docids[order], scores[order]))
    return rankings


def assert_rankings(out, rankings, exact_scores):
    assert list(out['qid'].unique()) == [f'q{i}' for i in range(len(rankings)) if len(rankings[i][0])]
    for i, (docids, scores) in enumerate(rankings):
        got = out[out['qid'] == f'q{i}']
        assert got['docid'].tolist() == docids.tolist(), f'q{i}'
        assert got['docno'].tolist() == [f'd{d}' for d in docids]
        assert got['rank'].tolist() == list(range(len(docids)))
        if exact_scores:
            np.testing.assert_array_equal(got['score'].to_numpy(), scores.astype(np.float32))
        else:
            np.testing.assert_allclose(got['score'].to_numpy(), scores, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module', params=['integer', 'gaussian'])
def data(request, tmp_path_factory):
    integer = request.param == 'integer'
    docs = collection(200, integer, seed=0)
    folder = tmp_path_factory.mktemp('search')
    indexes = {dtype: MultiVectorIndex(folder / dtype, verbose=False).indexer(dtype=dtype).index(docs)
               for dtype in ('float32', 'float16')}
    return integer, indexes, query_set(11, integer, seed=1)


@pytest.mark.parametrize('aggregate', ['mean', 'sum'])
@pytest.mark.parametrize('num_results, candidates, batch_size, tile_bytes', [
    (10, 4, 64, None),   # few candidates: queries with fewer than 10 documents among them are searched exactly
    (1000, 4, 3, None),  # more results asked than candidates hold: every document, in batches of 3 queries
    (15, 9, 64, 1),      # a tile of one byte: one query at a time
    (7, 30, 5, 20_000),  # tiles of a few queries
])
def test_batched_rescoring_equals_the_per_query_reference(data, aggregate, num_results, candidates, batch_size,
                                                          tile_bytes):
    integer, indexes, queries = data
    for index in indexes.values():
        expected = per_query_reference(index, queries, candidates, aggregate, num_results)
        out = index.ann_retriever(ann='flat', candidates=candidates, num_results=num_results,
                                     aggregate=aggregate, batch_size=batch_size, tile_bytes=tile_bytes)(topics(queries))
        assert_rankings(out, expected, exact_scores=integer)


@pytest.mark.parametrize('aggregate', ['mean', 'sum'])
@pytest.mark.parametrize('num_results, batch_size, block_vectors, tile_bytes', [
    (25, 64, 65536, None),  # one block, one tile
    (25, 4, 50, 2_000),     # blocks of about 50 vectors, each read once for three batches of queries, small tiles
    (300, 5, 37, 1),        # every document returned; a tile per document
])
def test_exact_search_over_tiles_equals_the_reference(data, aggregate, num_results, batch_size, block_vectors,
                                                      tile_bytes):
    integer, indexes, queries = data
    for index in indexes.values():
        expected = exact_reference(index, queries, aggregate, num_results)
        out = index.maxsim_retriever(num_results=num_results, aggregate=aggregate, batch_size=batch_size,
                                     block_vectors=block_vectors, tile_bytes=tile_bytes)(topics(queries))
        assert_rankings(out, expected, exact_scores=integer)


def test_candidates_covering_every_document_give_the_exact_ranking(data):
    _, indexes, queries = data
    index = indexes['float32']
    exact = index.maxsim_retriever(num_results=50)(topics(queries))
    approximate = index.ann_retriever(ann='flat', candidates=10_000, num_results=50)(topics(queries))
    pd.testing.assert_frame_equal(approximate, exact)


def test_float16_blocks_are_screened_in_tiles_of_the_screening_dtype(data, monkeypatch):
    from pyterrier_multiquery.index.exact import ScreenedBatch, screening_dtype
    _, indexes, queries = data
    largest = []

    def recording(self, tile, lengths):
        largest.append(len(tile))
        assert tile.dtype == screening_dtype('cpu')
        return scores(self, tile, lengths)

    scores = ScreenedBatch.tile_scores
    monkeypatch.setattr(ScreenedBatch, 'tile_scores', recording)
    indexes['float16'].maxsim_retriever(num_results=5, tile_bytes=2 * 200)(topics(queries[:2]))
    # a tile holds about tile_bytes / 2 (bytes of a screened number) / (query rows + dim) vectors: as many, plus
    # what ends its last document
    rows = sum(len(q) for q in queries[:2])
    assert max(largest) < 200 // (rows + DIM) + 6 and len(largest) > 10


def test_threads_are_set_for_torch_and_faiss_and_restored(data, monkeypatch):
    import faiss
    import torch

    from pyterrier_multiquery.index.ann import CandidateStage
    _, indexes, queries = data
    seen = []
    search = CandidateStage.search

    def recording(stage, vectors, k, search_effort):
        seen.append((len(vectors), torch.get_num_threads(), faiss.omp_get_max_threads()))
        return search(stage, vectors, k, search_effort)

    monkeypatch.setattr(CandidateStage, 'search', recording)
    torch_before, faiss_before = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        torch.set_num_threads(1)
        faiss.omp_set_num_threads(3)
        # (1, 3) where torch and FAISS have OpenMP runtimes of their own, (3, 3) where they share one (which
        # depends on the libraries loaded before them)
        state = (torch.get_num_threads(), faiss.omp_get_max_threads())
        retriever = indexes['float32'].ann_retriever(ann='flat', candidates=16, batch_size=2, threads=2)
        retriever(topics(queries))
        # one FAISS search for all the queries' vectors, whatever the batch size, on the threads asked for
        assert seen == [(sum(len(q) for q in queries), 2, 2)]
        assert (torch.get_num_threads(), faiss.omp_get_max_threads()) == state
        seen.clear()
        indexes['float32'].ann_retriever(ann='flat')(topics(queries))
        assert seen[0][1:] == (state[0], state[0])  # by default FAISS takes torch's count
    finally:
        torch.set_num_threads(torch_before)
        faiss.omp_set_num_threads(faiss_before)
    with pytest.raises(ValueError, match='threads must be None .* or a positive integer, got 0'):
        indexes['float32'].maxsim_retriever(threads=0)


def test_ivf_sq8_candidate_stage(data):
    import faiss

    from pyterrier_multiquery.index.ann import load_or_build
    _, indexes, queries = data
    index = indexes['float32']
    ann = faiss.downcast_index(load_or_build(index, 'ivf', 'SQ8'))
    assert isinstance(ann, faiss.IndexIVFScalarQuantizer) and ann.sq.qtype == faiss.ScalarQuantizer.QT_8bit
    # one byte a dimension and the vector's 8-byte id in its list, beside IVF-Flat's four bytes a dimension
    files = {path.name: path.stat().st_size for path in index.path.glob('ann.IVF*.faiss')}
    vec_count = index.payload()[0]['vec_count']
    lists = ann.nlist
    assert files[f'ann.IVF{lists}_SQ8.faiss'] < vec_count * (DIM + 8) + lists * DIM * 4 + 4096
    # probing every list and taking every vector: the exact ranking, whatever the 8-bit distances
    out = index.ann_retriever(ann='ivf', quantizer='SQ8', search_effort=lists, candidates=vec_count,
                                 num_results=20)(topics(queries))
    pd.testing.assert_frame_equal(out, index.maxsim_retriever(num_results=20)(topics(queries)))


def test_the_candidate_stage_names_the_document_of_every_hit_and_none_past_the_last(tmp_path):
    from pyterrier_multiquery.index.ann import CandidateStage
    # ragged documents of 1, 3 and 2 vectors along the axes: a query along axis j hits the vector j
    vectors = np.eye(6, dtype=np.float32)
    stream = [{'docno': 'a', 'doc_embs': vectors[:1]}, {'docno': 'b', 'doc_embs': vectors[1:4]},
              {'docno': 'c', 'doc_embs': vectors[4:]}]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(stream)
    stage = CandidateStage(index, 'flat', None, 'cpu', first=10)
    scores, docids = stage.search(vectors[[0, 3, 5]], 7, 1)
    assert docids[:, 0].tolist() == [10, 11, 12]   # the shard's first docid on
    assert docids[:, 6].tolist() == [-1, -1, -1] and np.isneginf(scores[:, 6]).all()   # six vectors only
    assert sorted(docids[0, :6].tolist()) == [10, 11, 11, 11, 12, 12]


def test_approximate_search_returns_num_results_where_its_candidates_hold_fewer(tmp_path):
    # two candidates a query vector find at most four documents; the queries asking for 20 are searched exactly
    rng = np.random.default_rng(3)
    docs = [{'docno': f'd{i}', 'doc_embs': rng.normal(size=(4, 8)).astype(np.float32)} for i in range(60)]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(docs)
    topics = pd.DataFrame({'qid': ['q0', 'q1', 'q2'], 'query_embs': [rng.normal(size=(2, 8)).astype(np.float32)
                                                                     for _ in range(3)]})
    approximate = index.ann_retriever(ann='flat', candidates=2, num_results=20, device='cpu')(topics)
    exact = index.retriever(num_results=20, device='cpu')(topics)
    assert approximate.groupby('qid').size().tolist() == [20, 20, 20]
    columns = ['qid', 'docno', 'score', 'rank']
    pd.testing.assert_frame_equal(approximate[columns], exact[columns])
    few = index.ann_retriever(ann='flat', candidates=2, num_results=3, device='cpu')(topics)
    assert few.groupby('qid').size().tolist() == [3, 3, 3]  # enough candidates: no exact search


@pytest.mark.parametrize('column, fix', [('query_vec', 'one vector a query'), ('query', 'put a query encoder before')])
def test_a_missing_column_error_names_the_transformer_and_the_fix(tmp_path, column, fix):
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(
        [{'docno': 'd0', 'doc_embs': np.ones((2, 4), dtype=np.float32)}])
    frame = pd.DataFrame({'qid': ['q1'], column: [np.ones(4, dtype=np.float32) if column == 'query_vec' else 'x']})
    for retriever in (index.retriever(), index.mean_retriever(), index.multiquery_retriever()):
        with pytest.raises(pt.validate.InputValidationError) as raised:
            retriever(frame)
        message = str(raised.value)
        assert repr(retriever) in message and "['query_embs']" in message and fix in message
    with pytest.raises(pt.validate.InputValidationError, match=r"needs the column\(s\) \['docno', 'query_embs'\]"):
        index.scorer()(frame)


def test_the_result_frame_replaces_a_query_frames_result_columns_and_names_shared_documents(tmp_path):
    # documents along the axes: q0 (axis 0, then 1) ranks a, b, c; q1 (axis 1) ranks b, then a and c tied at 0
    stream = [{'docno': name, 'doc_embs': np.eye(3, dtype=np.float32)[[axis]]} for axis, name in enumerate('abc')]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(stream)
    frame = pd.DataFrame({'qid': ['q0', 'q1'], 'score': [7.0, 7.0], 'rank': [5, 5],
                          'query_embs': [np.array([[2, 0, 0], [0, 1, 0]], dtype=np.float32),
                                         np.array([[0, 1, 0]], dtype=np.float32)]})
    out = index.retriever(num_results=3, device='cpu')(frame)
    assert list(out.columns) == ['qid', 'query_embs', 'docno', 'docid', 'score', 'rank']
    assert out['qid'].tolist() == ['q0'] * 3 + ['q1'] * 3
    assert out['docno'].tolist() == ['a', 'b', 'c', 'b', 'a', 'c']  # ties by the documents' order
    assert out['docid'].tolist() == [0, 1, 2, 1, 0, 2]
    assert out['score'].tolist() == [1.0, 0.5, 0.0, 1.0, 0.0, 0.0]  # the mean of the vectors' maxima
    assert out['rank'].tolist() == [0, 1, 2, 0, 1, 2]
    with pytest.raises(pt.validate.InputValidationError, match=r"takes a query frame .* the column\(s\) \['docno'\]"):
        index.retriever()(frame.assign(docno='a'))
