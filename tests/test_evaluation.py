"""The evaluation helper: the experiments' shared arguments, cross-validation, subsets, samples and the report."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_multiquery.experiment.evaluation import (FOLD_KINDS, answer_subsets, corpus_subset, cross_validate,
                                             document_sample, experiment_parser, ir_measures_qrels, judged_sample,
                                             line_figure, write_report)
from pyterrier_multiquery.experiment.parts import StoredParts
from pyterrier_multiquery.measures import MRecall


def test_experiment_parser_defaults_and_options(monkeypatch):
    monkeypatch.delenv('PYTERRIER_MULTIQUERY_DATA', raising=False)
    args = experiment_parser('doc', 'results/x').parse_args([])
    assert (args.data_root, args.out, args.seed) == (Path('../shared/data'), Path('results/x'), 0)
    assert args.cache_dir == Path.home() / '.cache' / 'pyterrier_multiquery'
    monkeypatch.setenv('PYTERRIER_MULTIQUERY_DATA', '/data/here')
    assert experiment_parser('doc', 'x').parse_args([]).data_root == Path('/data/here')
    bare = vars(experiment_parser('doc', None, data=False, cache=False).parse_args(['--seed', '3']))
    assert bare == {'seed': 3}


def _qrels():
    # q1: answers 1 (a) and 2 (b); q2: answer 1 (c, d); q3: answers 1 (e) and 2 (f); q4: one answer
    return pd.DataFrame({'qid': ['q1', 'q1', 'q2', 'q2', 'q3', 'q3', 'q4'],
                         'docno': ['a', 'b', 'c', 'd', 'e', 'f', 'g'], 'label': 1,
                         'iteration': ['1', '2', '1', '1', '1', '2', '1']})


def test_answer_subsets():
    vectors = {'a': [1., 0.], 'b': [0., 1.], 'c': [1., 0.], 'd': [1., .1], 'e': [1., 0.], 'f': [1., 1.], 'g': [1., 0.]}
    subsets = answer_subsets(_qrels(), {d: np.array(v) for d, v in vectors.items()})
    assert sorted(subsets['>1 answer']) == ['q1', 'q3']
    # target distances: q1 1.0 (orthogonal), q3 0.29, q2 0.005; q4 has one target (no distance): the third is q1
    assert list(subsets['low-similarity third']) == ['q1']


class _Unseen(pt.Transformer):
    """Retrieves ``d`` for a question it was not built with, ``x`` for one it was."""

    def __init__(self, train_qids):
        self.train_qids = set(train_qids)

    def transform(self, topics):
        return topics.assign(docno=['x' if q in self.train_qids else 'd' for q in topics['qid']], score=1., rank=0)


def _folds_data():
    qrels = pd.DataFrame({'qid': [f'q{i}' for i in range(10)], 'docno': 'd', 'label': 1, 'iteration': '1'})
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(10)] + ['unjudged'], 'query': 'text'})
    return topics, qrels


def test_rare_answer_counts_join_the_nearest_stratum():
    from pyterrier_multiquery.experiment.evaluation import _answer_strata, split_by_question
    counts = pd.Series([1] + [2] * 20 + [3] * 20 + [6, 4])   # too rare: 1 joins 2, and 4 and 6 join 3
    assert _answer_strata(counts, 2).tolist() == [2] + [2] * 20 + [3] * 20 + [3, 3]
    assert _answer_strata(pd.Series([1, 3, 2, 2, 4, 4]), 2).tolist() == [2, 4, 2, 2, 4, 4]   # 3: a tie, the larger
    assert _answer_strata(pd.Series([1, 2, 3]), 2).tolist() == [0, 0, 0]   # no count has 2 questions: one stratum
    rows = [{'qid': f'q{i}', 'docno': f'd{i}-{a}', 'label': 1, 'iteration': str(a)}
            for i, answers in enumerate([1] + [2] * 20 + [3] * 20) for a in range(1, answers + 1)]
    train, test = split_by_question(pd.DataFrame(rows))   # a lone one-answer question once failed in sklearn
    assert sorted(train + test) == sorted({row['qid'] for row in rows}) and not set(train) & set(test)


def test_cross_validate_pools_the_test_folds_and_trains_on_the_rest():
    topics, qrels = _folds_data()
    calls = []

    def fold_systems(fold, train_topics, train_qrels):
        calls.append(fold)
        assert list(train_topics['qid']) == list(train_qrels['qid'])
        return {'unseen': _Unseen(train_topics['qid']), 'other': _Unseen(topics['qid'])}, {'train': len(train_topics)}

    scores, records, seconds = cross_validate(topics, qrels, fold_systems, [MRecall@1], folds=5, seed=0,
                                              verbose=False)
    assert calls == [0, 1, 2, 3, 4] and set(seconds) == {'unseen', 'other'} and records == [{'train': 8}] * 5
    assert list(scores['qid'][:10]) == list(qrels['qid'])   # each judged question once, in the qrels' order
    assert list(scores['system']) == ['unseen'] * 10 + ['other'] * 10
    assert list(scores['value']) == [1.] * 10 + [0.] * 10   # never tested on a question it trained on
    assert scores.groupby('fold')['qid'].nunique().tolist() == [2] * 5   # each fold tests 2 of the 10


def test_cross_validate_goes_on_at_the_first_fold_not_stored(tmp_path):
    topics, qrels = _folds_data()
    calls = []

    def fold_systems(fold, train_topics, train_qrels):
        calls.append(fold)
        if fold == 2 and calls.count(2) == 1:
            raise KeyboardInterrupt   # the run is stopped in its third fold
        return {'unseen': _Unseen(train_topics['qid'])}, {'fold': fold}

    settings = {'seed': 0, 'folds': 5}

    def run():
        parts = StoredParts(tmp_path / 'report', FOLD_KINDS, settings)
        return cross_validate(topics, qrels, fold_systems, [MRecall@1], parts=parts, key={'dataset': 'tiny'},
                              verbose=False)

    with pytest.raises(KeyboardInterrupt):
        run()
    assert len(pd.read_csv(tmp_path / 'report_folds.csv')) == 2
    scores, records, _ = run()
    assert calls == [0, 1, 2, 2, 3, 4] and records == [{'fold': fold} for fold in range(5)]
    assert list(scores['qid']) == list(qrels['qid']) and list(scores['value']) == [1.] * 10
    assert 'dataset' not in scores
    again = run()   # every fold stored: nothing runs
    pd.testing.assert_frame_equal(again.scores, scores)
    assert calls == [0, 1, 2, 2, 3, 4]


def test_samples_and_subsets():
    topics = pd.DataFrame({'qid': list('abcdef'), 'query': 'text'})
    qrels = pd.DataFrame({'qid': list('abcd'), 'docno': ['1', '2', '3', '3'], 'label': 1})
    sample, sample_qrels = judged_sample(topics, qrels, 3, seed=1)
    assert list(sample['qid']) == list(topics[topics['qid'].isin(list('abcd'))].sample(3, random_state=1)['qid'])
    assert set(sample_qrels['qid']) == set(sample['qid'])
    documents = pd.DataFrame({'docno': [str(i) for i in range(9, -1, -1)], 'text': 'x'})
    subset = corpus_subset(documents, qrels, 5, seed=0)
    assert {'1', '2', '3'} <= set(subset['docno']) and len(subset) == 5
    assert list(subset['docno']) == sorted(subset['docno'])
    assert len(corpus_subset(documents, qrels, 2)) == 3   # every judged document, whatever the size
    sample = document_sample(documents, 4, seed=0)
    assert list(sample['docno']) == sorted(documents.sample(4, random_state=0)['docno'])


def test_ir_measures_qrels():
    qrels = _qrels().assign(label=[1, 2, 0, 1, 3, 1, 1])   # graded labels, kept as they are
    expected = pd.DataFrame({'query_id': ['q1', 'q1', 'q2', 'q2', 'q3', 'q3', 'q4'],
                             'doc_id': ['a', 'b', 'c', 'd', 'e', 'f', 'g'], 'relevance': [1, 2, 0, 1, 3, 1, 1],
                             'iteration': ['1', '2', '1', '1', '1', '2', '1']})
    pd.testing.assert_frame_equal(ir_measures_qrels(qrels), expected)


def test_write_report(tmp_path):
    table = pd.DataFrame({'system': ['a', 'b'], 'value': [0.123456, 1 / 3], 'seed': [0, 12]})
    figure = line_figure(pd.DataFrame({'x': [0, 1, 0, 1], 'y': [1., 2., 3., 4.], 'line': list('aabb')}), 'x', 'y',
                         line='line')
    write_report(tmp_path / 'out' / 'report', 'Title', 'What ran.', {'Main': table, 'Other': table.head(1),
                                                                     'Numbers': table[['seed', 'value']]},
                 extra={'settings': {'seed': np.int64(3)}}, figure=figure, csv=True, floatfmt='.2f')
    md = (tmp_path / 'out' / 'report.md').read_text()
    assert md.startswith('# Title\n\nWhat ran.\n\n## Main\n\n') and '## Other' in md
    assert '0.12' in md and '0.123' not in md
    assert '|     12 |    0.33 |' in md and '12.00' not in md   # an integer column stays whole, beside floats too
    content = json.loads((tmp_path / 'out' / 'report.json').read_text())
    assert content['tables']['Main'][1] == {'system': 'b', 'value': 1 / 3, 'seed': 12}
    assert content['settings'] == {'seed': 3}
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / 'out' / 'report.csv'), table)
    assert (tmp_path / 'out' / 'report.png').stat().st_size > 0


def test_line_figure_panels_and_lines():
    frame = pd.DataFrame({'x': [0, 1] * 4, 'y': range(8), 'line': list('aabbaabb'), 'panel': ['p'] * 4 + ['q'] * 4})
    fig = line_figure(frame, 'x', 'y', line='line', panel='panel')
    assert [ax.get_title() for ax in fig.axes] == ['p', 'q']
    assert [len(ax.lines) for ax in fig.axes] == [2, 2]
    assert list(fig.axes[1].lines[1].get_ydata()) == [6, 7]


def test_line_figure_colours_lines_by_the_first_column_and_names_each_value_once():
    frame = pd.DataFrame({'x': [0, 1] * 6, 'y': range(12), 'system': list('aaaabbbbcccc'), 'fold': [0, 0, 1, 1] * 3})
    ax = line_figure(frame, 'x', 'y', line=['system', 'fold']).axes[0]
    colours = [line.get_color() for line in ax.lines]
    assert len(colours) == 6 and colours[0] == colours[1] and len(set(colours)) == 3
    legend = ax.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == ['a', 'b', 'c']
    assert legend.get_title().get_text() == 'one line per fold'


def test_line_figure_ticks_whole_values_of_an_integer_x():
    frame = pd.DataFrame({'M': [3, 5, 3, 5], 'value': [1., 2., 3., 4.], 'prompt': list('aabb')})
    ticks = line_figure(frame, 'M', 'value', line='prompt').axes[0].get_xticks()
    assert len(ticks) and all(t == int(t) for t in ticks)
    fractional = line_figure(frame.astype({'M': float}), 'M', 'value', line='prompt').axes[0].get_xticks()
    assert any(t != int(t) for t in fractional)  # a float x keeps matplotlib's own ticks


@pytest.mark.parametrize('missing', ['qid', 'label'])
def test_cross_validate_checks_qrels(missing):
    qrels = pd.DataFrame({'qid': ['a'], 'docno': ['d'], 'label': [1]}).drop(columns=[missing])
    with pytest.raises(ValueError, match=f"qrels is missing column\\(s\\) \\['{missing}'\\]"):
        cross_validate(pd.DataFrame({'qid': ['a'], 'query': ['q']}), qrels, lambda *_: ({}, {}), [MRecall@1],
                       verbose=False)
