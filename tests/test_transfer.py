"""experiments/transfer.py: the back-off rows composed from stored scores, and a report asked of parts that were
never stored."""
import sys

import pandas as pd
import pytest


@pytest.fixture(scope='module')
def transfer(experiment_script):
    return experiment_script('transfer')


def test_each_refiner_backs_off_to_its_own_first_stage(transfer):
    part = {'trained on': 'MuSiQue', 'tested on': 'HotpotQA-500', 'fold': -1, 'measure': 'MRecall@10'}
    values = {'MiniLM': (0.1, 0.2), 'MiniLM-FT': (0.3, 0.4), 'AMER': (0.5, 0.6), 'MiniLM-FT >> JPR': (0.7, 0.8)}
    scores = pd.DataFrame([{**part, 'system': system, 'qid': qid, 'value': value}
                           for system, pair in values.items() for qid, value in zip(['q1', 'q2'], pair)])
    familiar = pd.DataFrame([{**part, 'qid': 'q1', 'familiar': True}, {**part, 'qid': 'q2', 'familiar': False}])
    out = transfer.backed_off(scores, familiar)
    added = out.iloc[len(scores):].set_index(['system', 'qid'])['value'].to_dict()
    assert added == {('AMER + back-off', 'q1'): 0.5, ('AMER + back-off', 'q2'): 0.2,   # MiniLM's q2
                     ('MiniLM-FT >> JPR + back-off', 'q1'): 0.7, ('MiniLM-FT >> JPR + back-off', 'q2'): 0.4}
    with pytest.raises(ValueError, match='no familiar questions stored'):
        transfer.backed_off(scores, familiar[familiar['qid'] == 'q1'])


def test_a_report_without_stored_parts_names_the_file_it_read(transfer, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['transfer.py', '--report-only', '--out', str(tmp_path / 'transfer')])
    with pytest.raises(SystemExit, match=r'no stored parts in .*transfer_perquery\.csv'):
        transfer.main()
    assert not (tmp_path / 'transfer.md').exists()
