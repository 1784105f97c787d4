import hashlib
import json
import math
import os
import time
import warnings

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_multiquery.index import CorruptIndexError, MultiVectorIndex, core
from pyterrier_multiquery.index.ann import faiss_factory
from pyterrier_multiquery.index.multiquery import round_robin
from pyterrier_multiquery.experiment.clustered_collection import clustered_collection


def random_collection(doc_count=300, dim=16, max_vectors=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{'docno': f'd{i}', 'doc_embs': rng.normal(size=(rng.integers(1, max_vectors + 1), dim)).astype(np.float32)}
            for i in range(doc_count)]


def topics_frame(queries):
    queries = list(queries)
    return pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query': 'x', 'query_embs': list(queries)})


def brute_force(docs, query, aggregate='mean'):
    """MaxSim written out: for each query vector the best dot product in the document, then the mean (or sum)."""
    scores = []
    for doc in docs:
        best = [max(float(np.dot(q, d)) for d in doc['doc_embs']) for q in query]
        scores.append(np.mean(best) if aggregate == 'mean' else np.sum(best))
    return np.array(scores)


@pytest.fixture(scope='module')
def collection(tmp_path_factory):
    docs = random_collection()
    index = MultiVectorIndex(tmp_path_factory.mktemp('mvi') / 'index', verbose=False).index(docs)
    return docs, index


@pytest.mark.parametrize('aggregate', ['mean', 'sum'])
def test_exact_maxsim_equals_brute_force(collection, aggregate):
    docs, index = collection
    rng = np.random.default_rng(1)
    queries = [rng.normal(size=(k, 16)).astype(np.float32) for k in (1, 3, 8)]
    # small blocks so documents are scored across several blocks and the running top-k is exercised
    out = index.maxsim_retriever(num_results=20, aggregate=aggregate, block_vectors=50)(topics_frame(queries))
    for i, query in enumerate(queries):
        expected = brute_force(docs, query, aggregate)
        top = np.argsort(-expected, kind='stable')[:20]
        got = out[out['qid'] == f'q{i}']
        assert list(got['docno']) == [f'd{j}' for j in top]
        np.testing.assert_allclose(got['score'], expected[top], rtol=1e-5)
        assert list(got['rank']) == list(range(20))


def test_single_vectors_match_flexindex(tmp_path):
    from pyterrier_dr import FlexIndex
    rng = np.random.default_rng(2)
    vecs = rng.normal(size=(500, 16)).astype(np.float32)
    records = [{'docno': f'd{i}', 'doc_vec': v} for i, v in enumerate(vecs)]
    flex = FlexIndex(str(tmp_path / 'flex'), verbose=False)
    flex.index(records)
    mvi = MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(records)
    queries = rng.normal(size=(5, 16)).astype(np.float32)
    ours = mvi.maxsim_retriever(num_results=50)(topics_frame(q[None, :] for q in queries))
    theirs = flex.np_retriever(num_results=50)(pd.DataFrame({'qid': [f'q{i}' for i in range(5)], 'query': 'x',
                                                             'query_vec': list(queries)}))
    for qid in ours['qid'].unique():
        a, b = ours[ours['qid'] == qid], theirs[theirs['qid'] == qid]
        assert list(a['docno']) == list(b['docno'])
        np.testing.assert_allclose(a['score'], b['score'], rtol=1e-5)


def test_approximate_recall_on_20k_passages(tmp_path):
    docs, queries = clustered_collection(20_000, dim=128, min_vectors=4, max_vectors=16, query_count=100, seed=3)
    index = MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(docs)
    topics = topics_frame(queries)
    exact = index.maxsim_retriever(num_results=10)(topics)
    approx = index.ann_retriever(num_results=10)(topics)  # default settings
    recall = np.mean([len(set(exact[exact.qid == q].docno) & set(approx[approx.qid == q].docno)) / 10
                      for q in topics.qid])
    assert recall >= 0.99
    # the FAISS stage, IVF with 8-bit codes by default, is cached in the index folder and reused
    vec_count = index.payload()[0]['vec_count']
    assert [p.name for p in (tmp_path / 'mvi').glob('ann.*.faiss')] == [f'ann.IVF{int(4 * vec_count ** 0.5)}_SQ8.faiss']
    again = MultiVectorIndex(tmp_path / 'mvi', verbose=False).ann_retriever(num_results=10)(topics)
    pd.testing.assert_frame_equal(again[['qid', 'docno', 'rank']], approx[['qid', 'docno', 'rank']])


