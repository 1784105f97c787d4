import subprocess
import sys

import pandas as pd
import pytest

from pyterrier_multiquery.__main__ import main
from pyterrier_multiquery.experiment import run_experiment


def test_import_is_cheap():
    code = ('import sys, time; start = time.perf_counter(); import pyterrier_multiquery; '
            'print(time.perf_counter() - start); '
            'print(sorted(m for m in ("torch", "transformers", "faiss", "pyterrier_dr", "pyterrier") if m in sys.modules))')
    seconds, heavy = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert float(seconds) < 2.
    assert heavy == '[]'


def test_main_job_on_ramdocs(data_dir, tmp_path, capsys):
    """The README's main job end to end; figures pinned as measured (see the closing note of issue 2)."""
    out = tmp_path / 'table.csv'
    assert main(['--dataset', str(data_dir / 'ramdocs'), '--cache-dir', str(tmp_path / 'cache'), '--save', str(out)]) == 0
    assert 'MRecall@10' in capsys.readouterr().out
    table = pd.read_csv(out).set_index('name')
    assert list(table.columns) == ['MRecall@5', 'MRecall@10', 'MRecall@100', 'AnswerRecall@10', 'alpha_nDCG@10', 'nDCG@10']
    expected = {
        'BM25': {'MRecall@5': 0.7887, 'MRecall@10': 0.8551, 'MRecall@100': 0.9396, 'AnswerRecall@10': 0.9185,
                 'alpha_nDCG@10': 0.8187, 'nDCG@10': 0.7740},
        'MiniLM': {'MRecall@5': 0.7968, 'MRecall@10': 0.8672, 'MRecall@100': 0.9618, 'AnswerRecall@10': 0.9333,
                   'alpha_nDCG@10': 0.7990, 'nDCG@10': 0.7598},
    }
    for name, figures in expected.items():
        for measure, value in figures.items():
            assert table.loc[name, measure] == pytest.approx(value, abs=0.002), (name, measure)
    mmr = table.loc['MiniLM >> MMR(λ=0.5)']
    assert mmr['MRecall@10'] == pytest.approx(0.2596, abs=0.002)
    assert mmr['alpha_nDCG@10'] == pytest.approx(0.4473, abs=0.002)


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
