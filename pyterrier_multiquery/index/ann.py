"""FAISS indexes over all stored vectors of a MultiVectorIndex: the candidate stage of approximate MaxSim."""
import hashlib
import json
import math
import os
import struct
import threading
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._device import fits_on_device
from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import file_sha256, remove_stale
from pyterrier_multiquery.index.errors import CorruptIndexError, IndexReplacedError

ANN_KINDS = ('flat', 'ivf', 'hnsw')
#: The storage each kind gets when no quantizer is named: IVF keeps 8-bit codes (143 bytes per 128-dimensional
#: vector instead of 527, at the same recall: docs/index.md, "The candidate stage"); flat and HNSW keep float32.
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
        kind: ``flat`` (exhaustive), ``ivf`` (inverted file with ``4 * sqrt(n)`` lists, no more than ``n``: FAISS
            needs a training vector per list) or ``hnsw`` (HNSW, 32 links).
        quantizer: ``Flat`` (float32 vectors), ``SQ8``/``SQ4``/``SQfp16`` (scalar) or ``PQ<m>`` (product
            quantiser); None for the kind's :data:`DEFAULT_STORAGE`.
        vec_count: Number of vectors to be indexed (sets the number of IVF lists).
    """
    storage = ann_storage(kind, quantizer)
    if kind == 'flat':
        return storage
    if kind == 'ivf':
        return f'IVF{max(1, min(vec_count, int(4 * math.sqrt(vec_count))))},{storage}'
    return 'HNSW32' if storage == 'Flat' else f'HNSW32_{storage}'


def ann_file(index, kind: str = 'ivf', quantizer: Optional[str] = None, *, payload=None) -> Path:
    """Where the FAISS index of ``index``'s vectors for (kind, quantizer) is kept: in the index folder (``payload``:
    the index's, if already loaded)."""
    factory = faiss_factory(kind, quantizer, (payload or index.payload())[0]['vec_count'])
    return Path(index.path) / f'ann.{factory.replace(",", "_")}.faiss'


#: A FAISS file of the index ends with a JSON stamp (the build it was made from, the size and SHA-256 of the FAISS
#: bytes before it), the stamp's length (8 bytes, little-endian) and these 8 bytes.
STAMP_MAGIC = b'MVI-ANN1'


def load_or_build(index, kind: str = 'ivf', quantizer: Optional[str] = None, *, payload=None):
    """Loads the FAISS index of ``index``'s vectors for (kind, quantizer), building and caching it the first time.

    The FAISS file lives in the index folder, written under a temporary name and renamed once complete (the
    temporary files of killed builds are removed). It is stamped with the build of the index it was made from and
    its checksum, both checked when it loads. A build announces itself with a progress bar whatever the search's
    ``verbose`` (it happens once an index and takes minutes on a large one): training, then adding the vectors.

    Args:
        payload: ``index.payload()``, where the caller has it (the FAISS index is then of that very build).

    Returns:
        The CPU :class:`faiss.Index` (inner-product metric).

    Raises:
        CorruptIndexError: If the FAISS file was made from another build, or changed since it was written, or the
            index was replaced by another build since ``payload``.
    """
    with requires('dense'):
        import faiss

    meta, vectors, offsets, docnos = payload or index.payload()
    factory = faiss_factory(kind, quantizer, meta['vec_count'])
    path = ann_file(index, kind, quantizer, payload=(meta, vectors, offsets, docnos))
    try:
        with open(path, 'rb') as f:
            size = check_ann_file(f, meta['build_id'], path)
            f.seek(0)
            try:
                return faiss.read_index(faiss.PyCallbackIOReader(lambda n: f.read(min(n, size - f.tell()))))
            except RuntimeError as e:
                raise CorruptIndexError(f'FAISS file {str(path)!r} cannot be read (delete it to rebuild): '
                                        f'{e}') from None
    except (FileNotFoundError, CorruptIndexError):
        # the folder now holds another build (its FAISS file, or none yet): that, not the file, is the news
        if index.payload()[0]['build_id'] != meta['build_id']:
            raise IndexReplacedError(f'the index at {str(index.path)!r} was replaced by another build while this '
                                    'search opened it; search again') from None
        if path.exists():
            raise
    remove_stale(path.parent, f'.{path.name}.tmp-')  # left by builds that were killed
    ann = faiss.index_factory(meta['dim'], factory, faiss.METRIC_INNER_PRODUCT)
    if not ann.is_trained:
        rng = np.random.default_rng(0)
        lists = faiss.extract_index_ivf(ann).nlist if kind == 'ivf' else 0
        sample_size = min(meta['vec_count'], max(100_000, 40 * lists))  # FAISS asks for >= 39 points a list
        sample = np.sort(rng.choice(meta['vec_count'], sample_size, replace=False))
        with pt.tqdm(total=1, desc=f'FAISS {factory} for {index.path}: training on {sample_size:,} vectors',
                     unit='step') as bar:
            ann.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
            bar.update()
    chunk = 65_536
    starts = pt.tqdm(range(0, meta['vec_count'], chunk), desc=f'FAISS {factory} for {index.path}: adding '
                     f'{meta["vec_count"]:,} vectors', unit='chunk')
    for start in starts:
        block = np.ascontiguousarray(vectors[start:start + chunk], dtype=np.float32)
        if not np.isfinite(block).all():
            row = start + int(np.argmin(np.isfinite(block).all(axis=1)))
            docno = str(docnos.fwd[int(np.searchsorted(offsets, row, side='right')) - 1])
            raise CorruptIndexError(f'document {docno!r} has non-finite values (NaN or inf) in its stored vectors: '
                                    f'the index at {str(index.path)!r} is damaged; rebuild it')
        ann.add(block)
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
    try:
        _write_stamped(ann, tmp, meta['build_id'])
        if index.payload()[0]['build_id'] == meta['build_id']:  # not when the index was replaced meanwhile
            try:
                os.replace(tmp, path)
            except FileNotFoundError:
                pass  # replaced since the check (its folder, with tmp, went with the old build): kept in memory only
    finally:
        if tmp.exists():
            tmp.unlink()
    return ann


