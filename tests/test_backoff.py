import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_multiquery.training.backoff import BackOff, Familiarity

# Known questions at 0°, ~36.9° and 90°: their nearest other known question lies at cosine 0.8, 0.8 and 0.6.
KNOWN = np.array([[1., 0.], [.8, .6], [0., 1.]])


def test_the_threshold_is_a_quantile_of_the_known_questions_nearest_other_similarity():
    assert Familiarity(KNOWN, quantile=0.).threshold == pytest.approx(.6)
    assert Familiarity(KNOWN, quantile=.5).threshold == pytest.approx(.8)
    assert Familiarity(KNOWN, quantile=.25).threshold == pytest.approx(.7)   # between 0.6 and 0.8, linearly
    assert Familiarity(3 * KNOWN, quantile=0.).threshold == pytest.approx(.6)   # lengths do not count


def test_a_question_is_familiar_where_its_nearest_known_question_reaches_the_threshold():
    familiarity = Familiarity(KNOWN, quantile=.5)   # threshold 0.8
    questions = np.array([[.6, .8], [-1., 0.], [0., -2.], [.8, .6]])
    # nearest known: [.6, .8]·[.8, .6] = 0.96; [-1, 0]·[0, 1] = 0; [0, -1]·[1, 0] = 0; [.8, .6] itself = 1
    np.testing.assert_allclose(familiarity.similarity(questions), [.96, 0., 0., 1.])
    assert familiarity(questions).tolist() == [True, False, False, True]


class Encoder:
    """Encodes a question as the vector its text names."""
    vectors = {'east': [1., 0.], 'north-east': [.8, .6], 'north': [0., 1.], 'west': [-1., 0.], 'south': [0., -1.]}

    def encode_queries(self, texts, batch_size=None):
        return np.array([self.vectors[t] for t in texts])


def results(label):
    """A retriever returning one document, ``label``, per question."""
    return pt.apply.generic(lambda topics: topics.assign(docno=label, score=1., rank=0))


def test_backoff_gives_familiar_questions_to_the_refiner_and_the_others_to_the_first_stage():
    backoff = BackOff(results('refined'), results('first'), Encoder(), ['east', 'north-east', 'north'], quantile=.5)
    topics = pd.DataFrame({'qid': ['1', '2', '3', '4'], 'query': ['north', 'west', 'north-east', 'south']})
    out = backoff(topics).set_index('qid')['docno'].sort_index()
    assert out.to_dict() == {'1': 'refined', '2': 'first', '3': 'refined', '4': 'first'}
    assert backoff(topics.iloc[:0]).empty


def test_backoff_on_its_own_training_questions_at_quantile_0_is_the_refiner():
    known = ['east', 'north-east', 'north']
    backoff = BackOff(results('refined'), results('first'), Encoder(), known, quantile=0.)
    out = backoff(pd.DataFrame({'qid': ['1', '2', '3'], 'query': known}))
    assert out['docno'].tolist() == ['refined'] * 3


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match='at least two known questions'):
        BackOff(results('refined'), results('first'), Encoder(), ['east'])
    with pytest.raises(ValueError, match='quantile must lie in'):
        Familiarity(KNOWN, quantile=1.5)
    with pytest.raises(ValueError, match='3 dimensions, the known questions 2'):
        Familiarity(KNOWN).similarity(np.ones((1, 3)))
    with pytest.raises(ValueError, match='finite and non-zero'):
        Familiarity(np.array([[1., 0.], [0., 0.]]))
    with pytest.raises(pt.validate.InputValidationError, match=r"\['query'\]"):
        BackOff(results('refined'), results('first'), Encoder(), ['east', 'north'])(pd.DataFrame({'qid': ['1']}))
