"""FAISS indexes over all stored vectors of a MultiVectorIndex: the candidate stage of approximate MaxSim."""
import math
import os
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import remove_stale
from pyterrier_multiquery.index.errors import CorruptIndexError

ANN_KINDS = ('flat', 'ivf', 'hnsw')
#: The storage each kind gets when no quantizer is named: IVF keeps 8-bit codes (143 bytes per 128-dimensional
#: vector instead of 527, at the same recall in experiments/results/bench_index.md); flat and HNSW keep float32.
DEFAULT_STORAGE = {'flat': 'Flat', 'ivf': 'SQ8', 'hnsw': 'Flat'}


def ann_storage(kind: str, quantizer: Optional[str]) -> str:
    """The FAISS storage of an ANN stage: ``quantizer``, or the kind's :data:`DEFAULT_STORAGE` where it is None.

    Raises:
        ValueError: For an unknown kind or quantizer.
    """
    if kind not in ANN_KINDS:
        raise ValueError(f'ANN kind must be one of {ANN_KINDS}, got {kind!r}')
    if quantizer is None:
        return DEFAULT_STORAGE[kind]
    if not (quantizer in ('Flat', 'SQ8', 'SQ4', 'SQfp16') or (quantizer.startswith('PQ') and quantizer[2:].isdigit())):
        raise ValueError(f'quantizer must be None, Flat, SQ8, SQ4, SQfp16 or PQ<m>, got {quantizer!r}')
    return quantizer


def faiss_factory(kind: str, quantizer: Optional[str], vec_count: int) -> str:
    """The :func:`faiss.index_factory` string of an ANN stage.

    Args:
        kind: ``flat`` (exhaustive), ``ivf`` (inverted file with ``4 * sqrt(n)`` lists) or ``hnsw`` (HNSW, 32 links).
        quantizer: ``Flat`` (float32 vectors), ``SQ8``/``SQ4``/``SQfp16`` (scalar) or ``PQ<m>`` (product
            quantiser); None for the kind's :data:`DEFAULT_STORAGE`.
        vec_count: Number of vectors to be indexed (sets the number of IVF lists).
    """
    storage = ann_storage(kind, quantizer)
    if kind == 'flat':
        return storage
    if kind == 'ivf':
        return f'IVF{max(1, int(4 * math.sqrt(vec_count)))},{storage}'
    return 'HNSW32' if storage == 'Flat' else f'HNSW32_{storage}'


def ann_file(index, kind: str = 'ivf', quantizer: Optional[str] = None) -> Path:
    """Where the FAISS index of ``index``'s vectors for (kind, quantizer) is kept: in the index folder."""
    factory = faiss_factory(kind, quantizer, index.payload()[0]['vec_count'])
    return Path(index.path) / f'ann.{factory.replace(",", "_")}.faiss'


