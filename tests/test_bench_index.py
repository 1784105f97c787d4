"""experiments/bench_index.py: the headline's ratio over the fastest peer worked out by hand, and a tiny run of both
parts (the index's own engine alone: the peers' venvs are not on a test machine) writes the whole report."""
import json
import sys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip('faiss')
pytest.importorskip('tabulate')


@pytest.fixture(scope='module')
def bench(experiment_script):
    return experiment_script('bench_index')   # it imports its parts


def test_the_index_is_compared_with_the_fastest_peer_that_reaches_the_recall(bench):
    matched = pd.DataFrame([
        {'workload': 'a', 'system': 'index exact', 'QPS at 0.95': 10.0},
        {'workload': 'a', 'system': 'index approx', 'QPS at 0.95': 300.0},
        {'workload': 'a', 'system': 'fast-plaid (nbits=8)', 'QPS at 0.95': 60.0},
        {'workload': 'a', 'system': 'muvera', 'QPS at 0.95': 120.0},
        {'workload': 'a', 'system': 'fast-plaid (nbits=4)', 'QPS at 0.95': np.nan},
        {'workload': 'b', 'system': 'index approx', 'QPS at 0.95': 50.0},
        {'workload': 'b', 'system': 'fast-plaid (nbits=4)', 'QPS at 0.95': np.nan},
        {'workload': 'c', 'system': 'index approx', 'QPS at 0.95': 50.0},
        {'workload': 'd', 'system': 'index approx', 'QPS at 0.95': 50.0},
        {'workload': 'd', 'system': 'fast-plaid (nbits=8)', 'QPS at 0.95': np.nan,
         'setting at 0.95': 'not reached (cut by time)'}])
    matched['setting at 0.95'] = matched['setting at 0.95'].fillna('not reached')
    peers = bench.fastest_peers(matched, 0.95)
    assert peers['a'] == ('muvera: 120 q/s', 2.5)
    assert peers['b'][0] == 'none reaches it' and np.isnan(peers['b'][1])
    assert 'c' not in peers   # no peer ran there
    assert peers['d'][0] == 'none reaches it (a sweep cut by time: index over 10x)' and np.isnan(peers['d'][1])


def test_a_tiny_run_of_both_parts_writes_the_report(bench, tmp_path, monkeypatch):
    import bench_exact
    import bench_peers
    real = bench_exact.clustered_collection
    monkeypatch.setattr(bench_exact, 'clustered_collection',
                        lambda docs, **kw: real(docs // 100, **{**kw, 'query_count': 5}))
    monkeypatch.setattr(bench_exact, 'matmul_peak', lambda threads: 100.0)
    monkeypatch.setattr(bench_peers, 'CANDIDATES', [4, 64])
    out = tmp_path / 'report'
    monkeypatch.setattr(sys, 'argv', ['bench_index.py', '--workloads', 'clustered-20k', 'dim96-20k',
                                      '--peer-workloads', 'clustered-20k', '--repeats', '1', '--threads', '1',
                                      '--work-dir', str(tmp_path / 'work'), '--out', str(out)])
    bench.main()
    report = json.loads(out.with_suffix('.json').read_text())
    headline = report['tables']['Headline ratios']
    assert [r['workload'] for r in headline] == ['clustered-20k', 'dim96-20k']
    assert [r['documents'] for r in headline] == [200, 200]
    assert np.isclose(headline[0]['index % of fp32 peak'],
                      report['tables']['Part 1: exact and calibrated approximate search'][0]['index exact GFLOP/s'])
    assert all(r['fastest peer at 0.95'] == '' for r in headline)   # no peer engine was given a Python
    settings = report['tables']['Part 2: every setting']
    # 4 candidates a query vector hold fewer than the 10 documents asked for: those queries are searched exactly,
    # recall@10 reaches 0.99 and the sweep stops there
    assert [(r['system'], r['setting']) for r in settings][2:] == [('index approx', 'candidates=4')]
    approx = next(r for r in report['peer rows'] if r['build'].get('ann'))
    part1 = report['exact rows'][0]
    assert approx['ANN build s'] == part1['ANN build s'] and approx['calibration s'] == part1['calibration s']
    assert 'Incomplete run' not in report['description']
    assert out.with_name('report_exact.png').exists() and out.with_name('report_peers.png').exists()
