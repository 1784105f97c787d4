"""Exact MaxSim search over every document of an index: a fast screening pass in low precision, whose error is
bounded, then float64 scores for the documents the bound cannot rule out.

The screening multiplies in bfloat16 where the device does that faster than float32 (timed once), else in float32,
with the documents' vectors as rows, so that each document's maximum is an elementwise maximum of consecutive rows.
Its scores differ from the exact ones by at most :func:`screening_errors` of each query (``E``), so once every
document is screened, one whose screened score is below the ``k``-th screened score less ``2E`` cannot be in the
top ``k`` (``k`` documents have exact scores above the ``k``-th screened less ``E``, and its own is below that). The
others, about ``k`` a query, get float64 scores (rounded to float32), so that a query's ranking and scores are the
exact ones, whatever the queries batched with it.
"""
import functools
import time
import warnings
from typing import List, Optional

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.index.maxsim import aligned, document_blocks, rescore_candidates

with requires('dense'):
    import torch

#: Unit roundoff of the formats the screening may multiply in.
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
#: The largest absolute error of rounding a value below a format's normal range (half its smallest subnormal),
#: where the unit roundoff no longer bounds the relative error.
UNDERFLOW = {torch.float32: 2.0 ** -150, torch.bfloat16: 2.0 ** -134, torch.float16: 2.0 ** -25}
#: Unit roundoff of float32 matrix products' inputs at each ``torch.get_float32_matmul_precision()``: the exact
#: inputs at ``highest``, TensorFloat-32's at ``high``, bfloat16's at ``medium``.
FLOAT32_INPUT_ROUNDOFF = {'highest': 0.0, 'high': 2.0 ** -11, 'medium': 2.0 ** -8}


@functools.lru_cache(maxsize=None)
def screening_dtype(device: str) -> 'torch.dtype':
    """The format of the screening pass on ``device``: bfloat16 on a CPU that multiplies it at least 1.25x as fast
    as float32 (timed once per process on a product of the pass's shape), else float32 (a GPU's bfloat16 products may
    reduce in bfloat16, which :func:`similarity_error` does not bound)."""
    if not device.startswith('cpu'):
        return torch.float32
    a, b = torch.randn(4096, 128), torch.randn(512, 128)
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y.T  # warm-up
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            x @ y.T
            runs.append(time.perf_counter() - start)
        seconds[dtype] = min(runs)
    return torch.bfloat16 if seconds[torch.float32] >= 1.25 * seconds[torch.bfloat16] else torch.float32


def similarity_error(dtype: 'torch.dtype', dim: int) -> float:
    """``c`` such that a screened inner product of ``q`` and ``d`` is within ``c * |q| * |d|`` of the exact one.

    The inputs are rounded to ``dtype`` (float32 inputs: to the precision ``torch.get_float32_matmul_precision()``
    allows), the ``dim`` products summed in float32 in any order, and the sum rounded to ``dtype``
    (:func:`product_error`).
    """
    u_out = UNIT_ROUNDOFF[dtype]
    precision = torch.get_float32_matmul_precision()
    u_in = u_out if dtype != torch.float32 else FLOAT32_INPUT_ROUNDOFF.get(precision, 2.0 ** -8)
    return product_error(dim, u_in, u_out)


def product_error(dim: int, input_roundoff: float, output_roundoff: float,
                  accumulation_roundoff: float = UNIT_ROUNDOFF[torch.float32],
                  document_roundoff: Optional[float] = None) -> float:
    """``c`` such that an inner product of ``dim`` terms is within ``c * |q| * |d|`` of the exact one when the
    query's values are rounded with unit roundoff ``input_roundoff`` and the document's with ``document_roundoff``
    (default: the same; 0 where they are held exactly), the products summed in any order with
    ``accumulation_roundoff`` (at most ``gamma_dim`` of the sum of the products' magnitudes) and the sum rounded
    with ``output_roundoff``: ``(1 + u_q) (1 + u_d) (1 + gamma_dim) (1 + u_out) - 1``, with Cauchy-Schwarz bounding
    the sum of the products' magnitudes by ``|q| * |d|``. Values below the formats' normal range add
    :func:`underflow_error`."""
    document_roundoff = input_roundoff if document_roundoff is None else document_roundoff
    gamma = dim * accumulation_roundoff / (1 - dim * accumulation_roundoff)
    return (1 + input_roundoff) * (1 + document_roundoff) * (1 + gamma) * (1 + output_roundoff) - 1


