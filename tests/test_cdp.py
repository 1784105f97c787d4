import math

import pytest

import numpy as np

from pyterrier_multiquery.cdp import content_word_count, content_words, diversity_advice, paraphrase_ratio, self_bleu


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
