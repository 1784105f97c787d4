import math

import pytest

import numpy as np

from pyterrier_multiquery.cdp import (complexity_regression, condition_correlations, content_word_count,
                                     content_words, dist_sim, diversity_advice, len_sim, paraphrase_ratio, self_bleu)


def test_content_words_on_hand_counted_queries():
    assert content_words('What is the capital of France?') == {'capital', 'france'}
    assert content_words('How do mRNA vaccines trigger an immune response in older adults?') == \
        {'mrna', 'vaccines', 'trigger', 'immune', 'response', 'older', 'adults'}
    # repeated words count once; single characters and digits-only single characters are dropped
    assert content_words('Vitamin D and vitamin C: a 5 x comparison') == {'vitamin', 'comparison'}


def test_content_word_count_is_the_mean_per_query():
    assert content_word_count(['What is the capital of France?', 'Vitamin D and vitamin C: a 5 x comparison',
                               'who']) == pytest.approx((2 + 2 + 0) / 3)
    with pytest.raises(ValueError, match='at least one'):
        content_word_count([])


@pytest.mark.parametrize('cw, advice', [(3, 'avoid'), (6.99, 'avoid'), (7, 'either'), (10, 'either'), (10.5, 'use')])
def test_the_cw_rule(cw, advice):
    assert diversity_advice(cw) == advice


def test_self_bleu_on_hand_cases():
    assert self_bleu(['a b c d', 'a b c d']) == pytest.approx(1.0)
    assert self_bleu(['a b', 'c d']) == 0.0
    # one differing last word: precisions 3/4, 2/3, 1/2 and, smoothed, 1/2 for 4-grams; no brevity penalty
    assert self_bleu(['a b c d', 'a b c e']) == pytest.approx((3 / 4 * 2 / 3 * 1 / 2 * 1 / 2) ** 0.25)
    assert math.isnan(self_bleu(['only one']))


class Vectors:
    """A stand-in bi-encoder with fixed query vectors."""

    def __init__(self, table):
        self.table = table

    def encode_queries(self, texts):
        return np.array([self.table[t] for t in texts], dtype=np.float32)


class Judge:
    """A stand-in cross-encoder: scores 1 for pairs it was told are paraphrases."""

    def __init__(self, paraphrases):
        self.paraphrases = {frozenset(p) for p in paraphrases}

    def predict(self, pairs):
        return [1.0 if frozenset(p) in self.paraphrases else 0.0 for p in pairs]


def test_paraphrase_ratio_counts_pairs():
    queries = ['a', 'b', 'c']
    # a and b point the same way (cosine 0.995), c is orthogonal: 1 of 3 pairs
    encoder = Vectors({'a': [1, 0], 'b': [1, 0.1], 'c': [0, 1]})
    assert paraphrase_ratio(queries, encoder=encoder) == pytest.approx(1 / 3)
    assert paraphrase_ratio(queries, encoder=encoder, threshold=0.999) == 0.0
    assert paraphrase_ratio(queries, cross_encoder=Judge([('a', 'c'), ('b', 'c')])) == pytest.approx(2 / 3)
    assert math.isnan(paraphrase_ratio(['a'], encoder=encoder))
    with pytest.raises(ValueError, match='cross_encoder or an encoder'):
        paraphrase_ratio(queries)


def test_dist_sim_is_the_cosine_of_the_centroids():
    synthetic = np.array([[3.0, 0.0], [0.0, 2.0]])  # normalised: (1, 0) and (0, 1); centroid (0.5, 0.5)
    real = np.array([[1.0, 0.0]])
    assert dist_sim(synthetic, real) == pytest.approx(1 / math.sqrt(2))
    assert dist_sim(real * 5, real) == pytest.approx(1.0)
    assert dist_sim(np.array([[0.0, 1.0]]), real) == pytest.approx(0.0)


def test_len_sim_is_the_overlap_of_the_length_histograms():
    # synthetic lengths 2, 2, 4 -> {2: 2/3, 4: 1/3}; real lengths 2, 3 -> {2: 1/2, 3: 1/2}; overlap min(2/3, 1/2)
    assert len_sim(['a b', 'c d', 'e f g h'], ['a b', 'c d e']) == pytest.approx(0.5)
    assert len_sim(['a b', 'c d'], ['x y']) == pytest.approx(1.0)
    assert len_sim(['a'], ['a b']) == 0.0
    with pytest.raises(ValueError, match='at least one'):
        len_sim([], ['a'])


def test_complexity_regression_by_hand_and_against_numpy():
    # benefit = 0.5 CW - 3.5 exactly: r = 1 and the benefit is zero at CW 7
    fit = complexity_regression([5, 10, 15], [-1.0, 1.5, 4.0])
    assert fit['slope'] == pytest.approx(0.5) and fit['intercept'] == pytest.approx(-3.5)
    assert fit['r'] == pytest.approx(1.0) and fit['threshold'] == pytest.approx(7.0)
    rng = np.random.default_rng(0)
    cw = rng.uniform(3, 15, 20)
    benefit = 0.4 * cw - 3 + rng.normal(0, 1, 20)
    fit = complexity_regression(cw, benefit)
    slope, intercept = np.polyfit(cw, benefit, 1)
    assert fit['slope'] == pytest.approx(slope) and fit['threshold'] == pytest.approx(-intercept / slope)
    assert fit['r'] == pytest.approx(np.corrcoef(cw, benefit)[0, 1])
    assert 0 < fit['p'] < 0.05
    with pytest.raises(ValueError, match='three'):
        complexity_regression([1, 2], [1, 2])


def test_condition_correlations_per_condition():
    import pandas as pd
    table = pd.DataFrame({'condition': ['a'] * 4 + ['b'] * 3,
                          'CW': [4, 7, 9, 12, 4, 7, 9],
                          'benefit': [-2.0, 0.0, 1.0, 3.0, 1.0, 0.5, -1.0]})
    out = condition_correlations(table)
    assert list(out.index) == ['a', 'b'] and list(out['datasets']) == [4, 3]
    assert out.loc['a', 'r'] == pytest.approx(np.corrcoef([4, 7, 9, 12], [-2, 0, 1, 3])[0, 1])
    assert out.loc['b', 'r'] == pytest.approx(np.corrcoef([4, 7, 9], [1, 0.5, -1])[0, 1]) and out.loc['b', 'r'] < 0
    with pytest.raises(ValueError, match='benefit'):
        condition_correlations(table.drop(columns=['benefit']))
    with pytest.raises(ValueError, match='at least three'):
        condition_correlations(table.iloc[:6])
