import ir_measures
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyterrier_multiquery.measures import AnswerRecall, MRecall


def qrels_frame(rows):
    """rows: (qid, docno, relevance, answer)."""
    return pd.DataFrame(rows, columns=['query_id', 'doc_id', 'relevance', 'iteration'])


def run_frame(rows):
    """rows: (qid, docno, score)."""
    return pd.DataFrame(rows, columns=['query_id', 'doc_id', 'score'])


def per_query(measure, qrels, run):
    return {m.query_id: m.value for m in ir_measures.iter_calc([measure], qrels, run)}


# q has 3 answers: 1 (docs a, b), 2 (doc c), 3 (doc d)
THREE_ANSWERS = qrels_frame([('q', 'a', 1, '1'), ('q', 'b', 1, '1'), ('q', 'c', 1, '2'), ('q', 'd', 1, '3')])


def test_m_less_than_k_needs_every_answer():
    run = run_frame([('q', 'a', 5), ('q', 'b', 4), ('q', 'c', 3), ('q', 'x', 2), ('q', 'd', 1)])
    # top 4 = a, b, c, x: answers 1 and 2 of 3
    assert per_query(MRecall@4, THREE_ANSWERS, run) == {'q': 0.}
    assert per_query(AnswerRecall@4, THREE_ANSWERS, run) == {'q': pytest.approx(2 / 3)}
    # top 5 adds d: all 3 answers
    assert per_query(MRecall@5, THREE_ANSWERS, run) == {'q': 1.}
    assert per_query(AnswerRecall@5, THREE_ANSWERS, run) == {'q': 1.}


def test_m_equal_to_k():
    run = run_frame([('q', 'a', 3), ('q', 'c', 2), ('q', 'd', 1)])
    assert per_query(MRecall@3, THREE_ANSWERS, run) == {'q': 1.}
    run = run_frame([('q', 'a', 3), ('q', 'b', 2), ('q', 'd', 1)])
    assert per_query(MRecall@3, THREE_ANSWERS, run) == {'q': 0.}


def test_m_greater_than_k_needs_k_distinct_answers():
    run = run_frame([('q', 'c', 3), ('q', 'd', 2), ('q', 'a', 1)])
    assert per_query(MRecall@2, THREE_ANSWERS, run) == {'q': 1.}  # 2 distinct answers in the top 2
    assert per_query(AnswerRecall@2, THREE_ANSWERS, run) == {'q': pytest.approx(2 / 3)}
    run = run_frame([('q', 'a', 3), ('q', 'b', 2), ('q', 'c', 1)])
    assert per_query(MRecall@2, THREE_ANSWERS, run) == {'q': 0.}  # a and b support the same answer


def test_a_passage_supporting_two_answers_covers_both():
    qrels = qrels_frame([('q', 'a', 1, '1'), ('q', 'a', 1, '2'), ('q', 'b', 1, '3')])
    run = run_frame([('q', 'a', 2), ('q', 'x', 1)])
    assert per_query(MRecall@2, qrels, run) == {'q': 1.}
    assert per_query(AnswerRecall@1, qrels, run) == {'q': pytest.approx(2 / 3)}


def test_duplicate_docno_in_run_takes_one_place():
    run = run_frame([('q', 'a', 5), ('q', 'a', 4), ('q', 'c', 3), ('q', 'd', 2)])
    # de-duplicated ranking is a, c, d: all three answers in the top 3
    assert per_query(MRecall@3, THREE_ANSWERS, run) == {'q': 1.}


def test_ties_are_broken_by_docno_descending_as_trec_eval():
    qrels = qrels_frame([('q', 'a', 1, '1'), ('q', 'z', 1, '2')])
    run = run_frame([('q', 'a', 1.), ('q', 'm', 1.), ('q', 'z', 1.)])
    # all tied: order is z, m, a
    assert per_query(AnswerRecall@1, qrels, run) == {'q': 0.5}
    assert per_query(MRecall@2, qrels, run) == {'q': 0.}
    assert per_query(MRecall@3, qrels, run) == {'q': 1.}
    # the same convention as pytrec_eval's measures on the same run
    plain = qrels[['query_id', 'doc_id', 'relevance']]
    assert per_query(AnswerRecall@1, plain, run) == per_query(ir_measures.R@1, plain, run)


def test_without_answer_ids_each_relevant_document_is_an_answer():
    plain = qrels_frame([('q', 'a', 1, '0'), ('q', 'b', 1, '0'), ('q', 'c', 0, '0')])
    run = run_frame([('q', 'a', 3), ('q', 'c', 2), ('q', 'b', 1)])
    assert per_query(MRecall@2, plain, run) == {'q': 0.}
    assert per_query(MRecall@3, plain, run) == {'q': 1.}
    no_iteration = plain.drop(columns='iteration')
    assert per_query(AnswerRecall@2, no_iteration, run) == {'q': 0.5}
    assert per_query(AnswerRecall@2, no_iteration, run) == per_query(ir_measures.R@2, no_iteration, run)


def test_query_without_relevant_passage_counts_zero_and_unjudged_query_is_not_evaluated():
    qrels = qrels_frame([('q', 'a', 1, '1'), ('empty', 'a', 0, '1')])
    run = run_frame([('q', 'a', 1), ('empty', 'a', 1), ('unjudged', 'a', 1)])
    assert per_query(MRecall@5, qrels, run) == {'q': 1., 'empty': 0.}
    assert per_query(AnswerRecall@5, qrels, run) == {'q': 1., 'empty': 0.}
    assert ir_measures.calc_aggregate([MRecall@5], qrels, run)[MRecall@5] == 0.5


