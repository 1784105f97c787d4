"""The multi-vector encoder base: its transformers, batching, device, repr and equality, on a tiny model."""
import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

torch = pytest.importorskip('torch')

from pyterrier_multiquery.multivector_encoder import Encoded, MultiVectorEncoder  # noqa: E402

VOCAB = {'cats': 0, 'dogs': 1, 'heart': 2, 'disease': 3}


class WordRows(MultiVectorEncoder):
    """A query is the table rows of its first ``k`` words, a document those of its last ``k``; the sparse weights
    are word counts. Every batch it is given is recorded."""
    sparse = True
    settings = ('k',)

    def __init__(self, table, *, k: int = 2, **settings):
        self.table, self.k, self.batches = table, k, []
        super().__init__(**settings)

    @property
    def module(self):
        return self.table

    def _rows(self, texts, words):
        self.batches.append(list(texts))
        embs = [self.table(torch.tensor([VOCAB[w] for w in words(t.split())])).numpy() for t in texts]
        return Encoded(embs, [{w: float(t.split().count(w)) for w in t.split()} for t in texts])

    def encode_query_batch(self, texts):
        return self._rows(texts, lambda w: w[:self.k])

    def encode_doc_batch(self, texts):
        return self._rows(texts, lambda w: w[-self.k:])


class DenseRows(WordRows):
    sparse = False


@pytest.fixture
def table():
    module = torch.nn.Embedding(4, 3)
    with torch.no_grad():
        module.weight.copy_(torch.arange(12, dtype=torch.float32).reshape(4, 3))
    return module


ROWS = np.arange(12, dtype=np.float32).reshape(4, 3)
QUERIES = pd.DataFrame({'qid': ['1', '2', '3'], 'query': ['cats dogs heart', 'heart', 'cats dogs heart']})
DOCS = pd.DataFrame({'docno': ['a', 'b', 'c', 'd'], 'text': ['cats dogs heart', 'disease', 'dogs dogs', 'heart cats']})


def test_query_encoder_exact_outputs_and_one_encoding_per_distinct_query(table):
    enc = WordRows(table, device='cpu')
    out = enc.query_encoder()(QUERIES)
    assert list(out.columns) == ['qid', 'query', 'query_embs', 'query_toks']
    np.testing.assert_array_equal(out['query_embs'][0], ROWS[[0, 1]])
    np.testing.assert_array_equal(out['query_embs'][1], ROWS[[2]])
    np.testing.assert_array_equal(out['query_embs'][2], ROWS[[0, 1]])
    assert all(e.dtype == np.float32 for e in out['query_embs'])
    assert out['query_toks'].tolist() == [{'cats': 1., 'dogs': 1., 'heart': 1.}, {'heart': 1.}] + \
        [{'cats': 1., 'dogs': 1., 'heart': 1.}]
    assert enc.batches == [['cats dogs heart', 'heart']]


def test_doc_encoder_exact_outputs(table):
    enc = WordRows(table, device='cpu')
    out = enc.doc_encoder()(DOCS)
    assert list(out.columns) == ['docno', 'text', 'doc_embs', 'toks']
    for embs, rows in zip(out['doc_embs'], [[1, 2], [3], [1, 1], [2, 0]]):
        np.testing.assert_array_equal(embs, ROWS[rows])
    assert out['toks'][2] == {'dogs': 2.}


def test_batching_does_not_change_the_output(table):
    one, three = WordRows(table, batch_size=1, device='cpu'), WordRows(table, batch_size=3, device='cpu')
    a, b = one.doc_encoder()(DOCS), three.doc_encoder()(DOCS)
    assert [len(batch) for batch in one.batches] == [1, 1, 1, 1]
    assert [len(batch) for batch in three.batches] == [3, 1]
    for x, y in zip(a['doc_embs'], b['doc_embs']):
        np.testing.assert_array_equal(x, y)
    assert a['toks'].tolist() == b['toks'].tolist()
    one.doc_encoder(batch_size=2)(DOCS)
    assert [len(batch) for batch in one.batches[4:]] == [2, 2]


def test_empty_frames_get_the_columns(table):
    sparse, dense = WordRows(table, device='cpu'), DenseRows(table, device='cpu')
    assert list(sparse.query_encoder()(QUERIES.iloc[:0]).columns) == ['qid', 'query', 'query_embs', 'query_toks']
    assert list(sparse.doc_encoder()(DOCS.iloc[:0]).columns) == ['docno', 'text', 'doc_embs', 'toks']
    assert list(dense.query_encoder()(QUERIES.iloc[:0]).columns) == ['qid', 'query', 'query_embs']
    assert list(dense.doc_encoder()(DOCS.iloc[:0]).columns) == ['docno', 'text', 'doc_embs']
    assert sparse.batches == [] and dense.batches == []
    assert pt.inspect.transformer_outputs(dense.doc_encoder(), ['docno', 'text']) == ['docno', 'text', 'doc_embs']


