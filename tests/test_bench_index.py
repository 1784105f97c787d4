"""experiments/bench_index.py: its reference implementations rank as the index does (so that its ratios compare
equal work), and a tiny run writes the report."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip('faiss')
pytest.importorskip('tabulate')

from pyterrier_multiquery.index import MultiVectorIndex  # noqa: E402
from pyterrier_multiquery.experiment.clustered_collection import clustered_collection  # noqa: E402

SCRIPT = Path(__file__).parents[1] / 'experiments' / 'bench_index.py'


@pytest.fixture(scope='module')
def bench():
    spec = importlib.util.spec_from_file_location('bench_index', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
def test_references_find_the_index_top_10(bench, tmp_path, dtype):
    docs, queries = clustered_collection(400, dim=16, min_vectors=2, max_vectors=6, topics=20, query_count=12,
                                         query_vectors=4, seed=1)
    index = MultiVectorIndex(tmp_path / 'i.mvi', verbose=False).indexer(dtype=dtype).index(docs)
    exact = bench.IndexSystem(index, queries, 1)
    reference = bench.ReferenceExact(index, queries, 1)
    reference.blocks = bench.document_blocks(reference.offsets, 50)  # many blocks: the running top 10 is merged
    exact_top = exact.top(exact.search())
    assert [set(row) for row in reference.top(reference.search())] == [set(row) for row in exact_top]
    assert bench.recall(exact_top, exact_top) == 1.0
    for stage in ('flat', 'ivf+SQ8'):
        approximate = bench.IndexSystem(index, queries, 1, stage, 8)
        reference = bench.ReferenceApproximate(index, queries, 1, stage, 8)
        found = approximate.top(approximate.search())
        assert [set(row) for row in reference.top(reference.search())] == [set(row) for row in found]
        assert 0 < bench.recall(found, exact_top) <= 1


def test_tiny_run_writes_the_report(bench, tmp_path, monkeypatch, capsys):
    out = tmp_path / 'report'
    monkeypatch.setattr(sys, 'argv', [str(SCRIPT), '--docs', '300', '--dim', '16', '--queries', '6', '--repeats', '3',
                                      '--stages', 'flat', '--candidates', '4', '64', '--no-memory', '--out', str(out)])
    bench.main()
    report = json.loads(out.with_suffix('.json').read_text())
    rows = report['tables']['300 documents']
    assert [r['system'] for r in rows] == ['index exact', 'reference exact'] + ['index approx flat',
                                                                              'reference approx flat'] * 2
    assert all(len(r['rounds s']) == 3 for r in report['rows']['300'])
    assert rows[0]['recall@10'] == rows[1]['recall@10'] == 1.0
    assert rows[2]['recall@10'] == rows[3]['recall@10'] and rows[4]['recall@10'] == rows[5]['recall@10']
    assert rows[3]['x reference'] == rows[5]['x reference'] == 1.0
    assert 'Verdicts' in report['tables']
    assert '300 docs: operating point index approx flat c=64' in report['description']