def test_query_missing_from_run_counts_zero():
    assert per_query(MRecall@5, THREE_ANSWERS, run_frame([('other', 'a', 1)])) == {'q': 0.}


def test_rel_threshold():
    qrels = qrels_frame([('q', 'a', 2, '1'), ('q', 'b', 1, '2')])
    run = run_frame([('q', 'a', 1)])
    assert per_query(MRecall(rel=2)@5, qrels, run) == {'q': 1.}
    assert per_query(MRecall@5, qrels, run) == {'q': 0.}


def test_parsed_by_name_and_usable_in_pt_experiment():
    import pyterrier as pt
    assert ir_measures.parse_measure('MRecall@10') == MRecall@10
    assert str(AnswerRecall@10) == 'AnswerRecall@10'
    topics = pd.DataFrame({'qid': ['q'], 'query': ['x']})
    run = pd.DataFrame({'qid': 'q', 'query': 'x', 'docno': ['c', 'd', 'a'], 'score': [3., 2., 1.]})
    qrels = THREE_ANSWERS.rename(columns={'query_id': 'qid', 'doc_id': 'docno', 'relevance': 'label'})
    table = pt.Experiment([pt.Transformer.from_df(run)], topics, qrels, names=['sys'],
                          eval_metrics=[MRecall@2, MRecall@3, AnswerRecall@2, ir_measures.alpha_nDCG@10])
    assert table['MRecall@2'].iloc[0] == 1.
    assert table['MRecall@3'].iloc[0] == 1.
    assert table['AnswerRecall@2'].iloc[0] == pytest.approx(2 / 3)
    assert 0 < table['alpha_nDCG@10'].iloc[0] <= 1


def test_qrels_missing_a_column_is_named():
    run = run_frame([('q', 'a', 1)])
    with pytest.raises(ValueError, match='relevance'):
        ir_measures.calc_aggregate([MRecall@5], THREE_ANSWERS.drop(columns='relevance'), run)


def reference_coverage(qrels_rows, run_rows, k):
    """Plain re-statement of the definitions: (covered, total) per qid of the qrels."""
    answers, supports = {}, {}
    for qid, doc, rel, answer in qrels_rows:
        answers.setdefault(qid, set())
        if rel >= 1:
            label = f'doc:{doc}' if answer == '0' else answer
            answers[qid].add(label)
            supports.setdefault((qid, doc), set()).add(label)
    out = {}
    for qid in answers:
        best = {}
        for q, doc, score in run_rows:
            if q == qid:
                best[doc] = max(best.get(doc, float('-inf')), score)
        ranked = sorted(best, key=lambda d: (-best[d], [-ord(c) for c in d]))
        covered = set()
        for doc in ranked[:k]:
            covered |= supports.get((qid, doc), set())
        out[qid] = (len(covered), len(answers[qid]))
    return out


qids = st.sampled_from(['q1', 'q2', 'q3'])
docs = st.sampled_from([f'd{i}' for i in range(8)])
qrels_rows = st.lists(st.tuples(qids, docs, st.integers(0, 2), st.sampled_from(['0', '1', '2', '3', '4'])),
                      min_size=1, max_size=25)
run_rows = st.lists(st.tuples(qids, docs, st.integers(0, 5).map(float)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(qrels_rows, run_rows, st.integers(1, 10))
def test_matches_reference_implementation(q_rows, r_rows, k):
    expected = reference_coverage(q_rows, r_rows, k)
    qrels, run = qrels_frame(q_rows), run_frame(r_rows)
    mrecall = per_query(MRecall@k, qrels, run)
    arecall = per_query(AnswerRecall@k, qrels, run)
    assert set(mrecall) == set(expected)
    for qid, (covered, total) in expected.items():
        assert mrecall[qid] == (1. if total and covered >= min(total, k) else 0.)
        assert arecall[qid] == pytest.approx(covered / total if total else 0.)


@pytest.mark.parametrize('k', [0, -1, 2.5, True])
def test_cutoff_below_one_is_rejected(k):
    with pytest.raises(ValueError, match=f'MRecall@k needs a whole number k >= 1.*got {k!r}'):
        MRecall@k
    with pytest.raises(ValueError, match='AnswerRecall@k needs a whole number k >= 1'):
        AnswerRecall@k
    with pytest.raises(ValueError, match='MRecall@k needs a whole number k >= 1'):
        ir_measures.parse_measure('MRecall@0')


def test_ndeval_single_subtopic_warning_only_where_it_applies(capfd):
    run = run_frame([('1', 'a', 2.), ('1', 'b', 1.), ('2', 'c', 1.)])
    one_answer_each = qrels_frame([('1', 'a', 1, '1'), ('1', 'b', 1, '1'), ('2', 'c', 1, '1')])
    one_passage_each = qrels_frame([('1', 'a', 1, '0'), ('2', 'c', 1, '0')]).drop(columns='iteration')
    forgotten = one_answer_each.drop(columns='iteration')  # diversity qrels without their subtopics
    for qrels, warned in ((one_answer_each, False), (one_passage_each, False), (forgotten, True)):
        values = per_query(ir_measures.alpha_nDCG@10, qrels, run)
        assert set(values) == {'1', '2'}
        err = capfd.readouterr().err
        assert ('All queries have only 1 subtopic!' in err) == warned, err