def test_missing_columns_are_named(table):
    enc = WordRows(table, device='cpu')
    with pytest.raises(pt.validate.InputValidationError, match='query'):
        enc.query_encoder()(pd.DataFrame({'qid': ['1']}))
    with pytest.raises(pt.validate.InputValidationError, match='body'):
        enc.doc_encoder(text_field='body')(DOCS)
    with pytest.raises(pt.validate.InputValidationError, match='query_encoder'):
        enc(pd.DataFrame({'qid': ['1']}))


def test_missing_texts_are_named_not_encoded_as_another_rows(table):
    enc = WordRows(table, device='cpu')
    for missing in (None, np.nan):
        queries = pd.DataFrame({'qid': ['1', '2', '3'], 'query': ['cats', missing, 'dogs']})
        with pytest.raises(ValueError, match=r"'query' is missing or not a string for qid \['2'\]"):
            enc.query_encoder()(queries)
    docs = pd.DataFrame({'docno': [f'd{i}' for i in range(7)], 'text': [None] * 6 + ['cats']})
    with pytest.raises(ValueError, match=r"'text' .* for docno \['d0', 'd1', 'd2', 'd3', 'd4'\] and 1 more"):
        enc.doc_encoder()(docs)
    assert enc.batches == []


def test_the_encoder_picks_the_side_from_the_columns(table):
    enc = WordRows(table, text_field='body', device='cpu')
    assert 'query_embs' in enc(QUERIES).columns
    docs = enc(DOCS.rename(columns={'text': 'body'}))
    np.testing.assert_array_equal(docs['doc_embs'][1], ROWS[[3]])


def test_device_and_eval_mode(table):
    table.train()
    enc = WordRows(table, device='cpu')
    assert enc.device == 'cpu' and not table.training
    with pytest.raises(ValueError, match='batch_size must be at least 1'):
        WordRows(table, batch_size=0, device='cpu')


def test_repr_and_equality(table):
    enc = WordRows(table, device='cpu')
    assert repr(enc) == 'WordRows(Embedding, k=2)'
    assert repr(enc.query_encoder()) == 'WordRows(Embedding, k=2).query_encoder()'
    assert repr(enc.doc_encoder()) == 'WordRows(Embedding, k=2).doc_encoder()'
    same = WordRows(table, device='cpu')
    assert enc == same and hash(enc) == hash(same)
    assert enc != WordRows(table, k=3, device='cpu')
    assert enc != WordRows(torch.nn.Embedding(4, 3), device='cpu')   # another model object
    assert enc != WordRows(table, batch_size=4, device='cpu')
    assert enc == WordRows(table, verbose=True, device='cpu')   # a progress bar changes no output
    assert enc.query_encoder() == same.query_encoder() and hash(enc.query_encoder()) == hash(same.query_encoder())
    assert enc.doc_encoder() == same.doc_encoder() and hash(enc.doc_encoder()) == hash(same.doc_encoder())
    assert enc.query_encoder() != enc.query_encoder(batch_size=1)
    assert enc.doc_encoder() != enc.doc_encoder(text_field='body')
    assert enc.query_encoder() != enc.doc_encoder()
    assert pt.inspect.subtransformers(enc.query_encoder()) == {}


def test_progress_bar_when_verbose(table, capsys):
    WordRows(table, device='cpu', verbose=True).query_encoder()(QUERIES)
    assert 'WordRows(Embedding, k=2).query_encoder()' in capsys.readouterr().err
    WordRows(table, device='cpu').doc_encoder()(DOCS)
    assert capsys.readouterr().err == ''


def test_rank_cutoff_fuses_before_encoding(table):
    enc = WordRows(table, device='cpu')
    results = pd.DataFrame({'qid': '1', 'query': 'cats', 'docno': ['a', 'b', 'c'], 'text': DOCS['text'][:3],
                            'score': [3., 2., 1.], 'rank': [0, 1, 2]})
    pipeline = (enc.doc_encoder() % 2).compile()
    assert pipeline(results)['docno'].tolist() == ['a', 'b']
    assert enc.batches == [['cats dogs heart', 'disease']]
