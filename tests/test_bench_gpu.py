"""experiments/bench_gpu.py, the script a lent GPU runs, dry-run on the CPU (the index screening by length groups
there, as on a GPU): its reference ranks as the index does, and a tiny run writes the report."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('tabulate')

EXPERIMENTS = Path(__file__).parents[1] / 'experiments'


@pytest.fixture
def bench(monkeypatch, experiment_script):
    module = experiment_script('bench_gpu')
    monkeypatch.setattr(module, 'DEVICE', 'cpu')
    monkeypatch.setattr(module, 'bf16_peak', lambda: 1.0)
    return module


def test_the_reference_takes_each_ragged_documents_maximum(bench):
    rng = np.random.default_rng(0)
    lengths = np.array([1, 3, 2, 5])
    vectors = rng.normal(size=(lengths.sum(), 4)).astype(np.float32)
    queries = [rng.normal(size=(2, 4)).astype(np.float32) for _ in range(3)]
    scores, ids = bench.Reference(vectors, lengths, queries, block=4).search()  # blocks split between documents
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for query, top, found in zip(queries, ids, scores):
        expected = np.array([(query @ vectors[a:b].T).max(axis=1).mean() for a, b in zip(offsets[:-1], offsets[1:])])
        np.testing.assert_array_equal(top, np.argsort(-expected, kind='stable'))
        np.testing.assert_allclose(found, np.sort(expected)[::-1], rtol=1e-6)


def test_a_tiny_dry_run_writes_the_report(bench, tmp_path, monkeypatch):
    from pyterrier_multiquery.index import calibration, shardwise
    monkeypatch.setattr(shardwise, 'uses_length_groups', shardwise.uses_length_groups)  # the dry run replaces it
    monkeypatch.setattr(calibration, 'SEARCH_EFFORTS', (32,))  # the report's rows, not the calibration's grid
    out = tmp_path / 'report'
    monkeypatch.setenv('PYTERRIER_MULTIQUERY_CALIBRATIONS', str(tmp_path / 'calibrations'))
    monkeypatch.setattr(sys, 'argv', ['bench_gpu.py', '--device', 'cpu', '--workloads', 'ragged-1k', '--repeats', '1',
                                      '--cpu-check-docs', '2000', '--work-dir', str(tmp_path / 'work'),
                                      '--out', str(out), '--approximate', '--approximate-candidates', '16'])
    bench.main()
    tables = json.loads(out.with_suffix('.json').read_text())['tables']
    rows = tables['Exact search']
    effort = rows[4]['system'].split('effort ')[-1].rstrip(')')
    assert [r['system'] for r in rows] == ['reference (torch, float32, resident)', 'index exact (cpu)',
                                           'index exact (cpu, arrays: no frames)', 'index approximate (cpu)',
                                           f'index approximate (cpu, 16 candidates, effort {effort})',
                                           'index exact (cpu, every thread)']
    assert int(effort) > 0 and tables['At matched recall'] == []  # no fast-plaid rows to match
    approximate = rows[3]
    assert approximate['recall@10'] >= 0.9 and approximate['build s'] > 0
    setting, place = approximate['setting'].split('; candidate stage: ')
    assert (setting == 'exact search' or 'candidates, effort' in setting) and place == 'FAISS on the CPU'
    grouped, arrays = rows[1], rows[2]
    for row in (grouped, arrays):
        assert row['same order'] == 1.0 and row['max |Δscore|'] == 0.0  # the CPU's rankings and scores
    assert grouped['checked against'] == 'index exact (cpu)' and grouped['host GiB (streamed)'] == 0
    assert grouped['docs'] == 1000 and grouped['stored vectors'] >= 4 * 1000
    profile = Path(f'{out}_profile.txt').read_text()
    assert profile.startswith('## ragged-1k: index exact (cpu)')
    line = profile.splitlines()[2].removeprefix('wall ms by phase: ')
    phases = dict(part.rsplit(' ', 1) for part in line.split(', '))
    labels = ('checks', 'queries', 'bound', 'screen', 'bookkeeping', 'rescore', 'merge', 'frame')
    assert list(phases) == ['search', *labels, 'other']
    assert 0 < float(phases['screen']) < float(phases['search'])  # the phases were timed inside the search
    assert float(phases['checks']) > 0 and float(phases['merge']) > 0
    labelled = sum(float(phases[label]) for label in labels)
    # ten figures printed to 0.01 ms, each off by at most 0.005
    assert float(phases['other']) == pytest.approx(float(phases['search']) - labelled, abs=10 * 0.005)
    assert bench.exact.ScreenedBatch.__init__.__module__ == 'pyterrier_multiquery.index.exact'
    for owner, attribute in [(bench.grouped, 'screen'), (bench.maxsim, 'result_frame')]:
        assert getattr(owner, attribute).__module__ != 'bench_gpu'  # the library's own functions, put back


def test_matched_recall_takes_the_fastest_of_each_family_reaching_each_target(bench):
    import pandas as pd
    table = pd.DataFrame({'workload': ['w'] * 7 + ['v'] * 2, 'system': [
        'reference (torch, float32, resident)', 'index exact (cuda)', 'index approximate (cuda, 64 candidates)',
        'fast-plaid (nbits=4)', 'fast-plaid (nbits=8)', 'index exact (cpu, every thread)',
        'index exact (cuda, arrays: no frames)', 'reference (torch, float32, resident)', 'index exact (cuda)'],
        'queries/s': [900., 100., 400., 300., 50., 10., 800., 1., 1.],
        'recall@10': [1., 1., 0.96, 0.97, 0.995, 1., 1., 1., 1.]})
    found = bench.matched_recall(table)
    # at 0.95: the approximate search (400) against fast-plaid's 4 bits (300); at 0.99: exact (100) against 8 bits
    # (50); the reference, the CPU's exact search and the search without frames are in neither family; workload v
    # has no fast-plaid rows
    assert found.to_dict('list') == {
        'workload': ['w', 'w'], 'recall@10 at least': [0.95, 0.99],
        'index': ['index approximate (cuda, 64 candidates)', 'index exact (cuda)'], 'index q/s': [400., 100.],
        'fast-plaid': ['fast-plaid (nbits=4)', 'fast-plaid (nbits=8)'], 'fast-plaid q/s': [300., 50.],
        'index / fast-plaid': [400 / 300, 2.0]}


@pytest.fixture
def minilm_int8(monkeypatch):
    """experiments/gpu/minilm_int8.py, importable as bench_gpu.py imports it (experiments/ on the path)."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    from gpu import minilm_int8
    return minilm_int8


