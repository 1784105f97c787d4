import os
from pathlib import Path

import pytest


@pytest.fixture(scope='session')
def data_dir():
    """The shared collections beside the checkout; tests that read them are skipped where they are absent."""
    path = Path(os.environ.get('PYTERRIER_MULTIQUERY_DATA', Path(__file__).resolve().parents[2] / 'shared' / 'data'))
    if not path.is_dir():
        pytest.skip('shared data folder not found (set PYTERRIER_MULTIQUERY_DATA)')
    return path
