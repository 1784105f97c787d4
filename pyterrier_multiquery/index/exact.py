"""Exact MaxSim search over every document of an index: a fast screening pass in low precision, whose error is
bounded, then float64 scores for the documents the bound cannot rule out.

The screening multiplies in bfloat16 where the device does that faster than float32 (timed once), else in float32,
with the documents' vectors as rows, so that each document's maximum is an elementwise maximum of consecutive rows.
Its scores differ from the exact ones by at most :func:`screening_error` of each query, so a document whose screened
score falls short of the current ``k``-th exact score by more than that cannot enter the top ``k`` and is skipped;
the others get float64 scores (rounded to float32), so that a query's ranking and scores are the exact ones, whatever
the queries batched with it.
"""
import functools
import time
from typing import List, Optional

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.index.maxsim import aligned, document_blocks

with requires('dense'):
    import torch

#: Unit roundoff of the formats the screening may multiply in.
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}
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
    allows), the ``dim`` products summed in float32 in any order (error at most ``gamma_dim``), and the sum rounded
    to ``dtype``: ``(1 + u_in)^2 (1 + gamma_dim) (1 + u_out) - 1``, with Cauchy-Schwarz bounding the sum of the
    products' magnitudes by ``|q| * |d|``.
    """
    u32 = UNIT_ROUNDOFF[torch.float32]
    gamma = dim * u32 / (1 - dim * u32)
    u_out = UNIT_ROUNDOFF[dtype]
    precision = torch.get_float32_matmul_precision()
    u_in = u_out if dtype != torch.float32 else FLOAT32_INPUT_ROUNDOFF.get(precision, 2.0 ** -8)
    return (1 + u_in) ** 2 * (1 + gamma) * (1 + u_out) - 1


def screening_error(query: np.ndarray, max_norm: float, dtype: 'torch.dtype', aggregate: str) -> float:
    """The most a query's screened MaxSim score can differ from its exact one, against documents whose vectors have
    norms of at most ``max_norm``: each vector's maximum is off by at most :func:`similarity_error` times the
    norms, and the float32 sum of the maxima (and the mean's division) adds ``gamma_Q`` and a rounding."""
    u32 = UNIT_ROUNDOFF[torch.float32]
    count = len(query)
    norms = np.linalg.norm(query.astype(np.float64), axis=1)
    bound = (1 + similarity_error(dtype, query.shape[1])) * (1 + count * u32 / (1 - count * u32)) * (1 + u32) ** 2 - 1
    total = bound * max_norm * float(norms.sum())
    return total / count if aggregate == 'mean' else total


def max_vector_norm(vectors, chunk: int = 1 << 16) -> float:
    """The largest Euclidean norm of stored vectors (computed in float64, a chunk of rows at a time)."""
    best = 0.0
    for start in range(0, len(vectors), chunk):
        block = np.asarray(vectors[start:start + chunk], dtype=np.float64)
        best = max(best, float(np.sqrt((block * block).sum(axis=1).max(initial=0.0))))
    return best


class ScreenedBatch:
    """A batch of queries' running exact top ``k``, fed the blocks of an index's documents in order."""

    def __init__(self, queries: List[np.ndarray], *, k: int, aggregate: str, max_norm: float, device: str,
                 dtype: 'torch.dtype'):
        self.k, self.aggregate, self.device, self.dtype = k, aggregate, device, dtype
        lengths = np.array([len(q) for q in queries])
        stacked = np.concatenate(queries)
        self.vector_count = len(stacked)
        self.screen_vectors = aligned(stacked).to(device).to(dtype)  # (query vectors, dim)
        weights = np.zeros((len(stacked), len(queries)), dtype=np.float32)  # each query's sum (or mean) of maxima
        weights[np.arange(len(stacked)), np.repeat(np.arange(len(queries)), lengths)] = \
            1 / np.repeat(lengths, lengths) if aggregate == 'mean' else 1
        self.weights = torch.from_numpy(weights).to(device)
        padded = np.zeros((len(queries), lengths.max(), stacked.shape[1]))  # zero rows: a max of 0, adding nothing
        padded[np.repeat(np.arange(len(queries)), lengths), np.arange(len(stacked)) -
               np.repeat(np.cumsum(lengths) - lengths, lengths)] = stacked
        self.exact_vectors = torch.from_numpy(padded).to(device)
        self.lengths = torch.from_numpy(lengths).to(device)
        self.error = torch.tensor([screening_error(q, max_norm, dtype, aggregate) for q in queries],
                                  dtype=torch.float64, device=device)
        self.best_scores = torch.empty((len(queries), 0), device=device)
        self.best_docids = torch.empty((len(queries), 0), dtype=torch.long, device=device)

    def screen(self, block, block_offsets: np.ndarray, tile_vectors: int):
        """Screened ``(queries, documents)`` scores of a block of documents (``block``: their vectors in the stored
        dtype, ``block_offsets``: where each starts, from 0), scored a tile of about ``tile_vectors`` vectors at a
        time."""
        parts = [self.tile_scores(block[block_offsets[a]:block_offsets[b]].to(self.dtype),
                                  np.diff(block_offsets[a:b + 1]))
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
        return maxima.float() @ self.weights

    def add(self, screened, block, block_offsets: np.ndarray, first: int, check=None, first_query: int = 0) -> None:
        """Merges the documents ``first, first + 1, ...`` of a block (after all those already added) into each
        query's top ``k``: exact scores for those whose screened score leaves them a chance, as :mod:`this module
        <pyterrier_multiquery.index.exact>` says.

        Args:
            screened: Their screened scores (:meth:`screen`).
            block: Their vectors.
            block_offsets: Where each document's vectors start in ``block``, from 0, and where the last ends.
            first: The docid of the block's first document.
            check: Given the exact scores of the documents scored, as ``check(scores, docids, first_query)``.
            first_query: The position of the batch's first query, for ``check``.
        """
        count, docs = screened.shape
        error = self.error
        kth = self.best_scores[:, self.k - 1].double() if self.best_scores.shape[1] >= self.k else \
            torch.full((count,), -torch.inf, dtype=torch.float64, device=self.device)
        # a document above the exact k-th score by less than the error may still be below it: skipped where the
        # screened score plus the error stays under it, or under the block's own k-th screened score less the error
        # (k documents of the block score above that); a float32 ulp of slack for the rounding of the exact scores
        floor = kth - error
        if docs >= self.k:
            floor = torch.maximum(floor, screened.topk(self.k, dim=1).values[:, -1].double() - 2 * error)
        floor = floor - 2.0 ** -21 * floor.abs()
        rows, columns = torch.nonzero(screened.double() >= floor[:, None], as_tuple=True)
        if len(rows) == 0:
            return
        exact = self._exact(rows, columns, block, block_offsets)
        if check is not None and not bool(torch.isfinite(exact).all()):
            full = torch.zeros((count, docs), device=self.device)
            full[rows, columns] = exact
            check(full, np.arange(first, first + docs), first_query)
        width = int(torch.bincount(rows, minlength=count).max())
        position = torch.arange(len(rows), device=self.device) - \
            (torch.cumsum(torch.bincount(rows, minlength=count), 0) - torch.bincount(rows, minlength=count))[rows]
        scores = torch.full((count, width), -torch.inf, device=self.device)
        docids = torch.full((count, width), -1, dtype=torch.long, device=self.device)
        scores[rows, position] = exact
        docids[rows, position] = columns + first
        merged, order = torch.cat([self.best_scores, scores], dim=1).sort(dim=1, descending=True, stable=True)
        self.best_scores = merged[:, :self.k]
        self.best_docids = torch.cat([self.best_docids, docids], dim=1).gather(1, order[:, :self.k])

    def _exact(self, rows, columns, block, block_offsets: np.ndarray):
        """float64 MaxSim, rounded to float32, of the (query row, block document) pairs, in chunks of pairs whose
        gathered vectors take at most 64 MiB; each document's rows padded to the widest by its last row (a repeat
        leaves the maximum as it is)."""
        lengths = np.diff(block_offsets)
        columns_np = columns.cpu().numpy()
        widest = int(lengths[columns_np].max())
        dim, most = block.shape[1], self.exact_vectors.shape[1]
        step = max(1, (64 << 20) // (8 * (widest * dim + most * dim + most * widest)))
        out = []
        for start in range(0, len(rows), step):
            docs = columns_np[start:start + step]
            vector_rows = np.minimum(block_offsets[docs][:, None] + np.arange(widest),
                                     block_offsets[docs + 1][:, None] - 1)
            vectors = block[torch.from_numpy(vector_rows.reshape(-1)).to(block.device)].double()
            vectors = vectors.view(len(docs), widest, dim)
            pair_rows = rows[start:start + step]
            sims = torch.bmm(self.exact_vectors[pair_rows], vectors.transpose(1, 2))  # (pairs, query vectors, widest)
            scores = sims.amax(dim=2).sum(dim=1)
            if self.aggregate == 'mean':
                scores = scores / self.lengths[pair_rows]
            out.append(scores.float())
        return torch.cat(out)

    def top(self):
        """Each query's top ``k`` so far, ``(scores, docids)`` as arrays, by score, ties by docid."""
        return self.best_scores.cpu().numpy(), self.best_docids.cpu().numpy()


def exact_top(queries: List[np.ndarray], vectors, offsets: np.ndarray, *, num_results: int, aggregate: str,
              batch_size: int, block_vectors: int, tile_bytes: int, device: str, max_norm: Optional[float] = None,
              label: Optional[str] = None, check=None):
    """Each query's top documents of an index (or one shard) by exact MaxSim over all its documents.

    The stored vectors are read in blocks of about ``block_vectors`` (each block once, for all the queries),
    screened in tiles of about ``tile_bytes`` and merged into each batch's running top (:class:`ScreenedBatch`);
    ``check`` is given the exact scores computed.

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
    itemsize = torch.empty(0, dtype=dtype).element_size()
    tile_vectors = [max(1, tile_bytes // (itemsize * (batch.vector_count + vectors.shape[1]))) for batch in batches]
    blocks = document_blocks(offsets, block_vectors)
    if label is not None:
        blocks = pt.tqdm(blocks, desc=label, unit='block')
    for first, last in blocks:
        block_offsets = offsets[first:last + 1] - offsets[first]
        block = aligned(vectors[offsets[first]:offsets[last]]).to(device)  # the stored dtype
        for i, batch in enumerate(batches):
            screened = batch.screen(block, block_offsets, tile_vectors[i])
            if check is not None and not bool(torch.isfinite(screened).all()):
                check(screened, np.arange(first, last), i * batch_size)
            batch.add(screened, block, block_offsets, first, check, i * batch_size)
    return [batch.top() for batch in batches]

