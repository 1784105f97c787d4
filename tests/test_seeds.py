"""experiments/seeds.py: the departure weights a seed's trainings chose, read from hand-made cache entries."""
import json

import pytest

pytest.importorskip('tabulate')


@pytest.fixture
def seeds(experiment_script):
    return experiment_script('seeds')


def entry(cache, name, seed, first_stage, weight, departure='one_se'):
    """A cache entry as the trainers leave one: its key's settings in the manifest, the choice in training.json."""
    (cache / name / 'artifact').mkdir(parents=True)
    (cache / name / 'manifest.json').write_text(json.dumps({'key': {'settings': {'seed': seed,
                                                                                 'departure': departure}}}))
    (cache / name / 'artifact' / 'training.json').write_text(json.dumps({'first_stage': first_stage,
                                                                         'history': {'departure': weight}}))


def test_the_seeds_one_se_choices_by_method_and_first_stage_in_name_order(seeds, tmp_path):
    # the entries' hashed names put JPR over single-vector before JPR over minilm, and AMER's likewise
    entry(tmp_path, 'jpr-0a', 1, 'single-vector', 0.0)
    entry(tmp_path, 'jpr-ff', 1, 'minilm', 0.5)
    entry(tmp_path, 'amer-0b', 1, 'single-vector', 0.25)
    entry(tmp_path, 'amer-fe', 1, 'minilm', 0.75)
    entry(tmp_path, 'amer-11', 0, 'minilm', 1.0)                          # another seed
    entry(tmp_path, 'jpr-12', 1, 'minilm', 1.0, departure=None)          # trained without a chosen departure
    chosen = seeds.chosen_weights(tmp_path, 1)
    assert list(chosen.items()) == [('AMER over minilm', 0.75), ('AMER over single-vector', 0.25),
                                    ('JPR over minilm', 0.5), ('JPR over single-vector', 0.0)]
    assert seeds.chosen_weights(tmp_path, 0) == {'AMER over minilm': 1.0}
    assert seeds.chosen_weights(tmp_path, 2) == {}