def _write_stamped(ann, path: Path, build_id: str) -> None:
    """Writes a FAISS index followed by its stamp (see :data:`STAMP_MAGIC`)."""
    with requires('dense'):
        import faiss
    digest = hashlib.sha256()
    with open(path, 'wb') as f:
        def write(data):
            digest.update(data)
            return f.write(data)
        faiss.write_index(ann, faiss.PyCallbackIOWriter(write))
        stamp = json.dumps({'build_id': build_id, 'size': f.tell(), 'sha256': digest.hexdigest()}).encode()
        f.write(stamp + struct.pack('<Q', len(stamp)) + STAMP_MAGIC)


def check_ann_file(file, build_id: str, path: Optional[Path] = None) -> int:
    """Checks a FAISS file's stamp against the index build ``build_id`` and its bytes against their SHA-256.

    Args:
        file: The FAISS file, or a binary file open on it.
        build_id: The build of the index the FAISS file belongs to.
        path: The file's path, for messages, where ``file`` is an open file.

    Returns:
        The size of the FAISS bytes (before the stamp).

    Raises:
        CorruptIndexError: Naming the file, if it has no readable stamp, was made from another build, or changed.
    """
    if not hasattr(file, 'read'):
        with open(file, 'rb') as f:
            return check_ann_file(f, build_id, Path(file))
    name = repr(str(path))
    stamp = _read_stamp(file)
    if stamp is None:
        raise CorruptIndexError(f'FAISS file {name} has no readable stamp of the index build it was made from (it is '
                                'damaged, or was written by an older version); delete it to rebuild it')
    if stamp.get('build_id') != build_id:
        raise CorruptIndexError(f'FAISS file {name} was made from another build of an index '
                                f'({stamp.get("build_id")!r}), not from this one ({build_id!r}); delete it '
                                'to rebuild it')
    file.seek(0)
    if file_sha256(file, length=stamp['size']) != stamp['sha256']:
        raise CorruptIndexError(f'FAISS file {name}: its SHA-256 differs from its stamp: the file changed since it '
                                'was written; delete it to rebuild it')
    return stamp['size']


def _read_stamp(file) -> Optional[dict]:
    """The stamp at the end of an open FAISS file, or None where it has no well-formed one."""
    end = file.seek(0, os.SEEK_END)
    if end < 16:
        return None
    file.seek(end - 16)
    tail = file.read(16)
    length = struct.unpack('<Q', tail[:8])[0]
    if tail[8:] != STAMP_MAGIC or length > end - 16:
        return None
    file.seek(end - 16 - length)
    try:
        stamp = json.loads(file.read(length))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(stamp, dict) or stamp.get('size') != end - 16 - length or \
            not isinstance(stamp.get('sha256'), str):
        return None
    return stamp


