import math

import pytest

from pyterrier_multiquery.cdp import content_word_count, content_words, diversity_advice, self_bleu


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