def test_candidate_stage_storage():
    assert [faiss_factory(kind, None, 10_000) for kind in ('flat', 'ivf', 'hnsw')] == ['Flat', 'IVF400,SQ8', 'HNSW32']
    assert [faiss_factory(kind, 'Flat', 10_000) for kind in ('flat', 'ivf', 'hnsw')] == ['Flat', 'IVF400,Flat',
                                                                                         'HNSW32']
    assert faiss_factory('hnsw', 'PQ8', 10_000) == 'HNSW32_PQ8'
    with pytest.raises(ValueError, match="quantizer must be None, Flat, SQ8, SQ4, SQfp16 or PQ<m>, got 'PQ'"):
        faiss_factory('ivf', 'PQ', 10_000)
    with pytest.raises(ValueError, match="ANN kind must be one of"):
        faiss_factory('lsh', None, 10_000)
    # 4 sqrt(n) lists exceed n below 16 vectors, where FAISS cannot train them: one list per vector at most
    assert [faiss_factory('ivf', None, n) for n in (1, 5, 16, 17)] == ['IVF1,SQ8', 'IVF5,SQ8', 'IVF16,SQ8', 'IVF16,SQ8']


def test_the_default_candidate_stage_searches_an_index_of_a_few_vectors(tmp_path):
    docs = [{'docno': f'd{i}', 'doc_embs': np.eye(4, dtype=np.float32)[[i % 4]]} for i in range(5)]
    index = MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(docs)
    topics = pd.DataFrame({'qid': ['q'], 'query_embs': [np.array([[1., .5, 0., 0.]], dtype=np.float32)]})
    approx = index.ann_retriever(num_results=2, candidates=5, device='cpu')(topics)
    assert approx['docno'].tolist() == ['d0', 'd4'] and approx['score'].tolist() == [1., 1.]


def test_approximate_with_quantisers_and_hnsw(collection):
    docs, index = collection
    queries = [np.asarray(docs[i]['doc_embs'], dtype=np.float32) for i in (0, 5, 9)]  # each finds itself first
    for ann, quantizer in (('flat', None), ('hnsw', None), ('ivf', 'SQ8'), ('flat', 'PQ4')):
        out = index.ann_retriever(ann=ann, quantizer=quantizer, num_results=5)(topics_frame(queries))
        assert list(out[out['rank'] == 0]['docno']) == ['d0', 'd5', 'd9'], (ann, quantizer)


def test_save_reload_and_float16(collection, tmp_path):
    docs, index = collection
    queries = topics_frame([np.ones((2, 16), dtype=np.float32)])
    before = index.maxsim_retriever(num_results=10)(queries)
    reloaded = MultiVectorIndex(index.path, verbose=False)
    pd.testing.assert_frame_equal(before, reloaded.maxsim_retriever(num_results=10)(queries))
    meta = json.loads((index.path / 'pt_meta.json').read_text())
    assert meta['type'] == 'multi_vector_index' and meta['doc_count'] == 300
    assert meta['vec_count'] == sum(len(d['doc_embs']) for d in docs)
    half = MultiVectorIndex(tmp_path / 'half', verbose=False).indexer(dtype='float16').index(docs)
    assert half.bytes_per_vector() == 32 and index.bytes_per_vector() == 64
    out = half.maxsim_retriever(num_results=10)(queries)
    assert list(out['docno'][:5]) == list(before['docno'][:5])
    # a float16 index holds each value rounded to the nearest float16, and scores those values as exactly as a float32
    # index scores its own: brute force over the rounded vectors, in float64, gives its ranking and its scores
    rounded = [{'docno': d['docno'], 'doc_embs': d['doc_embs'].astype(np.float16).astype(np.float64)} for d in docs]
    expected = brute_force(rounded, np.ones((2, 16)))
    top = np.argsort(-expected, kind='stable')[:10]
    assert list(out['docno']) == [f'd{j}' for j in top]
    np.testing.assert_allclose(out['score'], expected[top], rtol=1e-6)


def test_loads_through_pyterrier_artifact(collection):
    _, index = collection
    loaded = pt.Artifact.load(str(index.path))
    assert isinstance(loaded, MultiVectorIndex) and len(loaded) == 300


