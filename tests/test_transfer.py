"""experiments/transfer.py: a report asked of parts that were never stored says where it looked."""
import importlib.util
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).parents[1] / 'experiments'


def test_a_report_without_stored_parts_names_the_file_it_read(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location('transfer', EXPERIMENTS / 'transfer.py')
    transfer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(transfer)
    monkeypatch.setattr(sys, 'argv', ['transfer.py', '--report-only', '--out', str(tmp_path / 'transfer')])
    with pytest.raises(SystemExit, match=r'no stored parts in .*transfer_perquery\.csv'):
        transfer.main()
    assert not (tmp_path / 'transfer.md').exists()
