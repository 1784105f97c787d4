"""The AMER paper's synthetic multi-target task (its Appendix A.2).

A query is a vector x; its targets are five transformations of x. Linear targets: T = [I, Ma, Mb, -Ma, -Mb]
applied to x, with Ma, Mb random rotations (so the targets' mean is x / 5). MLP targets: five two-layer GELU
networks x -> GELU(W GELU(W x)) whose weight W is one of A, B, C, -B, -C, rotations that are mutually orthogonal
in the Frobenius inner product. Inputs come from five distributions; the corpus holds every target plus random
N(0, I) negatives.
"""
from typing import List, NamedTuple, Tuple

import numpy as np

DISTRIBUTIONS = ('gaussian', 'gaussian_wide', 'correlated', 'uniform', 'laplace')
SETTINGS = ('single', 'multi', 'ood')
TRANSFORMATIONS = ('linear', 'mlp')
#: Targets per query: the five transformations of its vector.
TARGETS = 5


def random_rotation(dim: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random rotation: orthogonal with determinant +1 (QR of a Gaussian matrix, signs fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def frobenius_orthogonal_rotations(dim: int, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rotations A, B, C with tr(A^T B) = tr(A^T C) = tr(B^T C) = 0.

    A = R1 R2, B = R1 P R2, C = R1 Q R2 with R1, R2 random rotations, P = diag(J, ..., J) and
    Q = diag(J, ..., J, -J, ..., -J) for the quarter turn J = [[0, -1], [1, 0]]: tr(P) = tr(Q) = tr(P^T Q) = 0,
    and the inner product is unchanged by the rotations on both sides. Needs ``dim`` divisible by 4.
    """
    if dim % 4:
        raise ValueError(f'Frobenius-orthogonal rotations need a dimension divisible by 4, got {dim}')
    quarter = np.array([[0., -1.], [1., 0.]])
    blocks = dim // 2
    p = np.kron(np.eye(blocks), quarter)
    q = np.kron(np.diag([1.] * (blocks // 2) + [-1.] * (blocks // 2)), quarter)
    r1, r2 = random_rotation(dim, rng), random_rotation(dim, rng)
    return r1 @ r2, r1 @ p @ r2, r1 @ q @ r2


def sample_inputs(distribution: str, count: int, dim: int, rng: np.random.Generator,
                  mixing: np.ndarray) -> np.ndarray:
    """``count`` inputs from one of the five distributions (``mixing`` is the correlated Gaussian's A)."""
    if distribution == 'gaussian':
        return rng.standard_normal((count, dim))
    if distribution == 'gaussian_wide':
        return 2. * rng.standard_normal((count, dim))
    if distribution == 'correlated':
        covariance = 0.5 * mixing @ mixing.T + 0.1 * np.eye(dim)
        return rng.multivariate_normal(np.zeros(dim), covariance, size=count)
    if distribution == 'uniform':
        return rng.uniform(-2., 2., size=(count, dim))
    if distribution == 'laplace':
        return rng.laplace(size=(count, dim)) + rng.normal(0., 0.1 ** .5, size=(count, dim))
    raise ValueError(f'unknown input distribution {distribution!r}; expected one of {DISTRIBUTIONS}')


def gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf
    return 0.5 * x * (1. + erf(x / np.sqrt(2.)))


class SyntheticTask(NamedTuple):
    """Train and test queries with their five targets each, and the retrieval corpus."""
    train_queries: np.ndarray   # (n_train, d)
    train_targets: np.ndarray   # (n_train, 5, d)
    test_queries: np.ndarray
    test_targets: np.ndarray
    corpus: np.ndarray          # (5 * (n_train + n_test) + negatives, d): all targets, then the negatives
    test_target_rows: np.ndarray  # (n_test, 5): rows of ``corpus`` holding each test query's targets


class Transformations:
    """The five target maps of one task."""

    def __init__(self, kind: str, dim: int, rng: np.random.Generator):
        if kind not in TRANSFORMATIONS:
            raise ValueError(f'unknown transformation {kind!r}; expected one of {TRANSFORMATIONS}')
        self.kind = kind
        if kind == 'linear':
            ma, mb = random_rotation(dim, rng), random_rotation(dim, rng)
            self.matrices = [np.eye(dim), ma, mb, -ma, -mb]
        else:
            a, b, c = frobenius_orthogonal_rotations(dim, rng)
            self.matrices = [a, b, c, -b, -c]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The targets of inputs ``x`` (n, d): (n, 5, d)."""
        if self.kind == 'linear':
            return np.stack([x @ m.T for m in self.matrices], 1)
        return np.stack([gelu(gelu(x @ m.T) @ m.T) for m in self.matrices], 1)


def make_task(setting: str = 'single', transformation: str = 'linear', *, dim: int = 64, train_size: int = 10_000,
              test_size: int = 500, negatives: int = 10_000, seed: int = 0) -> SyntheticTask:
    """One of the paper's six settings.

    Args:
        setting: ``'single'`` (train and test from N(0, I)), ``'multi'`` (both from all five distributions) or
            ``'ood'`` (train on the first four, test on the Laplace one).
        transformation: ``'linear'`` or ``'mlp'``.
        dim: Vector size d.
        train_size: Training queries.
        test_size: Test queries.
        negatives: Random N(0, I) corpus vectors besides the targets.
        seed: Random seed.
    """
    if setting not in SETTINGS:
        raise ValueError(f'unknown setting {setting!r}; expected one of {SETTINGS}')
    rng = np.random.default_rng(seed)
    maps = Transformations(transformation, dim, rng)
    mixing = rng.standard_normal((dim, dim)) / np.sqrt(dim)
    train_from = {'single': ['gaussian'], 'multi': list(DISTRIBUTIONS), 'ood': list(DISTRIBUTIONS[:4])}[setting]
    test_from = {'single': ['gaussian'], 'multi': list(DISTRIBUTIONS), 'ood': ['laplace']}[setting]

    def draw(distributions: List[str], count: int) -> np.ndarray:
        parts = np.array_split(np.arange(count), len(distributions))
        x = np.concatenate([sample_inputs(d, len(p), dim, rng, mixing) for d, p in zip(distributions, parts)])
        return x[rng.permutation(count)]

    train_x, test_x = draw(train_from, train_size), draw(test_from, test_size)
    train_t, test_t = maps(train_x), maps(test_x)
    corpus = np.concatenate([train_t.reshape(-1, dim), test_t.reshape(-1, dim), rng.standard_normal((negatives, dim))])
    rows = TARGETS * train_size + np.arange(TARGETS * test_size).reshape(test_size, TARGETS)
    return SyntheticTask(train_x.astype(np.float32), train_t.astype(np.float32), test_x.astype(np.float32),
                         test_t.astype(np.float32), corpus.astype(np.float32), rows)