def test_interrupted_build_leaves_no_index(tmp_path):
    def records():
        yield from random_collection(10)
        raise KeyboardInterrupt()

    with pytest.raises(KeyboardInterrupt):
        MultiVectorIndex(tmp_path / 'index', verbose=False).index(records())
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match='pt_meta.json is missing'):
        MultiVectorIndex(tmp_path / 'index').payload()


def test_existing_index_is_kept_unless_overwrite(collection):
    _, index = collection
    with pytest.raises(FileExistsError, match='overwrite=True'):
        MultiVectorIndex(index.path).index(random_collection(5))


@pytest.mark.parametrize('damage',
                         ['truncate_vectors', 'truncate_offsets', 'bad_meta', 'changed_offsets', 'bad_offsets'])
def test_corrupt_files_are_named(collection, tmp_path, damage):
    import shutil
    _, index = collection
    path = tmp_path / 'copy'
    shutil.copytree(index.path, path)
    if damage == 'truncate_vectors':
        with open(path / 'vecs.f4', 'r+b') as f:
            f.truncate(100)
        match = r'vecs.f4.*has 100 bytes'
    elif damage == 'truncate_offsets':
        with open(path / 'offsets.i8', 'r+b') as f:
            f.truncate(16)
        match = 'offsets.i8.*has 16 bytes'
    elif damage == 'bad_meta':
        (path / 'pt_meta.json').write_text('{"type": "multi_vector')
        match = 'not valid JSON'
    elif damage == 'changed_offsets':
        offsets = np.fromfile(path / 'offsets.i8', dtype=np.int64)
        offsets[5] = offsets[4]
        offsets.tofile(path / 'offsets.i8')
        match = 'offsets.i8.*changed since the index was built'
    else:  # offsets written wrong with their checksum: the offsets' own check
        from pyterrier_multiquery._files import file_sha256
        offsets = np.fromfile(path / 'offsets.i8', dtype=np.int64)
        offsets[5] = offsets[4]
        offsets.tofile(path / 'offsets.i8')
        meta = json.loads((path / 'pt_meta.json').read_text())
        meta['sha256']['offsets.i8'] = file_sha256(path / 'offsets.i8')
        (path / 'pt_meta.json').write_text(json.dumps(meta))
        match = 'not an increasing sequence'
    with pytest.raises(CorruptIndexError, match=match):
        MultiVectorIndex(path).payload()


def test_corrupt_faiss_file_is_named(collection, tmp_path):
    import shutil
    _, index = collection
    shutil.copytree(index.path, tmp_path / 'copy')
    copy = MultiVectorIndex(tmp_path / 'copy', verbose=False)
    copy.ann_retriever(ann='flat', candidates=4)(topics_frame([np.ones((1, 16))]))
    ann_file = tmp_path / 'copy' / 'ann.Flat.faiss'
    ann_file.write_bytes(b'not a faiss index')
    # the index object keeps the FAISS index it loaded; another one reads the file again
    copy = MultiVectorIndex(tmp_path / 'copy', verbose=False)
    with pytest.raises(CorruptIndexError, match='ann.Flat.faiss.*no readable stamp'):
        copy.ann_retriever(ann='flat', candidates=4)(topics_frame([np.ones((1, 16))]))


def test_bad_records_and_queries_are_named(collection, tmp_path):
    _, index = collection
    with pytest.raises(ValueError, match="document 'b' has vectors of size 3, expected 2"):
        MultiVectorIndex(tmp_path / 'a').index([{'docno': 'a', 'doc_embs': np.ones((2, 2))},
                                               {'docno': 'b', 'doc_embs': np.ones((1, 3))}])
    with pytest.raises(ValueError, match='non-empty 2-D'):
        MultiVectorIndex(tmp_path / 'b').index([{'docno': 'a', 'doc_embs': np.ones((0, 2))}])
    with pytest.raises(KeyError, match='neither doc_embs nor doc_vec'):
        MultiVectorIndex(tmp_path / 'c').index([{'docno': 'a', 'text': 'x'}])
    with pytest.raises(ValueError, match='nothing to index'):
        MultiVectorIndex(tmp_path / 'd').index([])
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="query 'q0'.*rows of size 16.*got shape \\(2, 5\\)"):
        index.maxsim_retriever()(topics_frame([np.ones((2, 5))]))
    with pytest.raises(pt.validate.InputValidationError, match='query_embs'):
        index.maxsim_retriever()(pd.DataFrame({'qid': ['1'], 'query': ['x']}))