def underflow_error(dim: int, underflow: float, query_norm, document_norm: float, similarity: float):
    """What values rounded below their format's normal range, each by at most ``underflow`` (:data:`UNDERFLOW`),
    add to the error of an inner product of ``dim`` terms (``similarity``: its :func:`product_error`): each term
    gains at most ``underflow * (|q_k| + |d_k|) (1 + u) + underflow^2``, whose sum is at most ``underflow * sqrt(dim)
    * (|q| + |d|) (1 + u) + dim * underflow^2``, and the accumulation and output roundings scale that by less than
    ``1 + similarity``."""
    return (1 + similarity) ** 2 * (underflow * np.sqrt(dim) * (query_norm + document_norm) + dim * underflow ** 2)


def screening_errors(queries: List[np.ndarray], max_norm: float, dtype: 'torch.dtype', aggregate: str,
                     similarity: Optional[float] = None, underflow: Optional[float] = None) -> np.ndarray:
    """The most each query's screened MaxSim score can differ from its exact one, against documents whose vectors
    have norms of at most ``max_norm``: each vector's maximum is off by at most ``similarity`` (default:
    :func:`similarity_error` of ``dtype``) times the norms, plus :func:`underflow_error` (``underflow``, default:
    ``dtype``'s), and the float32 sum of the maxima (and the mean's weights) adds ``gamma_Q`` and two roundings.
    Computed for all the queries at once (one pass over their vectors, not a loop over queries)."""
    u32 = UNIT_ROUNDOFF[torch.float32]
    counts = np.array([len(q) for q in queries])
    vectors = np.concatenate(queries).astype(np.float64)
    dim = vectors.shape[1]
    norms = np.sqrt(np.einsum('ij,ij->i', vectors, vectors))
    if similarity is None:
        similarity = similarity_error(dtype, dim)
    if underflow is None:
        underflow = UNDERFLOW[dtype]
    starts = np.cumsum(counts) - counts
    summed = (1 + counts * u32 / (1 - counts * u32)) * (1 + u32) ** 2
    total = ((1 + similarity) * summed - 1) * max_norm * np.add.reduceat(norms, starts) + \
        summed * np.add.reduceat(underflow_error(dim, underflow, norms, max_norm, similarity), starts)
    return total / counts if aggregate == 'mean' else total


def max_vector_norm(vectors, chunk: int = 1 << 16) -> float:
    """The largest Euclidean norm of stored vectors (computed in float64, a chunk of rows at a time)."""
    best = 0.0
    for start in range(0, len(vectors), chunk):
        block = np.asarray(vectors[start:start + chunk], dtype=np.float64)
        best = max(best, float(np.sqrt((block * block).sum(axis=1).max(initial=0.0))))
    return best


def stored_max_norm(payload) -> float:
    """The largest norm of an index's stored vectors (``payload``: its ``payload()``): the one its metadata records,
    else computed, for an index built before indexes recorded it."""
    meta, vectors = payload[0], payload[1]
    return meta['max_norm'] if 'max_norm' in meta else max_vector_norm(vectors)


