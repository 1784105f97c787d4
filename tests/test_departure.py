import pandas as pd
import pytest

from pyterrier_multiquery.training.departure import choose_departure


def test_one_standard_error_rule_worked_by_hand():
    # weight 1 is best (mean 0.8125); weight 0.5 differs from it by (0, -0.5, 0, -0.75): mean -0.3125, se 0.1875
    # -> not within one error; weight 0.75 by (0, 0.1, 0, -0.2): mean -0.025, std 0.1258, se 0.0629 -> within
    scores = pd.DataFrame({0.5: [1., 0., 1., 0.], 0.75: [1., .6, 1., .55], 1.: [1., .5, 1., .75]})
    assert choose_departure(scores) == 0.75


def test_no_better_weight_means_the_first_stage():
    scores = pd.DataFrame({0.: [1., 0., 1.], 1.: [1., 0., 1.]})
    assert choose_departure(scores) == 0.


def test_a_clear_gain_keeps_the_trained_model():
    scores = pd.DataFrame({0.: [0., 0., 0., 0.], 0.5: [0., 1., 0., 1.], 1.: [1., 1., 1., 1.]})
    assert choose_departure(scores) == 1.


def test_bad_scores_are_rejected():
    with pytest.raises(ValueError, match='at least one weight'):
        choose_departure(pd.DataFrame())
    with pytest.raises(ValueError, match='NaN'):
        choose_departure(pd.DataFrame({0.: [1., None], 1.: [1., 1.]}))
