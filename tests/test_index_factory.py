"""The index as a factory, as pyterrier_dr's FlexIndex: retriever(), scorer(), docnos() and get_corpus_iter() on a
MultiVectorIndex and a ShardedMultiVectorIndex, on a collection small enough to work out by hand."""
import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.index import MultiVectorIndex, ShardedMultiVectorIndex
from pyterrier_multiquery.index.maxsim import MaxSimRetriever, MaxSimScorer

DOCS = [{'docno': 'a', 'doc_embs': np.array([[1., 0.], [0., 1.]])},
        {'docno': 'b', 'doc_embs': np.array([[0.6, 0.8]])},
        {'docno': 'c', 'doc_embs': np.array([[0., -1.], [-1., 0.], [0.8, 0.6]])}]
#: query vectors (1, 0) and (0, 1), mean over them: a 1 and 1; b 0.6 and 0.8; c 0.8 and 0.6
QUERY = pd.DataFrame({'qid': ['q1'], 'query': ['x'], 'query_embs': [np.eye(2, dtype=np.float32)]})


@pytest.fixture(params=['single', 'sharded'])
def index(request, tmp_path):
    if request.param == 'single':
        return MultiVectorIndex(tmp_path / 'docs.mvi', verbose=False).index(DOCS)
    return ShardedMultiVectorIndex(tmp_path / 'docs.smvi', verbose=False).indexer(shard_size=2).index(DOCS)


def test_retriever_is_exact_maxsim(index):
    retriever = index.retriever(num_results=2)
    assert isinstance(retriever, MaxSimRetriever) and not hasattr(retriever, 'candidates')
    assert retriever == index.maxsim_retriever(num_results=2)  # the name the experiments use
    run = retriever(QUERY)
    assert run['docno'].tolist() == ['a', 'b'] and np.allclose(run['score'], [1., 0.7])
    assert index.ann_retriever(ann='flat') != index.retriever()


def test_scorer_rescores_a_result_frame(index):
    assert isinstance(index.scorer(), MaxSimScorer)
    results = QUERY.assign(docno=[['c', 'b']]).explode('docno').reset_index(drop=True).assign(score=[9., 8.])
    out = index.scorer()(results)
    assert out['docno'].tolist() == ['c', 'b'] and np.allclose(out['score'], [0.7, 0.7])
    assert out['rank'].tolist() == [0, 1]


def test_docnos_in_index_order(index):
    docnos = index.docnos()
    assert len(docnos) == 3 and [docnos.fwd[i] for i in range(3)] == ['a', 'b', 'c']
    assert int(docnos.inv['c']) == 2


def test_get_corpus_iter_gives_back_what_was_indexed(index, tmp_path):
    documents = list(index.get_corpus_iter(verbose=False))
    assert [d['docno'] for d in documents] == ['a', 'b', 'c']
    for got, given in zip(documents, DOCS):
        assert got['doc_embs'].dtype == np.float32
        assert np.array_equal(got['doc_embs'], given['doc_embs'].astype(np.float32))
    copy = MultiVectorIndex(tmp_path / 'copy.mvi', verbose=False).index(index.get_corpus_iter(verbose=False))
    pd.testing.assert_frame_equal(copy.retriever()(QUERY), index.retriever()(QUERY))


def test_indexes_are_equal_by_class_and_path(index, tmp_path):
    same = type(index)(index.path, verbose=True)
    assert same == index and hash(same) == hash(index)
    assert type(index)(tmp_path / 'elsewhere') != index
    assert same.retriever() == index.retriever()  # so retrievers built from either are equal too
