"""Runs that give the same figures to the last digit: seeds, a fixed thread count, deterministic kernels."""
import random

import numpy as np

#: Threads the main job computes with unless told otherwise: float sums of several threads are added in an order that
#: depends on their number, so the published table is tied to one count, not to the machine's cores.
DEFAULT_THREADS = 2


def make_deterministic(seed: int, threads: int = DEFAULT_THREADS) -> None:
    """Seeds Python's, NumPy's and torch's generators and fixes torch's thread count and kernels.

    Args:
        seed: The seed of every generator.
        threads: torch's intra-op threads (their number changes the order of float sums).
    """
    from pyterrier_multiquery._extras import requires
    with requires('dense'):
        import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
