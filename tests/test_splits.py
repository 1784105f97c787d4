"""The one development split that AMER's and JPR's trainers hold questions out with."""
import pytest

from pyterrier_multiquery.training.splits import dev_split

QIDS = [f'q{i}' for i in range(10)]


def test_dev_split_holds_out_the_rounded_fraction_and_keeps_every_question_once():
    train, dev = dev_split(QIDS, 0.25, seed=3)
    assert len(dev) == 2 and len(train) == 8  # round(2.5) is 2
    assert sorted(train + dev) == QIDS
    assert dev_split(QIDS, 0.25, seed=3) == (train, dev)  # the seed fixes it
    assert dev_split(QIDS, 0.25, seed=4) != (train, dev)


def test_no_dev_fraction_trains_on_every_question_in_the_drawn_order():
    everything, none = dev_split(QIDS, 0., seed=0)
    assert none == [] and sorted(everything) == QIDS and everything != QIDS
    train, dev = dev_split(QIDS, 0.5, seed=0)
    assert dev == everything[:5] and train == everything[5:]  # one permutation: the dev questions are its head


@pytest.mark.parametrize('fraction', [-0.1, 1., 1.5])
def test_a_fraction_outside_zero_to_one_is_rejected(fraction):
    with pytest.raises(ValueError, match=rf'dev_fraction must lie in \[0, 1\), got {fraction}'):
        dev_split(QIDS, fraction)
