"""experiments/bench_peers.py: queries/s at matched recall worked out by hand, and a tiny run of the index's own
engine through the worker process (the peers' venvs are not on a test machine) writes the report."""
import json
import sys
import time

import numpy as np
import pytest

pytest.importorskip('faiss')
pytest.importorskip('tabulate')


@pytest.fixture(scope='module')
def bench(experiment_script):
    return experiment_script('bench_peers')   # it imports bench_exact


def row(engine, build, search, seconds, recall, **extra):
    return {'workload': 'w', 'queries': 100, 'engine': engine, 'build': build, 'search': search,
            'rounds s': seconds, 'recall@10': recall, 'build s': 1.0, 'index bytes': 2 ** 20,
            'build peak RSS MiB': 1.0, 'search peak RSS MiB': 2.0, 'baseline RSS MiB': 0.5, **extra}


def test_matched_recall_takes_the_fastest_setting_that_reaches_it(bench):
    rows = [row('index', {'ann': True}, {'exact': False, 'candidates': 16}, [0.1, 0.2, 0.3], 0.96),   # 500 q/s
            row('index', {'ann': True}, {'exact': False, 'candidates': 64}, [0.25, 0.25, 0.25], 0.995),  # 400
            row('fast-plaid', {'nbits': 8}, {'n_ivf_probe': 8}, [1.0], 0.97),                          # 100
            row('fast-plaid', {'nbits': 8}, {'n_ivf_probe': 32}, [0.5], 0.94),                         # 200
            row('fast-plaid', {'nbits': 8}, {'n_ivf_probe': 64}, [2.0], 0.98)]                         # 50
    table, matched = bench.tables(rows)
    assert list(table['QPS']) == pytest.approx([500, 400, 100, 200, 50])
    ours, theirs = matched.iloc[0], matched.iloc[1]
    assert (ours['system'], theirs['system']) == ('index approx', 'fast-plaid (nbits=8)')
    assert (ours['QPS at 0.95'], ours['setting at 0.95']) == (pytest.approx(500), 'candidates=16')
    assert (ours['QPS at 0.99'], ours['setting at 0.99']) == (pytest.approx(400), 'candidates=64')
    assert (theirs['QPS at 0.95'], theirs['setting at 0.95']) == (pytest.approx(100), 'n_ivf_probe=8')
    assert theirs['setting at 0.99'] == 'not reached' and theirs['QPS at 0.99'] != theirs['QPS at 0.99']  # NaN
    assert theirs['index / peer at 0.95'] == pytest.approx(5.0)
    assert theirs['best recall@10'] == 0.98


def test_tiny_run_of_the_index_engine_writes_the_report(bench, tmp_path, monkeypatch):
    out = tmp_path / 'report'
    monkeypatch.setattr(bench, 'CANDIDATES', [4, 64])
    monkeypatch.setattr(sys, 'argv', ['bench_peers.py', '--workloads', 'clustered-1k', '--threads', '1',
                                      '--repeats', '2', '--work-dir', str(tmp_path / 'work'), '--out', str(out)])
    bench.main()
    report = json.loads(out.with_suffix('.json').read_text())
    settings = report['tables']['Every setting']
    found = report['rows'][1]
    calibrated = (f"calibrated ({found['calibrated candidates']} at effort {found['calibrated search effort']})"
                  if found['calibrated candidates'] else 'calibrated (exact)')
    # candidates=64 is not run where 4 was already slower than the calibrated default, which reached 0.99 (timing)
    assert [(r['system'], r['setting']) for r in settings][:3] == [
        ('index exact', ''), ('index approx', calibrated), ('index approx', 'candidates=4')]
    assert [(r['system'], r['setting']) for r in settings][3:] in ([], [('index approx', 'candidates=64')])
    assert settings[0]['recall@10'] == 1.0 and 0 < settings[2]['recall@10'] <= settings[-1]['recall@10'] <= 1
    assert all(len(r['rounds s']) == 2 for r in report['rows'])
    assert out.with_suffix('.png').exists()


class SweepEngine:
    """candidates=c finds the first c // 10 of each query's reference top 10 (no candidates: all 10) and takes c
    times ``seconds_per_candidate`` (no candidates: ``default_seconds``)."""
    def __init__(self, reference, default_seconds, seconds_per_candidate):
        self.reference, self.ran = reference, []
        self.default_seconds, self.seconds_per_candidate = default_seconds, seconds_per_candidate

    def search(self, queries, setting):
        self.ran.append(setting)
        candidates = setting.get('candidates')
        time.sleep(self.default_seconds if candidates is None else candidates * self.seconds_per_candidate)
        keep = 10 if candidates is None else candidates // 10
        return [self.reference[f'q{i}'][:keep] for i in range(len(queries))]