@pytest.mark.parametrize('make, name', [
    (lambda index, v: index.retriever(num_results=v), 'num_results'),
    (lambda index, v: index.retriever(batch_size=v), 'batch_size'),
    (lambda index, v: index.retriever(block_vectors=v), 'block_vectors'),
    (lambda index, v: index.retriever(tile_bytes=v), 'tile_bytes'),
    (lambda index, v: index.ann_retriever(candidates=v), 'candidates'),
    (lambda index, v: index.ann_retriever(search_effort=v), 'search_effort'),
    (lambda index, v: index.scorer(num_results=v), 'num_results'),
    (lambda index, v: index.mean_retriever(num_results=v), 'num_results'),
    (lambda index, v: index.multiquery_retriever(num_results=v), 'num_results'),
    (lambda index, v: index.multiquery_retriever(per_vector_results=v), 'per_vector_results'),
    (lambda index, v: index.indexer().index_arrays(['a'], np.ones((1, 16)), [1], chunk_docs=v), 'chunk_docs'),
])
def test_counts_below_one_are_refused_by_name(collection, make, name):
    _, index = collection   # not silently no results, nor an error from deep inside the search
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f'{name} must be positive, got {bad}'):
            make(index, bad)


def test_empty_frames(collection):
    _, index = collection
    empty = topics_frame([])
    for retriever in (index.maxsim_retriever(), index.ann_retriever(ann='flat'),
                      index.mean_retriever(), index.multiquery_retriever()):
        out = retriever(empty)
        assert len(out) == 0 and {'qid', 'docno', 'score', 'rank'} <= set(out.columns), retriever
        assert out['docno'].dtype == object and out['rank'].dtype == np.int64, retriever
    scored = index.scorer()(pd.DataFrame(columns=['qid', 'query', 'docno', 'score', 'rank', 'query_embs']))
    assert len(scored) == 0


def test_round_robin_hand_case():
    lists = [['a', 'b', 'c'], ['b', 'd'], ['e', 'a', 'f', 'g']]
    # rank 0: a, b, e; rank 1: (b taken), d, (a taken); rank 2: c, f; rank 3: g
    assert round_robin(lists, 10) == ['a', 'b', 'e', 'd', 'c', 'f', 'g']
    assert round_robin(lists, 4) == ['a', 'b', 'e', 'd']
    assert round_robin([], 3) == []


def test_multiquery_retriever_merges_each_vectors_list(tmp_path):
    # one vector per document on the axes; the query's two vectors point at d0 and d1 (then d2 and d3)
    vecs = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [.9, 0, .1, 0], [0, .8, 0, .1], [0, 0, 0, 1]], dtype=np.float32)
    index = MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(
        [{'docno': f'd{i}', 'doc_vec': v} for i, v in enumerate(vecs)])
    topics = topics_frame([np.array([[1, 0, 0, 0], [0, 1, 0, 0]], dtype=np.float32)])
    rr = index.multiquery_retriever(num_results=4)(topics)
    assert list(rr['docno']) == ['d0', 'd1', 'd2', 'd3']
    assert list(rr['rank']) == [0, 1, 2, 3] and rr['score'].is_monotonic_decreasing
    summed = index.multiquery_retriever('score_sum', num_results=2)(topics)
    assert list(summed['docno']) == ['d0', 'd1'] and list(summed['score']) == pytest.approx([1., 1.])
    rrf = index.multiquery_retriever('rrf', num_results=3)(topics)
    assert list(rrf['docno'])[:2] in (['d0', 'd1'], ['d1', 'd0'])
    with pytest.raises(ValueError, match='merge'):
        index.multiquery_retriever('concat')


def test_mean_retriever(collection):
    docs, index = collection
    query = np.random.default_rng(4).normal(size=(3, 16)).astype(np.float32)
    out = index.mean_retriever(num_results=5)(topics_frame([query]))
    means = np.stack([d['doc_embs'].mean(axis=0) for d in docs])
    expected = means @ query.mean(axis=0)
    assert list(out['docno']) == [f'd{j}' for j in np.argsort(-expected)[:5]]
    np.testing.assert_allclose(out['score'], np.sort(expected)[::-1][:5], rtol=1e-5)