def load_or_build(index, kind: str = 'ivf', quantizer: Optional[str] = None, *, verbose: bool = True):
    """Loads the FAISS index of ``index``'s vectors for (kind, quantizer), building and caching it the first time.

    The FAISS file lives in the index folder, written under a temporary name and renamed once complete (the
    temporary files of killed builds are removed).

    Returns:
        The CPU :class:`faiss.Index` (inner-product metric).
    """
    with requires('dense'):
        import faiss

    meta, vectors, _, _ = index.payload()
    factory = faiss_factory(kind, quantizer, meta['vec_count'])
    path = ann_file(index, kind, quantizer)
    if path.exists():
        try:
            return faiss.read_index(str(path))
        except RuntimeError as e:
            raise CorruptIndexError(f'FAISS file {str(path)!r} cannot be read (delete it to rebuild): {e}') from None
    remove_stale(path.parent, f'.{path.name}.tmp-')  # left by builds that were killed
    ann = faiss.index_factory(meta['dim'], factory, faiss.METRIC_INNER_PRODUCT)
    if not ann.is_trained:
        rng = np.random.default_rng(0)
        lists = faiss.extract_index_ivf(ann).nlist if kind == 'ivf' else 0
        sample_size = min(meta['vec_count'], max(100_000, 40 * lists))  # FAISS asks for >= 39 points a list
        sample = np.sort(rng.choice(meta['vec_count'], sample_size, replace=False))
        ann.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
    chunk = 65_536
    starts = range(0, meta['vec_count'], chunk)
    if verbose:
        starts = pt.tqdm(starts, desc=f'building {factory}', unit='chunk')
    for start in starts:
        ann.add(np.ascontiguousarray(vectors[start:start + chunk], dtype=np.float32))
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
    try:
        faiss.write_index(ann, str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return ann


class CandidateStage:
    """The candidate stage of approximate MaxSim over one index or shard: its FAISS index, searched for every query
    vector; :func:`merge_hits` merges the hits of several shards."""

    def __init__(self, shard, kind: str, quantizer: Optional[str], search_effort: int, device: str, *, first: int = 0,
                 verbose: bool = False):
        """
        Args:
            shard: The :class:`MultiVectorIndex`.
            kind: FAISS index kind (as :func:`faiss_factory`).
            quantizer: FAISS storage (as :func:`faiss_factory`).
            search_effort: IVF lists probed or HNSW ``efSearch``.
            device: Where FAISS searches (a GPU with faiss-gpu, else the CPU).
            first: The docid of the shard's first document in its sharded index.
            verbose: Whether to show progress when a FAISS index is built.
        """
        self.offsets = shard.payload()[2]
        self.first = first
        self.ann = to_device(load_or_build(shard, kind, quantizer, verbose=verbose), device)
        set_search_effort(self.ann, kind, search_effort)

    def search(self, vectors: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest stored vectors of each vector: their FAISS scores and documents.

        Args:
            vectors: ``(n, dim)`` float32 query vectors.
            k: Stored vectors found per query vector.

        Returns:
            ``(n, k)`` scores (-inf where fewer than ``k`` vectors were found) and docids (``first`` on; -1 there).
        """
        found, hits = self.ann.search(vectors, k)
        return (np.where(hits >= 0, found, -np.inf).astype(np.float32),
                np.where(hits >= 0, np.searchsorted(self.offsets, hits, side='right') - 1 + self.first, -1))


def merge_hits(parts, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """The hits of several shards' candidate stages (in document order) merged: each vector's ``k`` best by FAISS
    score, ties by shard order.

    With one shard the hits are FAISS's. With several they are the nearest vectors of the whole collection when the
    search is exhaustive (``flat``, or IVF probing every list), an approximation of them otherwise (each shard has
    its own lists or graph).
    """
    if len(parts) == 1:
        return parts[0]
    scores = np.concatenate([scores for scores, _ in parts], axis=1)
    best = np.argsort(-scores, axis=1, kind='stable')[:, :k]
    return (np.take_along_axis(scores, best, axis=1),
            np.take_along_axis(np.concatenate([docids for _, docids in parts], axis=1), best, axis=1))


def to_device(ann, device: str):
    """Moves a FAISS index to the GPU when ``device`` is CUDA and FAISS was built with GPU support."""
    with requires('dense'):
        import faiss
    if device.startswith('cuda') and hasattr(faiss, 'index_cpu_to_gpu') and faiss.get_num_gpus() > 0:
        gpu = int(device.split(':')[1]) if ':' in device else 0
        return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), gpu, ann)
    return ann


def set_search_effort(ann, kind: str, effort: int) -> None:
    """Sets how much of the index a search visits: IVF lists probed (``nprobe``) or HNSW's ``efSearch``."""
    with requires('dense'):
        import faiss
    name = {'ivf': 'nprobe', 'hnsw': 'efSearch'}.get(kind)
    if name is not None:
        space = faiss.GpuParameterSpace() if 'Gpu' in type(ann).__name__ else faiss.ParameterSpace()
        space.set_index_parameter(ann, name, effort)