def test_int8_weights_are_each_within_half_a_step_of_the_model(minilm_int8, save_tiny_bert, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel
    source = save_tiny_bert(['cats', 'purr', 'dogs', 'bark'])
    minilm_int8.pack(source, tmp_path / 'packed')
    assert sorted(p.name for p in (tmp_path / 'packed').iterdir()) == [
        'config.json', 'int8.safetensors', 'tokenizer.json', 'tokenizer_config.json']   # nothing half-written left
    original = AutoModel.from_pretrained(source).eval()
    stored = load_file(str(tmp_path / 'packed' / 'int8.safetensors'))
    loaded = minilm_int8.load(tmp_path / 'packed')
    for name, value in original.state_dict().items():
        back = loaded.state_dict()[name]
        if value.dim() == 2:
            assert stored[name].dtype == torch.int8
            step = value.abs().amax(dim=1, keepdim=True) / 127
            assert ((back - value).abs() <= step / 2 + 1e-7).all(), name
            torch.testing.assert_close(back.abs().amax(dim=1), value.abs().amax(dim=1))   # each row's largest kept
        else:
            assert torch.equal(back, value.half().float()), name
    ids = torch.tensor([[2, 5, 6, 3]])
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(original(ids).last_hidden_state, loaded(ids).last_hidden_state,
                                                       dim=-1)
    assert (cosine > 0.99).all()


def test_the_minilm_workload_reads_an_int8_folder(bench, minilm_int8, save_tiny_bert, tmp_path):
    import torch
    words = ['cats', 'purr', 'dogs', 'bark', 'birds', 'sing']
    minilm_int8.pack(save_tiny_bert(words), tmp_path / 'packed')
    scifact = tmp_path / 'data' / 'scifact'
    (scifact / 'qrels').mkdir(parents=True)
    (scifact / 'corpus.jsonl').write_text('{"_id": "d1", "title": "", "text": "cats purr"}\n'
                                          '{"_id": "d2", "title": "", "text": "dogs bark birds sing"}\n')
    (scifact / 'queries.jsonl').write_text('{"_id": "q1", "text": "purr"}\n{"_id": "q2", "text": "dogs sing"}\n')
    (scifact / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n')
    vectors, lengths, queries = bench.minilm_arrays(tmp_path / 'packed', tmp_path / 'data')
    assert lengths.tolist() == [2, 4] and vectors.dtype == np.float16 and vectors.shape == (6, 32)
    model = minilm_int8.load(tmp_path / 'packed')
    with torch.no_grad():   # "dogs bark birds sing": word ids 7 to 10, no special tokens added by this tokenizer
        expected = torch.nn.functional.normalize(model(torch.tensor([[7, 8, 9, 10]])).last_hidden_state[0], dim=-1)
    np.testing.assert_allclose(vectors[2:], expected.numpy(), atol=1e-3)
    assert [q.shape for q in queries] == [(8, 32), (8, 32)]   # each query's vectors repeated to 8