def test_mean_retriever_wherever_maxsim_searches(tmp_path):
    """One document, accented docnos (which npids, FlexIndex's docno writer, fails on), vectors that cancel out."""
    from pyterrier_dr import FlexIndex
    query = pd.DataFrame({'qid': ['q'], 'query_embs': [np.array([[1., 2.]], dtype=np.float32)]})
    one = MultiVectorIndex(tmp_path / 'one', verbose=False).index([{'docno': 'only', 'doc_embs': np.ones((1, 2))}])
    assert one.mean_retriever()(query)[['docno', 'score']].values.tolist() == [['only', 3.]]
    docs = [{'docno': 'é', 'doc_embs': [[1., 0.], [-1., 0.]]}, {'docno': 'è', 'doc_embs': [[0., 2.], [0., 4.]]}]
    accents = MultiVectorIndex(tmp_path / 'accents', verbose=False).index(docs)
    assert accents.mean_retriever()(query)[['docno', 'score']].values.tolist() == [['è', 6.], ['é', 0.]]
    cosine = accents.mean_retriever(normalise=True)(query)   # the zero mean stays zero, as a zero query does
    assert cosine['docno'].tolist() == ['è', 'é'] and cosine['score'].tolist() == pytest.approx([2 / 5 ** .5, 0.])
    zero = accents.mean_retriever(normalise=True)(query.assign(query_embs=[np.zeros((2, 2), dtype=np.float32)]))
    assert zero['docno'].tolist() == ['é', 'è'] and zero['score'].tolist() == [0., 0.]
    flex = FlexIndex(str(tmp_path / 'accents' / 'mean.flex'))  # a FlexIndex pyterrier_dr reads
    assert list(flex.payload()[0].fwd[[0, 1]]) == ['é', 'è']
    np.testing.assert_array_equal(flex.payload()[1], [[0., 0.], [0., 3.]])


def test_maxsim_scorer_rescoring(collection):
    docs, index = collection
    query = np.random.default_rng(5).normal(size=(4, 16)).astype(np.float32)
    frame = pd.DataFrame({'qid': 'q0', 'query': 'x', 'docno': ['d3', 'd7', 'd1'], 'score': [0., 0., 0.],
                          'query_embs': [query] * 3})
    out = index.scorer()(frame)
    expected = brute_force([docs[3], docs[7], docs[1]], query)
    assert list(out.sort_values('rank')['docno']) == [['d3', 'd7', 'd1'][j] for j in np.argsort(-expected)]
    np.testing.assert_allclose(out.set_index('docno').loc[['d3', 'd7', 'd1'], 'score'], expected, rtol=1e-5)
    with pytest.raises(KeyError, match="docno 'nope' is not in the index"):
        index.scorer()(frame.assign(docno=['d3', 'nope', 'd1']))


def test_rank_cutoff_fuses_and_equality(collection):
    _, index = collection
    retriever = index.maxsim_retriever(num_results=100)
    assert retriever == index.maxsim_retriever(num_results=100)
    assert hash(retriever) == hash(index.maxsim_retriever(num_results=100))
    assert retriever != index.ann_retriever(num_results=100)
    assert (retriever % 10).compile() == index.maxsim_retriever(num_results=10)
    assert (index.mean_retriever() % 5).compile() == index.mean_retriever(num_results=5)
    # the per-vector lists keep their length: only the merged list is cut
    assert (index.multiquery_retriever() % 5).compile() == index.multiquery_retriever(num_results=5,
                                                                                      per_vector_results=1000)


def test_overwrite_replaces_only_an_index(tmp_path):
    folder = tmp_path / 'mine'
    folder.mkdir()
    (folder / 'keep.txt').write_text('precious')
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match='not a MultiVectorIndex .*no pt_meta.json'):
            MultiVectorIndex(folder, verbose=False).indexer(overwrite=overwrite).index(random_collection(3))
    assert (folder / 'keep.txt').read_text() == 'precious'
    (tmp_path / 'file').write_text('x')
    with pytest.raises(FileExistsError, match='is a file, not an index folder'):
        MultiVectorIndex(tmp_path / 'file', verbose=False).indexer(overwrite=True).index(random_collection(3))
    (tmp_path / 'other').mkdir()
    (tmp_path / 'other' / 'pt_meta.json').write_text('{"type": "dense_index", "format": "flex"}')
    with pytest.raises(FileExistsError, match='dense_index/flex artifact'):
        MultiVectorIndex(tmp_path / 'other', verbose=False).indexer(overwrite=True).index(random_collection(3))
    assert (tmp_path / 'file').read_text() == 'x' and len(list((tmp_path / 'other').iterdir())) == 1
    # an empty folder is built into; an index is replaced only with overwrite=True
    (tmp_path / 'empty').mkdir()
    index = MultiVectorIndex(tmp_path / 'empty', verbose=False).index(random_collection(3))
    assert len(index) == 3
    with pytest.raises(FileExistsError, match='an index already exists'):
        index.index(random_collection(4))
    assert len(index.indexer(overwrite=True).index(random_collection(4))) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ['empty', 'file', 'mine', 'other']