class ScreenedBatch:
    """The screening of a batch of queries over the blocks of an index's documents, fed in order: the running
    ``k``-th screened score of each query and the documents within ``2E`` of it (:meth:`candidates`)."""

    #: Candidates kept over all the batch's queries before those that fell below the risen floor are dropped.
    PRUNE_AT = 1 << 22

    def __init__(self, queries: List[np.ndarray], *, k: int, aggregate: str, max_norm: float, device: str,
                 dtype: 'torch.dtype', similarity: Optional[float] = None, underflow: Optional[float] = None):
        """
        Args:
            similarity: The bound of the screening's inner products (:func:`screening_errors`).
            underflow: The absolute rounding error of its inputs below their normal range (:func:`screening_errors`).
        """
        self.k, self.device, self.dtype = k, device, dtype
        self.queries = queries
        self.lengths = np.array([len(q) for q in queries])
        self.vector_count = int(self.lengths.sum())
        #: The queries' common number of vectors (their maxima are then summed in place of the product with
        #: ``weights``, about twice as fast), or None.
        self.query_length = int(self.lengths[0]) if (self.lengths == self.lengths[0]).all() else None
        self.aggregate = aggregate
        self.error = torch.from_numpy(screening_errors(queries, max_norm, dtype, aggregate, similarity,
                                                       underflow)).to(device)
        self.top = torch.empty((len(queries), 0), device=device)  # the k best screened scores so far
        self.pool = []  # (query rows, docids, screened scores) of the documents not ruled out when screened
        self.pooled = 0

    @functools.cached_property
    def screen_vectors(self) -> 'torch.Tensor':
        """The queries' vectors in the screening dtype, ``(query vectors, dim)`` (:meth:`screen`)."""
        return aligned(np.concatenate(self.queries)).to(self.device).to(self.dtype)

    @functools.cached_property
    def weights(self) -> 'torch.Tensor':
        """``(query vectors, queries)``: each query's sum (or mean) of its vectors' maxima (:meth:`screen`)."""
        weights = np.zeros((self.vector_count, len(self.queries)), dtype=np.float32)
        weights[np.arange(self.vector_count), np.repeat(np.arange(len(self.queries)), self.lengths)] = \
            1 / np.repeat(self.lengths, self.lengths) if self.aggregate == 'mean' else 1
        return torch.from_numpy(weights).to(self.device)

    def screen(self, block, block_offsets: np.ndarray, tile_vectors: int):
        """Screened ``(queries, documents)`` scores of a block of documents (``block``: their vectors in the
        screening dtype, ``block_offsets``: where each starts, from 0), scored a tile of about ``tile_vectors`` vectors
        at a time."""
        parts = [self.tile_scores(block[block_offsets[a]:block_offsets[b]], np.diff(block_offsets[a:b + 1]))
                 for a, b in document_blocks(block_offsets, tile_vectors)]
        return torch.cat(parts).T

    def tile_scores(self, tile, lengths: np.ndarray):
        """Screened ``(documents, queries)`` scores of a tile of documents: their vectors (``tile``, in the
        screening dtype) and how many each has."""
        sims = tile @ self.screen_vectors.T  # (tile vectors, query vectors)
        if (lengths == lengths[0]).all():  # equal lengths: each document's maximum over consecutive rows
            maxima = sims.view(len(lengths), int(lengths[0]), -1).amax(dim=1)
        else:
            owner = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths)).to(sims.device)
            maxima = torch.full((len(lengths), sims.shape[1]), -torch.inf, dtype=sims.dtype, device=sims.device)
            maxima.scatter_reduce_(0, owner[:, None].expand(-1, sims.shape[1]), sims, 'amax')
        maxima = maxima.float()
        if self.query_length is None:
            return maxima @ self.weights
        summed = maxima.view(len(maxima), -1, self.query_length).sum(dim=2)
        return summed / self.query_length if self.aggregate == 'mean' else summed

    def add(self, screened, first) -> Optional['torch.Tensor']:
        """Takes the screened scores of the documents ``first, first + 1, ...`` (or, where ``first`` is a tensor,
        of the documents it holds), none added before: raises each query's ``k``-th screened score and keeps the
        documents at or above its :meth:`floor`, and those whose screened score is not finite (a float32 sum that
        overflowed: their exact scores decide). Returns where the scores are not finite, or None where all are.

        The running top ``k`` is merged with the block's own top ``k``, and the floor is compared in float32 (rounded
        down), so that the block's scores are read, not copied: only where some are not finite is a copy made with
        those masked (a pass over a GPU's memory costs as much as the comparisons)."""
        finite = torch.isfinite(screened)
        unknown = None if bool(finite.all()) else ~finite
        known = screened if unknown is None else screened.masked_fill(unknown, -torch.inf)
        self.top = torch.cat([self.top, known.topk(min(self.k, known.shape[1]), dim=1).values], dim=1)
        self.top = self.top.topk(min(self.k, self.top.shape[1]), dim=1).values
        floor = float32_at_or_below(self.floor())
        kept = known >= floor[:, None]
        rows, columns = torch.nonzero(kept if unknown is None else kept | unknown, as_tuple=True)
        docids = first[columns] if isinstance(first, torch.Tensor) else columns + first
        self.pool.append((rows, docids, screened[rows, columns].nan_to_num(torch.inf, torch.inf, torch.inf)))
        self.pooled += len(rows)
        if self.pooled > self.PRUNE_AT:  # the floor has risen since the first blocks: drop what fell below it
            self.pool = [self._pooled()]
            self.pooled = len(self.pool[0][0])
        return unknown

    def floor(self):
        """Each query's lowest screened score that may still belong to its top ``k``: its ``k``-th screened score so
        far (-inf before ``k`` documents) less twice its error, less a float32 ulp of slack for the rounding of the
        exact scores to float32 (``(queries,)`` float64)."""
        kth = self.top[:, self.k - 1].double() if self.top.shape[1] >= self.k else \
            torch.full((len(self.top),), -torch.inf, dtype=torch.float64, device=self.device)
        floor = kth - 2 * self.error
        return floor - 2.0 ** -21 * floor.abs()

    def _pooled(self):
        """The pooled documents at or above the current floor, as one ``(rows, docids, scores)``."""
        rows, docids, scores = (torch.cat(parts) for parts in zip(*self.pool))
        keep = scores.double() >= self.floor()[rows]
        return rows[keep], docids[keep], scores[keep]

    def candidates(self) -> np.ndarray:
        """Each query's documents that may belong to its top ``k`` (all documents screened): a row each, ascending,
        -1 padded."""
        rows, docids, _ = self._pooled()
        rows, docids = rows.cpu().numpy(), docids.cpu().numpy()
        order = np.lexsort((docids, rows))
        rows, docids = rows[order], docids[order]
        counts = np.bincount(rows, minlength=len(self.top))
        padded = np.full((len(self.top), counts.max()), -1, dtype=np.int64)
        padded[rows, np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)] = docids
        return padded


