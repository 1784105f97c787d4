"""experiments/bench_commits.py: the report's ratios and p-values worked out by hand, a worker's searches on a tiny
collection, and a checkout whose package is not the one imported refused."""
import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('faiss')
pytest.importorskip('scipy')

ROOT = Path(__file__).resolve().parents[1]
#: The checkout whose package this process imports (an editable install may point to another one).
PACKAGE_ROOT = Path(importlib.util.find_spec('pyterrier_multiquery').origin).resolve().parents[1]


@pytest.fixture(scope='module')
def bench(experiment_script):
    return experiment_script('bench_commits')   # it imports bench_exact


def result(exact_s, approximate_s, digest='a', recall=1.):
    return {'seconds': {'exact': exact_s, 'approximate': approximate_s}, 'exact digest': digest,
            'approximate recall@10': recall}


def test_the_report_gives_each_rounds_ratio_its_median_and_a_signed_rank_p(bench):
    args = argparse.Namespace(checkouts=[Path('/x/old'), Path('/x/new')], rounds=5, repeats=3, threads=2)
    # exact: new takes 0.5 to 0.9 of old's 1 s, and one round's rankings differ between the checkouts; approximate:
    # the same times
    rounds = [{'old': result(1., 2., recall=0.98), 'new': result(t, 2., digest='b' if t == 0.9 else 'a', recall=0.97)}
              for t in (0.5, 0.6, 0.7, 0.8, 0.9)]
    rows = [line for line in bench.report(args, {'w': rounds}).splitlines() if line.startswith('| w |')]
    # the logs of 0.5 to 0.9: mean -0.3778, standard deviation 0.2322, so exp(-0.3778 +/- 2.776 * 0.2322 / sqrt(5));
    # five pairs all one way: the two-sided exact Wilcoxon p is 2 / 2**5; five equal pairs: p 1
    assert rows[0] == '| w | exact | 1.0000 | 0.7000 | 0.700 | 0.500-0.900 | 0.685 (0.514-0.914) | 0.0625 | NO |  |'
    assert rows[1] == ('| w | approximate | 2.0000 | 2.0000 | 1.000 | 1.000-1.000 | 1.000 (1.000-1.000) | 1 |  | '
                       '0.9800, 0.9700 |')


def tiny_arrays(folder: Path) -> Path:
    """30 documents of 1 to 3 Gaussian vectors of 8 dims, 4 queries of 2."""
    rng = np.random.default_rng(0)
    lengths = 1 + np.arange(30) % 3
    folder.mkdir()
    np.save(folder / 'lengths.npy', lengths)
    np.save(folder / 'vectors.npy', rng.normal(size=(lengths.sum(), 8)).astype(np.float32))
    np.save(folder / 'queries.npy', rng.normal(size=(4, 2, 8)).astype(np.float32))
    return folder


def test_a_worker_builds_once_and_times_both_searches(bench, tmp_path):
    folder, index = tiny_arrays(tmp_path / 'arrays'), tmp_path / 'index'
    first = bench.worker(PACKAGE_ROOT, folder, index, threads=1, repeats=2)
    assert set(first['seconds']) == {'exact', 'approximate'} and all(s > 0 for s in first['seconds'].values())
    assert first['approximate recall@10'] == 1.   # 256 candidates a query vector: every document of 30
    built = (index / 'pt_meta.json').stat().st_mtime_ns
    again = bench.worker(PACKAGE_ROOT, folder, index, threads=1, repeats=1)
    assert again['exact digest'] == first['exact digest'] and (index / 'pt_meta.json').stat().st_mtime_ns == built
    json.dumps(first)   # what the process prints


def test_a_checkout_whose_package_was_not_imported_is_refused(bench, tmp_path):
    with pytest.raises(RuntimeError, match=f"not from the checkout '{tmp_path}'"):
        bench.worker(tmp_path, tmp_path, tmp_path / 'index', threads=1, repeats=1)
