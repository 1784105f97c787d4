"""experiments/seed_spread.py: several seeds' reports of one experiment combined, on hand-made reports."""
import json

import pandas as pd
import pytest

pytest.importorskip('tabulate')


@pytest.fixture
def seed_spread(experiment_script):
    return experiment_script('seed_spread')


def report(seed, amer, p, interval, held='yes'):
    return {'title': 'AMER on RAMDocs', 'seed': seed, 'tables': {
        'Means': [{'system': 'MiniLM', 'dataset': 'ramdocs', 'MRecall@10 (all)': 0.8, 'MRecall@100 (all)': 0.9},
                  {'system': 'AMER', 'dataset': 'ramdocs', 'MRecall@10 (all)': amer, 'MRecall@100 (all)': 0.95}],
        'Against MiniLM': [{'system': 'AMER', 'MRecall@10 p': p, '95% CI': interval, 'floor held': held}],
        f'Only in seed {seed}': [{'system': 'AMER', 'x': 1.0}]}}


def test_means_spreads_and_each_seeds_value_worked_out_by_hand(seed_spread, tmp_path):
    paths = []
    for seed, amer, p, interval, held in ((0, 0.90, 0.01, '[+0.01, +0.03]', 'yes'),
                                          (1, 0.86, 0.20, '[-0.01, +0.02]', 'no'),
                                          (2, 0.88, 0.05, '[+0.00, +0.03]', 'yes')):
        paths.append(tmp_path / f'seed{seed}.json')
        paths[-1].write_text(json.dumps(report(seed, amer, p, interval, held)))
    seed_spread.main([str(p) for p in paths] + ['--out', str(tmp_path / 'spread')])
    out = json.loads((tmp_path / 'spread.json').read_text())
    assert out['title'] == 'AMER on RAMDocs, over seeds 0, 1, 2' and out['seeds'] == ['0', '1', '2']
    assert list(out['tables']) == ['Means', 'Against MiniLM']  # the table of one seed alone is left out
    amer = pd.DataFrame(out['tables']['Means']).set_index('system').loc['AMER']
    assert amer['dataset'] == 'ramdocs'
    assert amer['MRecall@10 (all) mean'] == pytest.approx(0.88)
    assert amer['MRecall@10 (all) sd'] == pytest.approx(0.02)  # deviations 0.02, -0.02, 0: sqrt(0.0008 / 2)
    assert [amer[f'MRecall@10 (all) seed {s}'] for s in '012'] == [0.90, 0.86, 0.88]
    assert 'MRecall@100 (all) seed 0' not in amer.index and amer['MRecall@100 (all) sd'] == pytest.approx(0, abs=1e-12)
    tests = out['tables']['Against MiniLM'][0]
    assert '95% CI' not in tests  # differs by seed: left out
    assert [tests[f'floor held seed {s}'] for s in '012'] == ['yes', 'no', 'yes']  # a verdict: kept per seed
    assert tests['MRecall@10 p mean'] == pytest.approx(0.26 / 3)
    assert (tmp_path / 'spread.md').read_text().startswith('# AMER on RAMDocs, over seeds 0, 1, 2')


def test_whole_numbers_equal_in_every_seed_name_the_rows(seed_spread):
    frames = [pd.DataFrame({'system': ['AMER', 'AMER'], 'fold': [0, 1], 'questions': [100, 99 + seed],
                            'weight': [0.25 * seed, 0.5]}) for seed in (0, 1, 2)]
    out = seed_spread.spread(frames, ['0', '1', '2'], 'weight')
    assert list(out.columns[:2]) == ['system', 'fold'] and list(out['fold']) == [0, 1]
    assert list(out['questions mean']) == [100, 100]  # differs by seed: a figure, not a name
    assert list(out['weight mean']) == [0.25, 0.5] and list(out['weight seed 2']) == [0.5, 0.5]


def test_tables_of_other_rows_are_refused(seed_spread):
    ours = pd.DataFrame({'system': ['MiniLM', 'AMER'], 'MRecall@10': [0.8, 0.9]})
    with pytest.raises(ValueError, match=r'\[2, 1\] rows'):
        seed_spread.spread([ours, ours.iloc[:1]], ['0', '1'], 'MRecall@10')
    other = ours.assign(system=['MiniLM', 'JPR'])
    with pytest.raises(ValueError, match='no column names the rows alike'):
        seed_spread.spread([ours, other], ['0', '1'], 'MRecall@10')


def test_one_report_or_one_seed_twice_is_refused(seed_spread, tmp_path, capsys):
    path = tmp_path / 'seed0.json'
    path.write_text(json.dumps(report(0, 0.9, 0.01, '')))
    with pytest.raises(SystemExit):
        seed_spread.main([str(path), '--out', str(tmp_path / 'spread')])
    assert 'two seeds or more' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        seed_spread.main([str(path), str(path), '--out', str(tmp_path / 'spread')])
    assert 'seeds 0, 0: one report a seed' in capsys.readouterr().err