@pytest.fixture(scope='module')
def worker(experiment_script):
    return experiment_script('bench_peer_worker')


def sweep(worker, default_seconds, seconds_per_candidate, slowest=np.inf, default=True):
    """(settings run, their recall, whether cut by time, settings searched, settings given) of ``worker``'s warm_up
    over the calibrated default (unless not ``default``) and candidates=40 to 200 of :class:`SweepEngine`."""
    reference = {'q0': list(range(10)), 'q1': list(range(10, 20))}
    engine = SweepEngine(reference, default_seconds, seconds_per_candidate)
    settings = [{'exact': False}] * default + [{'exact': False, 'candidates': c} for c in (40, 90, 100, 200)]
    searches, recalls, cut = worker.warm_up(engine, np.zeros((2, 1, 4)), settings, reference, slowest)
    return searches, recalls, cut, engine.ran, settings


def test_a_sweep_stops_at_its_first_setting_that_reaches_recall_099(worker):
    searches, recalls, cut, ran, settings = sweep(worker, default_seconds=0.3, seconds_per_candidate=0.0001)
    # the calibrated default (its own sweep) reaches 0.99 and the candidate sweep still runs, to its first 1.0
    assert searches == ran == settings[:4] and recalls == [1.0, 0.4, 0.9, 1.0] and not cut


def test_a_sweep_stops_at_its_first_setting_slower_than_one_that_reached_recall_099(worker):
    searches, recalls, cut, ran, settings = sweep(worker, default_seconds=0.02, seconds_per_candidate=0.005)
    # candidates=40 (0.2 s) is slower than the calibrated default (0.02 s, recall 1.0): 90 and on are not run
    assert searches == ran == settings[:2] and recalls == [1.0, 0.4] and not cut


def test_a_sweep_is_cut_at_its_first_setting_slower_than_the_bound(worker):
    searches, recalls, cut, ran, settings = sweep(worker, 0., seconds_per_candidate=0.001, slowest=0.06, default=False)
    # candidates=40 takes 0.04 s, 90 takes 0.09 s > 0.06 without reaching 0.99: 100 and 200 are not run
    assert searches == ran == settings[:2] and recalls == [0.4, 0.9] and cut == {1}


def test_a_recall_reached_only_by_an_untimed_setting_reads_cut_by_time(bench):
    common = {'workload': 'w', 'queries': 10, 'build s': 1., 'index bytes': 2 ** 20, 'build peak RSS MiB': 1.,
              'search peak RSS MiB': 1., 'baseline RSS MiB': 1.}
    rows = [{**common, 'engine': 'index', 'build': {'ann': True}, 'search': {'exact': False}, 'rounds s': [.1] * 3,
             'recall@10': 1.0, 'cut by time': False},
            {**common, 'engine': 'fast-plaid', 'build': {'nbits': 4}, 'search': {'n_ivf_probe': 4},
             'rounds s': [.5] * 3, 'recall@10': 0.9, 'cut by time': True},
            {**common, 'engine': 'fast-plaid', 'build': {'nbits': 4}, 'search': {'n_ivf_probe': 8},
             'rounds s': None, 'recall@10': 0.96, 'cut by time': True}]
    table, matched = bench.tables(rows)
    assert np.isnan(table['QPS'].iloc[2]) and table['QPS'].iloc[1] == 20.
    peer = matched.set_index('system').loc['fast-plaid (nbits=4)']
    assert peer['setting at 0.95'] == 'not reached (cut by time)' and np.isnan(peer['QPS at 0.95'])
    assert matched.set_index('system').loc['index approx', 'QPS at 0.95'] == 100.


def test_the_bound_is_ten_times_the_index_fastest_round_reaching_099_and_at_least_a_minute(bench):
    rows = [{'engine': 'index', 'rounds s': [9., 8., 20.], 'recall@10': 1.0},     # median 9
            {'engine': 'index', 'rounds s': [1., 1., 1.], 'recall@10': 0.98},     # faster, below 0.99
            {'engine': 'index', 'rounds s': [10., 11., 12.], 'recall@10': 0.995},  # median 11
            {'engine': 'fast-plaid', 'rounds s': [.1, .1, .1], 'recall@10': 1.0}]  # a peer's rows do not count
    assert bench.slowest(rows) == 90.
    assert bench.slowest([{**rows[0], 'rounds s': [3., 3., 3.]}]) == 60.   # 30 s: the minute instead
    assert bench.slowest(rows[1:2]) is None
