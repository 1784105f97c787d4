"""experiments/bench_exact.py: its einsum reference ranks as the index does (so that its ratio compares equal work),
and a tiny run writes the report."""
import json

import numpy as np
import pytest

pytest.importorskip('tabulate')

from pyterrier_multiquery.index import MultiVectorIndex  # noqa: E402
from pyterrier_multiquery.index.calibration import CANDIDATE_COUNTS  # noqa: E402
from pyterrier_multiquery.experiment.clustered_collection import clustered_collection  # noqa: E402


@pytest.fixture(scope='module')
def bench(experiment_script):
    return experiment_script('bench_exact')   # it imports bench_peer_worker


def test_the_einsum_reference_finds_the_index_top_10(bench, tmp_path):
    docs, queries = clustered_collection(300, dim=16, min_vectors=1, max_vectors=9, topics=20, query_count=10,
                                         query_vectors=4, seed=2)
    index = MultiVectorIndex(tmp_path / 'index', verbose=False).index(docs)
    found = bench.EinsumReference(index, queries, block=64).search()
    expected = bench.IndexExact(index, queries, threads=1).search()
    assert [set(row) for row in found] == [set(row) for row in expected]
    assert bench.recall(found, expected) == 1.0


def test_a_tiny_run_writes_the_report(bench, tmp_path, monkeypatch):
    real = bench.clustered_collection
    monkeypatch.setattr(bench, 'clustered_collection', lambda docs, **kw: real(docs // 100, **{**kw, 'query_count': 5}))
    out = tmp_path / 'report'
    monkeypatch.setattr('sys.argv', ['bench_exact.py', '--workloads', 'ragged-20k', 'dim96-20k', '--repeats', '1',
                                     '--threads', '1', '--work-dir', str(tmp_path / 'work'), '--out', str(out)])
    monkeypatch.setattr(bench, 'matmul_peak', lambda threads: 100.0)
    bench.main()
    rows = json.loads(out.with_suffix('.json').read_text())['rows']
    assert [r['workload'] for r in rows] == ['ragged-20k', 'dim96-20k']
    assert [r['documents'] for r in rows] == [200, 200] and rows[1]['dims'] == 96
    assert all(r['recall@10 index vs einsum'] == 1.0 and r['index / einsum'] > 0 for r in rows)
    assert np.isclose(rows[0]['index % of fp32 peak'], rows[0]['index exact GFLOP/s'])  # a peak of 100 GFLOP/s
    for row in rows:   # nothing tuned: the calibrated count, or exact search where that is faster
        assert row['approx candidates'] == 'exact' or row['approx candidates'] in CANDIDATE_COUNTS
        assert row['recall@10 approx vs exact'] == 1.0 if row['approx candidates'] == 'exact' else \
            row['recall@10 approx vs exact'] >= 0.9
    assert out.with_suffix('.png').exists()


def test_every_timed_search_follows_an_untimed_one_of_its_own_system(bench):
    calls = []

    class System:
        def __init__(self, name):
            self.name = name

        def search(self):
            calls.append(self.name)
            return [self.name]

    tops, seconds = bench.timed_rounds({name: System(name) for name in 'abc'}, repeats=3)
    assert calls == list('aabbcc' 'bbccaa' 'ccaabb')   # untimed then timed, the order rotated a system a round
    assert tops == {'a': ['a'], 'b': ['b'], 'c': ['c']} and all(len(s) == 3 for s in seconds.values())
