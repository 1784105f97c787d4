"""The README's main-job table is the one the saved run printed: ``experiments/results/main_job.csv``."""
from pathlib import Path

import pandas as pd

from pyterrier_multiquery.experiment.main import format_table

ROOT = Path(__file__).parent.parent


def test_readme_shows_the_saved_main_job_table():
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    shown = readme.split('<!-- main-job-table -->', 1)[1].split('<!-- /main-job-table -->', 1)[0]
    shown = shown.strip().removeprefix('```').removesuffix('```').strip('\n')
    saved = pd.read_csv(ROOT / 'experiments' / 'results' / 'main_job.csv')
    assert shown == format_table(saved)