@pytest.mark.parametrize('docnos', [['d1'], ['a'], ['0'], ['7'], [f'doc-{i}-x' for i in range(300)] + ['z' * 30]])
def test_docnos_npids_cannot_store_alone(tmp_path, docnos):
    # a one-document index, and a last document that opens a new npids block on its own, used to divide by zero
    records = [{'docno': d, 'doc_vec': np.full(4, i + 1, dtype=np.float32)} for i, d in enumerate(docnos)]
    index = MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(records)
    out = index.maxsim_retriever(num_results=len(docnos))(topics_frame([np.ones((1, 4))]))
    assert out['docno'].tolist() == docnos[::-1]


@pytest.mark.parametrize('docnos, match', [
    (['d1', 'd2', 'd1'], "docno 'd1' occurs more than once \\(documents 0 and 2\\)"),
    (['d1', 'd1'], "docno 'd1' occurs more than once"),
    ([1, 2], "docno 1 \\(int\\) is not a non-empty string.*str\\(\\)"),
    (['a', ''], "docno '' \\(str\\) is not a non-empty string"),
])
def test_bad_docnos_are_named(tmp_path, docnos, match):
    records = [{'docno': d, 'doc_vec': np.ones(4)} for d in docnos]
    with pytest.raises(ValueError, match=match):
        MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(records)
    assert list(tmp_path.iterdir()) == []


def test_non_finite_vectors_are_named(collection, tmp_path):
    _, index = collection
    embs = np.ones((2, 4), dtype=np.float32)
    embs[1, 2] = np.nan
    with pytest.raises(ValueError, match="document 'b' has non-finite values"):
        MultiVectorIndex(tmp_path / 'mvi', verbose=False).index([{'docno': 'a', 'doc_embs': np.ones((1, 4))},
                                                                 {'docno': 'b', 'doc_embs': embs}])
    with pytest.raises(ValueError, match="document 'a' has non-finite values .*beyond float16"):
        MultiVectorIndex(tmp_path / 'mvi', verbose=False).indexer(dtype='float16').index(
            [{'docno': 'a', 'doc_vec': np.full(4, 1e6)}])
    assert list(tmp_path.iterdir()) == []
    for value in (np.nan, np.inf):
        query = np.ones((2, 16), dtype=np.float32)
        query[1, 0] = value
        topics = topics_frame([np.ones((1, 16)), query])
        scored = pd.DataFrame({'qid': 'q1', 'query': 'x', 'docno': ['d0'], 'score': [0.], 'query_embs': [query]})
        cases = ((index.maxsim_retriever(), topics), (index.ann_retriever(ann='flat'), topics),
                 (index.mean_retriever(), topics), (index.scorer(), scored),
                 *((index.multiquery_retriever(merge), topics) for merge in ('round_robin', 'score_sum', 'rrf')))
        for transformer, frame in cases:
            with pytest.raises(ValueError, match="query 'q1': query_embs has non-finite values"):
                transformer(frame)


def test_a_query_without_vectors_is_named(collection):
    _, index = collection
    for merge in ('round_robin', 'score_sum', 'rrf'):
        with pytest.raises(ValueError, match="query 'q1': query_embs must be a non-empty 2-D array.*\\(0, 16\\)"):
            index.multiquery_retriever(merge)(topics_frame([np.ones((1, 16)), np.zeros((0, 16))]))


