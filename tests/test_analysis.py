import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.analysis import (distance_quartiles, low_similarity_subset, paired_bootstrap,
                                           target_distances)

VECTORS = {'a': np.array([1., 0.]), 'b': np.array([0., 1.]), 'c': np.array([-1., 0.]), 'd': np.array([2., 0.])}


def test_target_distances_hand_case():
    qrels = pd.DataFrame({'qid': ['1', '1', '1', '2', '2', '3', '3'],
                          'docno': ['a', 'b', 'c', 'a', 'd', 'a', 'b'],
                          'label': [1, 1, 1, 1, 1, 1, 0]})
    distances = target_distances(qrels, VECTORS)
    # q1: cosine distances a-b 1, a-c 2, b-c 1 -> mean 4/3; q2: a and d point the same way -> 0; q3: one target
    assert distances['1'] == pytest.approx(4 / 3)
    assert distances['2'] == pytest.approx(0.)
    assert np.isnan(distances['3'])
    # a lookup function works as a mapping does; euclidean is another pdist metric
    euclid = target_distances(qrels, lambda docnos: np.stack([VECTORS[d] for d in docnos]), metric='euclidean')
    assert euclid['2'] == pytest.approx(1.)


def test_target_distances_needs_columns():
    with pytest.raises(ValueError, match=r"\['label'\]"):
        target_distances(pd.DataFrame({'qid': ['1'], 'docno': ['a']}), VECTORS)


def test_quartiles_and_low_similarity_third():
    distances = pd.Series({str(i): float(i) for i in range(12)} | {'nan': np.nan})
    quartiles = distance_quartiles(distances)
    # quartile edges of 0..11 lie at 2.75, 5.5 and 8.25
    assert list(quartiles[['0', '2', '3', '5', '6', '9', '11']]) == ['Q1', 'Q1', 'Q2', 'Q2', 'Q3', 'Q4', 'Q4']
    assert 'nan' not in quartiles.index
    assert list(low_similarity_subset(distances)) == ['11', '10', '9', '8']
    with pytest.raises(ValueError, match='fraction'):
        low_similarity_subset(distances, 0)


def test_paired_bootstrap_identical_systems():
    scores = {str(i): float(i % 3) for i in range(30)}
    result = paired_bootstrap(scores, scores)
    assert result['mean_diff'] == 0. and result['p_value'] == 1. and result['n_queries'] == 30


def test_paired_bootstrap_detects_a_consistent_gain_and_not_noise():
    rng = np.random.default_rng(1)
    base = pd.Series(rng.random(200), index=[str(i) for i in range(200)])
    better = paired_bootstrap(base + 0.1 + rng.normal(0, 0.05, 200), base)
    assert better['p_value'] < 0.001
    assert better['ci_low'] < better['mean_diff'] < better['ci_high'] and better['ci_low'] > 0
    noise = paired_bootstrap(base + rng.normal(0, 0.05, 200), base)
    assert noise['p_value'] > 0.05
    assert noise['ci_low'] < 0 < noise['ci_high']


def test_paired_bootstrap_p_value_against_the_sampling_distribution():
    # two queries with differences 1 and 0: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4;
    # |mean* - 0.5| >= 0.5 happens for 0 and 1, so p = 1/2
    result = paired_bootstrap({'a': 1., 'b': 0.}, {'a': 0., 'b': 0.}, n_resamples=200_000)
    assert result['p_value'] == pytest.approx(0.5, abs=0.01)


def test_paired_bootstrap_needs_the_same_queries():
    with pytest.raises(ValueError, match='same queries'):
        paired_bootstrap({'a': 1., 'b': 0.}, {'a': 0.})
    with pytest.raises(ValueError, match='at least one query'):
        paired_bootstrap({}, {})
