"""StoredParts: the finished parts of a long experiment kept beside its report, resumed only under the settings that
made them."""
import pandas as pd
import pytest

from pyterrier_multiquery.experiment.parts import StoredParts

KINDS = ('perquery', 'choices')
MADE = {'seed': 0, 'folds': 5, 'threads': 2}


def _part(source='MuSiQue', fold=-1, value=0.25):
    return pd.DataFrame([{'trained on': source, 'fold': fold, 'AMER': value}])


def test_a_part_is_stored_found_by_its_key_and_read_back(tmp_path):
    out = tmp_path / 'transfer'
    StoredParts(out, KINDS, MADE).add(choices=_part(), perquery=pd.DataFrame({'qid': ['001'], 'value': [1.]}))
    StoredParts(out, KINDS, MADE).add(choices=_part('RAMDocs', 0, 0.5))
    resumed = StoredParts(out, KINDS, dict(MADE))
    assert resumed.done('choices', **{'trained on': 'MuSiQue', 'fold': -1})
    assert not resumed.done('choices', **{'trained on': 'MuSiQue', 'fold': 0})
    assert resumed.rows('choices', fold=0)['AMER'].tolist() == [0.5]
    assert resumed.frames['perquery']['qid'].tolist() == ['001']   # qids stay strings
    assert sorted(p.name for p in tmp_path.iterdir()) == ['transfer_choices.csv', 'transfer_perquery.csv',
                                                          'transfer_settings.json']


def test_parts_are_refused_under_other_settings_or_without_a_record_of_theirs(tmp_path):
    out = tmp_path / 'transfer'
    StoredParts(out, KINDS, MADE).add(choices=_part())
    assert StoredParts(out, KINDS).settings == MADE   # read only: the settings the parts were made with
    with pytest.raises(SystemExit, match=r"made with seed=0 \(from transfer_settings.json\), not seed=1: "):
        StoredParts(out, KINDS, {**MADE, 'seed': 1})   # only the settings that differ are named
    with pytest.raises(SystemExit, match=r"made with code=None \(from transfer_settings.json\), not code='c2'"):
        StoredParts(out, KINDS, {**MADE, 'code': 'c2'})   # parts of a run that kept no fingerprint of its code
    (tmp_path / 'transfer_settings.json').unlink()   # parts of a run that kept no record of its settings
    with pytest.raises(SystemExit, match=r'made with no record of their settings \(transfer_settings.json is'):
        StoredParts(out, KINDS, MADE)
    restarted = StoredParts(out, KINDS, {**MADE, 'seed': 1}, restart=True)
    assert not restarted.done('choices', fold=-1) and not (tmp_path / 'transfer_choices.csv').exists()


def test_a_settings_record_no_part_was_stored_under_is_replaced(tmp_path):
    out = tmp_path / 'transfer'
    (tmp_path / 'transfer_settings.json').write_text('{"seed": 1}')   # a run stopped before its first part
    StoredParts(out, KINDS, MADE).add(choices=_part())
    assert StoredParts(out, KINDS).settings == MADE    # the parts' own settings, not the stopped run's
    with pytest.raises(SystemExit, match=r'made with seed=0, folds=5, threads=2 \(from transfer_settings.json\), '
                                          r'not seed=1, folds=None, threads=None: '):
        StoredParts(out, KINDS, {'seed': 1})


def test_parts_without_a_path_stay_in_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parts = StoredParts(None, KINDS)
    parts.add(choices=_part())
    assert parts.done('choices', fold=-1) and list(tmp_path.iterdir()) == []
