import pytest

from pyterrier_multiquery.experiment import default_data_dir


@pytest.fixture(scope='session')
def data_dir():
    """The shared collections beside the checkout; tests that read them are skipped where they are absent."""
    path = default_data_dir()
    if path is None:
        pytest.skip('shared data folder not found (set PYTERRIER_MULTIQUERY_DATA)')
    return path