@pytest.mark.parametrize('meta, match', [
    ([], 'holds a JSON list, not an object'),
    ({'type': 'multi_vector_index', 'format': 'mvi', 'dim': 16, 'doc_count': 300, 'vec_count': 10}, "dtype None"),
    ({'dtype': 'float64'}, "dtype 'float64'; expected one of \\['float32', 'float16'\\]"),
    ({'doc_count': '300'}, "doc_count must be a positive integer, got '300'"),
    ({'dim': 0}, 'dim must be a positive integer'),
])
def test_corrupt_metadata_is_named(collection, tmp_path, meta, match):
    import shutil
    _, index = collection
    shutil.copytree(index.path, tmp_path / 'copy')
    if isinstance(meta, dict) and 'type' not in meta:
        meta = {**json.loads((index.path / 'pt_meta.json').read_text()), **meta}
    (tmp_path / 'copy' / 'pt_meta.json').write_text(json.dumps(meta))
    with pytest.raises(CorruptIndexError, match=match):
        MultiVectorIndex(tmp_path / 'copy').payload()


def test_stale_build_folders_are_cleaned(tmp_path):
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f'.mvi.building-{dead_pid}'
    stale.mkdir()
    (stale / 'vecs.f4').write_bytes(b'\0' * 64)
    alive = tmp_path / f'.mvi.building-{os.getppid()}'  # a build still running elsewhere is left alone
    alive.mkdir()
    MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(random_collection(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name, 'mvi']


@pytest.mark.parametrize('search', [{}, {'ann': 'flat'}], ids=['exact', 'ann'])
def test_retriever_follows_a_rebuilt_index(tmp_path, search):
    first = [{'docno': f'a{i}', 'doc_vec': np.eye(4, dtype=np.float32)[i]} for i in range(4)]
    second = [{'docno': f'b{i}', 'doc_vec': np.eye(4, dtype=np.float32)[3 - i]} for i in range(4)]
    index = MultiVectorIndex(tmp_path / 'mvi', verbose=False).index(first)
    retriever = (index.ann_retriever if search else index.retriever)(num_results=1, **search)
    topics = topics_frame([np.eye(4, dtype=np.float32)[:1]])
    assert retriever(topics)['docno'].tolist() == ['a0']
    # another object, as another process would
    MultiVectorIndex(tmp_path / 'mvi', verbose=False).indexer(overwrite=True).index(second)
    assert retriever(topics)['docno'].tolist() == ['b3']


@pytest.mark.parametrize('background_bytes', [core.BACKGROUND_BYTES, 1])
def test_arrays_index_in_bulk_as_records_do(tmp_path, monkeypatch, background_bytes):
    # with 1 byte, every chunk is written and hashed by the background thread; the records are written at once
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 6, size=300)
    vectors = rng.normal(size=(lengths.sum(), 8)).astype(np.float32)
    docnos = [f'd{i}' for i in range(300)]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    records = MultiVectorIndex(tmp_path / 'records', verbose=False).indexer(dtype='float16').index(
        {'docno': d, 'doc_embs': vectors[offsets[i]:offsets[i + 1]]} for i, d in enumerate(docnos))
    monkeypatch.setattr(core, 'BACKGROUND_BYTES', background_bytes)
    bulk = MultiVectorIndex(tmp_path / 'bulk', verbose=False).indexer(dtype='float16').index_arrays(
        docnos, vectors, lengths, chunk_docs=64)
    bulk_meta, bulk_vectors, bulk_offsets, bulk_docnos = bulk.payload()
    meta, stored, stored_offsets, stored_docnos = records.payload()
    np.testing.assert_array_equal(bulk_vectors, stored)
    np.testing.assert_array_equal(bulk_offsets, stored_offsets)
    assert list(bulk_docnos.fwd[np.arange(300)]) == docnos
    assert {k: v for k, v in bulk_meta.items() if k != 'build_id'} == {k: v for k, v in meta.items() if k != 'build_id'}


@pytest.mark.parametrize('given', ['float16', 'float32'])
def test_arrays_from_a_read_only_memory_map_of_unit_vectors(tmp_path, given):
    # unit vectors make every row a candidate for the largest norm, summed a step of rows at a time; a float16 map
    # is stored as it is, a float32 one converted by torch, with no warning about the map being read-only
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(3000 * 8, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    np.save(tmp_path / 'vectors.npy', vectors.astype(given))
    mapped = np.load(tmp_path / 'vectors.npy', mmap_mode='r')
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='.*not writable')
        index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer(dtype='float16').index_arrays(
            [f'd{i}' for i in range(3000)], mapped, np.full(3000, 8))
    meta, stored, _, _ = index.payload()
    expected = vectors.astype(np.float16)
    np.testing.assert_array_equal(stored, expected)
    wide = expected.astype(np.float64)
    assert meta['max_norm'] == math.sqrt(max(float(row @ row) for row in wide))


