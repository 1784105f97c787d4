"""Every trainer trains the same weights under ``accelerate launch`` (2 CPU processes) as in one process, after the
same samples at the same global batch (experiments/distributed_check.py does the runs)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip('accelerate')
ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-5


@pytest.fixture(scope='module')
def differences(tmp_path_factory):
    """The largest weight difference per trainer, from one run of the check."""
    out = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'distributed_check.py'), '--out',
                          str(tmp_path_factory.mktemp('distributed')), '--atol', str(ATOL)],
                         capture_output=True, text=True)
    rows = dict(re.findall(r'^(\w+)\s+([0-9.e+-]+)\s+[0-9.]+\s+[0-9.]+$', out.stdout, re.M))
    assert rows, out.stdout + out.stderr
    return {trainer: float(diff) for trainer, diff in rows.items()}


@pytest.mark.slow
@pytest.mark.parametrize('trainer', [
    'AMERTrainer',
    pytest.param('JPRTrainer', marks=pytest.mark.xfail(strict=True, reason='differs by about 2e-3: not found yet')),
    pytest.param('contrastive_train', marks=pytest.mark.xfail(strict=True,
                                                              reason='differs by about 2e-4: not found yet')),
    'train_bi_encoder'])
def test_two_processes_train_the_weights_of_one(differences, trainer):
    assert differences[trainer] <= ATOL
