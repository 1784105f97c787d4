"""The development questions a trainer holds out to choose its epoch (and AMER its merge) on."""
from typing import List, Sequence, Tuple

import numpy as np


def dev_split(qids: Sequence[str], dev_fraction: float, *, seed: int = 0) -> Tuple[List[str], List[str]]:
    """``(train_qids, dev_qids)``: a seeded random ``dev_fraction`` of ``qids`` held out (rounded to a whole number
    of questions), both lists in the drawn order.

    Raises:
        ValueError: If ``dev_fraction`` is not in [0, 1).
    """
    if not 0. <= dev_fraction < 1.:
        raise ValueError(f'dev_fraction must lie in [0, 1), got {dev_fraction}')
    order = np.random.default_rng(seed).permutation(len(qids))
    held_out = int(round(len(qids) * dev_fraction))
    return [qids[i] for i in order[held_out:]], [qids[i] for i in order[:held_out]]