class CandidateStage:
    """The candidate stage of approximate MaxSim over one index or shard: its FAISS index (or, on a GPU that FAISS
    cannot search on, its IVF lists in torch: :class:`~.device_ivf.DeviceIVF`), searched for every query vector at a
    given effort (one copy in memory for every effort); :func:`merge_hits` merges the hits of several shards."""

    def __init__(self, shard, kind: str, quantizer: Optional[str], device: str, *, first: int = 0,
                 payload=None):
        """
        Args:
            shard: The :class:`MultiVectorIndex`.
            kind: FAISS index kind (as :func:`faiss_factory`).
            quantizer: FAISS storage (as :func:`faiss_factory`).
            device: Where the stage searches: a GPU (FAISS's GPU index where FAISS has GPU support, else an IVF
                stage in torch, :func:`searched_in_torch`; HNSW and a flat stage stay on the CPU), or the CPU.
            first: The docid of the shard's first document in its sharded index.
            payload: ``shard.payload()``, where the caller has it (the FAISS index is then of that very build).
        """
        payload = shard.payload() if payload is None else payload
        # the document of every stored vector, then -1 for FAISS's "no hit" (-1): one lookup a hit, where a binary
        # search of the offsets took a third of the candidate stage at a million documents
        counts = np.diff(np.asarray(payload[2]))
        docids = np.arange(len(counts), dtype=np.int32 if len(counts) < 2 ** 31 else np.int64)
        self.vector_docs = np.append(np.repeat(docids, counts), docids.dtype.type(-1))
        self.first = first
        self.kind = kind
        ann = load_or_build(shard, kind, quantizer, payload=payload)
        self.in_torch = searched_in_torch(kind, device, payload[1])
        if self.in_torch:
            from pyterrier_multiquery.index.device_ivf import DeviceIVF
            from pyterrier_multiquery.index.exact import stored_max_norm
            self.ann = DeviceIVF(ann, payload[1], device, stored_max_norm(payload))
        else:
            self.ann = to_device(ann, device)
        self.lock = threading.Lock()   # the effort is the FAISS index's own setting, set for each search

    def search(self, vectors: np.ndarray, k: int, search_effort: int) -> Tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest stored vectors of each vector: their FAISS scores and documents.

        Args:
            vectors: ``(n, dim)`` float32 query vectors.
            k: Stored vectors found per query vector.
            search_effort: IVF lists probed or HNSW ``efSearch``.

        Returns:
            ``(n, k)`` scores (-inf where fewer than ``k`` vectors were found) and docids (``first`` on; -1 there).
        """
        if self.in_torch:  # a DeviceIVF: the lists probed are an argument of its search, not a setting
            found, hits = self.ann.search(vectors, k, search_effort)
        else:
            with self.lock:
                set_search_effort(self.ann, self.kind, search_effort)
                found, hits = self.ann.search(vectors, k)
        return (np.where(hits >= 0, found, -np.inf).astype(np.float32),
                np.where(hits >= 0, self.vector_docs[hits].astype(np.int64) + self.first, -1))


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


def faiss_gpus() -> int:
    """The GPUs FAISS can search on: none where it was built without GPU support."""
    with requires('dense'):
        import faiss
    return faiss.get_num_gpus() if hasattr(faiss, 'index_cpu_to_gpu') else 0


def searched_in_torch(kind: str, device: str, vectors: np.ndarray) -> bool:
    """Whether an ANN stage of ``kind`` over ``vectors`` is searched in torch on ``device``
    (:class:`~.device_ivf.DeviceIVF`): an IVF stage on a GPU that FAISS cannot search on, where a 16-bit copy of the
    vectors fits twice in the GPU's free memory (else FAISS searches it on the CPU)."""
    if kind != 'ivf' or not device.startswith('cuda') or faiss_gpus() > 0:
        return False
    return fits_on_device(2 * vectors.shape[0] * vectors.shape[1], device)


def to_device(ann, device: str):
    """Moves a FAISS index to the GPU when ``device`` is CUDA, FAISS was built with GPU support and has a GPU version
    of the index (IVF and flat; HNSW stays on the CPU)."""
    with requires('dense'):
        import faiss
    if device.startswith('cuda') and faiss_gpus() > 0 and not isinstance(ann, faiss.IndexHNSW):
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