def float32_at_or_below(values: 'torch.Tensor') -> 'torch.Tensor':
    """The largest float32 at or below each float64 value: a float32 score is at or above it exactly where it is at or
    above the value."""
    rounded = values.float()
    return torch.where(rounded.double() > values, torch.nextafter(rounded, torch.full_like(rounded, -torch.inf)),
                       rounded)


def screening_rows(vectors, rows: slice, device: str, dtype: 'torch.dtype') -> 'torch.Tensor':
    """``vectors[rows]`` converted to the screening ``dtype`` on ``device`` in one pass (no aligned copy first: the
    screening's bound holds however its products round)."""
    if isinstance(vectors, torch.Tensor):
        return vectors[rows].to(dtype)
    with warnings.catch_warnings():  # a read-only memory map: only read here, by the conversion
        warnings.filterwarnings('ignore', message='The given NumPy array is not writable')
        return torch.from_numpy(np.asarray(vectors[rows])).to(device=device, dtype=dtype)


def exact_top(queries: List[np.ndarray], vectors, offsets: np.ndarray, *, num_results: int, aggregate: str,
              batch_size: int, block_vectors: int, tile_bytes: int, device: str, max_norm: Optional[float] = None,
              label: Optional[str] = None, check=None):
    """Each query's top documents of an index (or one shard) by exact MaxSim over all its documents.

    The stored vectors are read in blocks of about ``block_vectors`` (each block once, for all the queries) and
    screened in tiles of about ``tile_bytes`` (:class:`ScreenedBatch`); then each query's candidates are scored in
    float64. ``check`` (a :class:`~.checks.ScoreCheck`) checks the stored vectors of the documents whose screened
    scores are not finite, and each query's exact scores.

    Args:
        max_norm: The largest norm of the stored vectors (the index's ``max_norm``); None computes it.

    Returns:
        For each batch of ``batch_size`` queries, ``(scores, docids)``: each query's top ``num_results`` (or all the
        documents, if fewer) in a row, by score, ties by docid.
    """
    dtype = screening_dtype(device)
    if max_norm is None:
        max_norm = max_vector_norm(vectors)
    batches = [ScreenedBatch(queries[start:start + batch_size], k=num_results, aggregate=aggregate,
                             max_norm=max_norm, device=device, dtype=dtype)
               for start in range(0, len(queries), batch_size)]
    tile_vectors = [max(1, tile_bytes // (dtype.itemsize * (batch.vector_count + vectors.shape[1])))
                    for batch in batches]
    blocks = document_blocks(offsets, block_vectors)
    if label is not None:
        blocks = pt.tqdm(blocks, desc=label, unit='block')
    for first, last in blocks:
        block_offsets = offsets[first:last + 1] - offsets[first]
        block = screening_rows(vectors, slice(offsets[first], offsets[last]), device, dtype)
        for i, batch in enumerate(batches):
            unknown = batch.add(batch.screen(block, block_offsets, tile_vectors[i]), first)
            if check is not None and unknown is not None:  # a damaged document, or an overflow
                check.stored_vectors(first + np.unique(np.nonzero(unknown.cpu().numpy())[1]))
    return scored_candidates(batches, queries, batch_size, vectors, offsets, num_results=num_results,
                             aggregate=aggregate, tile_bytes=tile_bytes, device=device, check=check)


def scored_candidates(batches: List[ScreenedBatch], queries: List[np.ndarray], batch_size: int, vectors,
                      offsets: np.ndarray, *, num_results: int, aggregate: str, tile_bytes: int, device: str,
                      check=None):
    """Each batch's top documents once every document is screened: its candidates scored in float64 (rounded to
    float32), as ``(scores, docids)`` a batch (:func:`exact_top`)."""
    results = []
    for i, batch in enumerate(batches):
        docids = batch.candidates()
        start = i * batch_size
        scores, docids, _ = rescore_candidates(queries, [(start, start + len(docids), docids)], vectors, offsets,
                                               num_results=num_results, aggregate=aggregate, tile_bytes=tile_bytes,
                                               device=device, check=check, dtype=torch.float64)[0]
        keep = min(num_results, len(offsets) - 1)  # every query has at least this many candidates
        results.append((scores[:, :keep], docids[:, :keep]))
    return results