def test_the_largest_norm_is_found_where_float32_sums_rank_it_second(tmp_path):
    # a: 1 and 127 values of 2^-12, squared norm 1 + 127 * 2^-24; b: 1 and 0.00256 (float16: 0.0025597...), 1 +
    # 6.55e-6. Summed in float32, a's small squares are partly rounded away (1 + 5.96e-6 here), below b's
    longest = np.full(128, 2.0 ** -12, dtype=np.float16)
    longest[0] = 1
    other = np.zeros(128, dtype=np.float16)
    other[:2] = [1, 0.00256]
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer(dtype='float16').index_arrays(
        ['a', 'b'], np.stack([longest, other]), [1, 1])
    assert index.payload()[0]['max_norm'] == math.sqrt(1 + 127 * 2.0 ** -24)


def test_writes_in_the_background_keep_their_order_and_raise_their_errors(monkeypatch):
    monkeypatch.setattr(core, 'BACKGROUND_BYTES', 4096)
    class File:
        def __init__(self, fail_at=None):
            self.blocks, self.fail_at = [], fail_at

        def write(self, data):
            time.sleep(0.01 if len(data) >= 4096 else 0)   # a slow disk: a block written out of turn would show
            if len(self.blocks) == self.fail_at:
                raise OSError('No space left on device')
            self.blocks.append(bytes(data))

    blocks = [bytes([i]) * size for i, size in enumerate([3, 5000, 1, 2, 7000, 9000, 4])]
    file, digest = File(), hashlib.sha256()
    with core._hashed_writes(file, digest) as write:   # 4 KiB and more in the background, interleaved with the rest
        for block in blocks:
            write(memoryview(block))
    assert file.blocks == blocks
    assert digest.hexdigest() == hashlib.sha256(b''.join(blocks)).hexdigest()
    with pytest.raises(OSError, match='No space left'):
        with core._hashed_writes(File(fail_at=4), hashlib.sha256()) as write:
            for block in blocks:
                write(memoryview(block))


def test_records_that_reuse_one_array_are_stored_as_each_was(tmp_path):
    # a generator refilling its array for the next document while the last (1 MiB: written in the background) waits
    buffer = np.zeros((core.BACKGROUND_BYTES // (4 * 64), 64), dtype=np.float32)

    def records():
        for i in range(10):
            buffer[:] = i
            yield {'docno': f'd{i}', 'doc_embs': buffer}
    _, vectors, offsets, _ = MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index(records()).payload()
    assert [np.unique(vectors[offsets[i]:offsets[i + 1]]).tolist() for i in range(10)] == [[i] for i in range(10)]


def test_a_bad_document_stops_a_build_written_in_the_background(tmp_path, monkeypatch):
    monkeypatch.setattr(core, 'BACKGROUND_BYTES', 1)
    vectors = np.ones((400, 4), dtype=np.float32)
    vectors[-1, 2] = np.nan
    with pytest.raises(ValueError, match="document 'd199' has non-finite"):
        MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index_arrays(
            [f'd{i}' for i in range(200)], vectors, np.full(200, 2), chunk_docs=16)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('docnos, lengths, vectors, message', [
    (['a', 'b'], [1, 2], np.ones((4, 2)), 'adding up to the rows'),
    (['a', 'b'], [1, 0], np.ones((1, 2)), 'each length positive'),
    (['a'], [1, 1], np.ones((2, 2)), 'as many docnos as lengths'),
    (['a', 'a'], [1, 1], np.ones((2, 2)), "docno 'a' occurs more than once"),
    (['a', 7], [1, 1], np.ones((2, 2)), 'docno 7 .* is not a non-empty string'),
    (['a', 'b', 'c'], [1, 2, 1], np.array([[1, 2], [3, 4], [np.nan, 0], [5, 6]]), "document 'b' has non-finite"),
    (['a', 'b'], [1, 1], [[1., 2.], [np.inf, 0.]], "document 'b' has non-finite"),   # a list is an array too
])
def test_bad_arrays_are_rejected_naming_the_problem(tmp_path, docnos, lengths, vectors, message):
    with pytest.raises(ValueError, match=message):
        MultiVectorIndex(tmp_path / 'index', verbose=False).indexer().index_arrays(docnos, vectors, lengths)
    assert not (tmp_path / 'index').exists() or not any((tmp_path / 'index').iterdir())
