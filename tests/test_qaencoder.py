import re

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_multiquery.qaencoder import QAEncoder, grid_search, text_fingerprint


class BagOfWords:
    """A stand-in bi-encoder: word counts over a fixed vocabulary; queries and documents share the space."""

    def __init__(self, vocabulary):
        self.vocabulary = {w: i for i, w in enumerate(vocabulary)}
        self.calls = []

    def _encode(self, texts):
        self.calls.append(list(texts))
        out = np.zeros((len(texts), len(self.vocabulary)), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                out[row, self.vocabulary[word]] += 1
        return out

    encode_queries = _encode
    encode_docs = _encode


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.sqrt((v ** 2).sum())


@pytest.fixture
def docs():
    return pd.DataFrame({
        'docno': ['d1', 'd2'],
        'text': ['apollo moon landing', 'einstein relativity'],
        'querygen': [['who moon', 'when landing landing'], ['who einstein']],
    })


VOCAB = ['apollo', 'moon', 'landing', 'einstein', 'relativity', 'who', 'when']


def test_base_is_the_normalised_mean_of_normalised_query_vectors(docs):
    out = QAEncoder(BagOfWords(VOCAB), 'base')(docs)
    q1 = unit([0, 1, 0, 0, 0, 1, 0])          # who moon
    q2 = unit([0, 0, 2, 0, 0, 0, 1])          # when landing landing
    np.testing.assert_allclose(out['doc_vec'][0], unit((q1 + q2) / 2), atol=1e-6)
    np.testing.assert_allclose(out['doc_vec'][1], unit([0, 0, 0, 1, 0, 1, 0]), atol=1e-6)


def test_emb_interpolates_the_query_mean_with_the_document_vector(docs):
    alpha = 0.3
    out = QAEncoder(BagOfWords(VOCAB), 'emb', alpha=alpha)(docs)
    q_mean = unit((unit([0, 1, 0, 0, 0, 1, 0]) + unit([0, 0, 2, 0, 0, 0, 1])) / 2)
    d = unit([1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(out['doc_vec'][0], unit(alpha * q_mean + (1 - alpha) * d), atol=1e-6)
    # alpha = 0 is the plain document vector, alpha = 1 is QAE_base
    np.testing.assert_allclose(QAEncoder(BagOfWords(VOCAB), 'emb', alpha=0)(docs)['doc_vec'][1],
                               unit([0, 0, 0, 1, 1, 0, 0]), atol=1e-6)
    np.testing.assert_allclose(QAEncoder(BagOfWords(VOCAB), 'emb', alpha=1)(docs)['doc_vec'][0], q_mean, atol=1e-6)


def test_txt_with_a_large_beta_appends_every_query(docs):
    # beta large: the concatenation holds all queries (in some order); word counts ignore the order
    out = QAEncoder(BagOfWords(VOCAB), 'txt', beta=100)(docs)
    np.testing.assert_allclose(out['doc_vec'][0], unit([1, 2, 3, 0, 0, 1, 1]), atol=1e-6)
    np.testing.assert_allclose(out['doc_vec'][1], unit([0, 0, 0, 2, 1, 1, 0]), atol=1e-6)


def test_hyb_interpolates_the_query_mean_with_the_text_fingerprint(docs):
    out = QAEncoder(BagOfWords(VOCAB), 'hyb', alpha=0.5, beta=100)(docs)
    expected = unit(0.5 * unit([0, 0, 0, 1, 0, 1, 0]) + 0.5 * unit([0, 0, 0, 2, 1, 1, 0]))
    np.testing.assert_allclose(out['doc_vec'][1], expected, atol=1e-6)


def test_text_fingerprint_stops_at_beta_times_the_document_length():
    rng = np.random.default_rng(0)
    text = 'x' * 20
    queries = ['a' * 4, 'b' * 9, 'c' * 14]
    for beta in (0.0, 0.5, 1.0, 3.0):
        for _ in range(5):
            fingerprint = text_fingerprint(text, queries, beta, rng)
            assert fingerprint.startswith(text)
            appended = fingerprint[len(text):].split(' ')[1:]
            assert len(set(appended)) == len(appended)  # no query twice
            total = sum(len(q) + 1 for q in appended)
            # long enough, or every query used; and one query fewer would have been too short (at least one is
            # always appended)
            assert total >= beta * len(text) or len(appended) == len(queries)
            assert len(appended) == 1 or total - len(appended[-1]) - 1 < beta * len(text)
    # beta 3: 60 characters are never reached (only 30 appended), so every query is appended
    assert sorted(text_fingerprint(text, queries, 3.0, rng)[len(text) + 1:].split(' ')) == sorted(queries)


def test_txt_is_reproducible_per_document_whatever_the_batch(docs):
    qae = QAEncoder(BagOfWords(VOCAB), 'txt', beta=0.1, seed=3)
    whole = qae(docs)
    alone = qae(docs.iloc[[1, 0]].reset_index(drop=True))
    np.testing.assert_allclose(whole['doc_vec'][0], alone['doc_vec'][1])


def test_naive_writes_every_query_vector(docs):
    out = QAEncoder(BagOfWords(VOCAB), 'naive')(docs)
    assert out['doc_embs'][0].shape == (2, len(VOCAB)) and out['doc_embs'][1].shape == (1, len(VOCAB))
    np.testing.assert_allclose(out['doc_embs'][0][1], unit([0, 0, 2, 0, 0, 0, 1]), atol=1e-6)
    with_doc = QAEncoder(BagOfWords(VOCAB), 'naive', include_document=True)(docs)
    np.testing.assert_allclose(with_doc['doc_embs'][1][0], unit([0, 0, 0, 1, 1, 0, 0]), atol=1e-6)


def test_bad_inputs_are_named(docs):
    with pytest.raises(ValueError, match='unknown QAEncoder method'):
        QAEncoder(BagOfWords(VOCAB), 'mean')
    with pytest.raises(ValueError, match='alpha'):
        QAEncoder(BagOfWords(VOCAB), alpha=1.5)
    with pytest.raises(pt.validate.InputValidationError, match=r"\['querygen'\]"):
        QAEncoder(BagOfWords(VOCAB))(docs.drop(columns=['querygen']))
    bad = docs.copy()
    bad.at[1, 'querygen'] = []
    with pytest.raises(ValueError, match='d2'):
        QAEncoder(BagOfWords(VOCAB))(bad)
    empty = QAEncoder(BagOfWords(VOCAB))(docs.iloc[:0])
    assert 'doc_vec' in empty.columns and len(empty) == 0


@pytest.mark.parametrize('querygen', ['who einstein', None, ['who', 3]])
@pytest.mark.parametrize('method', ['base', 'txt', 'naive'])
def test_querygen_that_is_not_a_list_of_strings_is_named(docs, querygen, method):
    bad = docs.copy()
    bad['querygen'] = [['who moon'], querygen]  # a string used to be split into one query per character
    match = f"querygen of docno 'd2' must be a list of query strings, got {re.escape(repr(querygen))}"
    with pytest.raises(TypeError, match=match):
        QAEncoder(BagOfWords(VOCAB), method)(bad)


def test_grid_search_finds_the_alpha_that_ranks_the_relevant_document_first():
    # The query "who moon" matches d1's generated query exactly but shares nothing with d1's text, while
    # d2's text is "who": only a high alpha puts d1 first.
    docs = pd.DataFrame({'docno': ['d1', 'd2'], 'text': ['apollo landing', 'who'],
                         'querygen': [['who moon'], ['einstein']]})
    topics = pd.DataFrame({'qid': ['q1'], 'query': ['who moon']})
    qrels = pd.DataFrame({'query_id': ['q1'], 'doc_id': ['d1'], 'relevance': [1]})
    table = grid_search(BagOfWords(VOCAB), docs, topics, qrels, method='emb', alphas=[0.0, 1.0])
    assert list(table['alpha']) == [1.0, 0.0]
    assert table['nDCG@10'].tolist() == pytest.approx([1.0, 1 / np.log2(3)])
