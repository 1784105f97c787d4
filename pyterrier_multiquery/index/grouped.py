"""Exact MaxSim search shaped for a GPU: documents grouped by length, their vectors kept in 16 bits on the device,
and each document's maxima taken in the kernel that multiplies (:mod:`.maxsim_kernel`), so that the similarity
matrix never reaches device memory.

Each document is padded to the next power of two of vectors with copies of its last vector (a copy leaves its
maxima as they are), so that the documents of one length form a ``(documents, length, dim)`` tensor and a
document's maximum is a reduction over one axis, not a scatter. The groups are cut into chunks; the chunks stay on
the device while a memory budget allows (by default half of what is free there), the others in host memory
(pinned where CUDA is), copied to the device one at a time during each search: a collection larger than the card
is streamed, not refused.

The 16 bits are float16 where every stored vector's norm is below :data:`FLOAT16_LIMIT` (:func:`group_dtype`), else
bfloat16: the tensor cores multiply both at the same speed, and float16 keeps three more bits (unit roundoff 2^-11
against 2^-8), so that its bound is several times tighter and fewer documents are left to score in float64; an index
stored in float16 is then held exactly, and only the queries are rounded. Queries are scaled by a power of two to
the top of float16's range, and their weights by its inverse, so that the scores come out unscaled.

The screening's bound (:func:`grouped_similarity_error`) holds for those inputs, float32 accumulation in any order
with a unit roundoff of 2^-20 per addition (16 times float32's: tensor cores truncate their sums and align the
summands of a step to one exponent, which costs a few bits, not four), and, on the torch path, the rounding of the
bfloat16 product it returns (it multiplies float16 in float32, whose products are exact); values rounded below
float16's normal range add an absolute term (:func:`~.exact.underflow_error`). The documents the bound cannot rule
out are scored in float64 (:func:`~.exact.scored_candidates`), so that rankings and scores are those of the CPU.
"""
import functools
import warnings
from typing import Iterator, List, NamedTuple, Optional, Tuple

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.index.exact import UNDERFLOW, UNIT_ROUNDOFF, ScreenedBatch, product_error, scored_candidates
from pyterrier_multiquery.index.maxsim import padded_queries

with requires('dense'):
    import torch

#: Stored vectors whose norms are all below this are grouped in float16 (its largest value is 65,504), others in
#: bfloat16.
FLOAT16_LIMIT = 2.0 ** 15
#: The unit roundoff granted to each addition of the products' float32 sums (see the module's docstring).
ACCUMULATION_ROUNDOFF = 2.0 ** -20
#: Stored vectors (padding included) in one chunk of a group.
CHUNK_VECTORS = 1 << 21
#: Screened scores (bytes) gathered from consecutive chunks before the running top k takes them in one step: the
#: small chunks of ragged or small collections each cost that step's kernels and synchronisations otherwise.
MERGE_BYTES = 64 << 20


def group_dtype(max_norm: float) -> 'torch.dtype':
    """The format of the grouped vectors, and of the screening's inputs, for stored vectors of norms at most
    ``max_norm``: float16 below :data:`FLOAT16_LIMIT`, else bfloat16."""
    return torch.float16 if max_norm < FLOAT16_LIMIT else torch.bfloat16


def padded_lengths(lengths: np.ndarray) -> np.ndarray:
    """The power of two at or above each document's number of vectors."""
    return np.left_shift(1, np.ceil(np.log2(lengths)).astype(np.int64))


class GroupChunk(NamedTuple):
    """Documents of one padded length: their docids (ascending, on the search device) and ``(documents, length,
    dim)`` vectors, on the search device where ``resident``, else in host memory."""
    docids: 'torch.Tensor'
    vectors: 'torch.Tensor'
    resident: bool


class LengthGroups:
    """An index's (or shard's) documents grouped by padded length in 16 bits, as far as a memory budget allows on
    the search device and in host memory beyond it (:meth:`chunks` streams those)."""

    def __init__(self, chunks: List[GroupChunk], device: str, dtype: 'torch.dtype', exact: bool):
        self.device = device
        self.chunk_list = chunks
        #: The vectors' format, and whether it holds the stored values exactly (a float16 index in float16).
        self.dtype, self.exact = dtype, exact
        #: Bytes of the vectors kept on the device, and of those in host memory, streamed at each search.
        self.resident_bytes = sum(chunk.vectors.nbytes for chunk in chunks if chunk.resident)
        self.streamed_bytes = sum(chunk.vectors.nbytes for chunk in chunks if not chunk.resident)
        #: Chunks copied to the device by the searches so far.
        self.copies = 0

    @classmethod
    def build(cls, vectors, offsets: np.ndarray, device: str, *, dtype: 'torch.dtype' = torch.bfloat16,
              budget_bytes: Optional[int] = None, chunk_vectors: int = CHUNK_VECTORS,
              verbose: bool = False) -> 'LengthGroups':
        """Groups the documents of stored ``vectors`` (a memory map: read a chunk at a time) whose rows
        ``offsets[i]:offsets[i + 1]`` belong to document ``i``.

        Args:
            device: The search device.
            dtype: The vectors' format: :func:`group_dtype` of their largest norm.
            budget_bytes: Device memory the grouped vectors may take (default: half of the free memory of a GPU;
                no limit on the CPU); the chunks beyond it stay in host memory.
            chunk_vectors: Padded vectors per chunk.
            verbose: Whether to show a progress bar.
        """
        if budget_bytes is None:
            budget_bytes = torch.cuda.mem_get_info(torch.device(device))[0] // 2 if device.startswith('cuda') \
                else np.iinfo(np.int64).max
        lengths = np.diff(offsets)
        padded = padded_lengths(lengths)
        pieces = []
        for length in np.unique(padded):
            docids = np.flatnonzero(padded == length)
            step = max(1, chunk_vectors // int(length))
            pieces += [(int(length), docids[start:start + step]) for start in range(0, len(docids), step)]
        if verbose:
            pieces = pt.tqdm(pieces, desc='grouping documents by length', unit='chunk')
        chunks, used = [], 0
        for length, docids in pieces:
            block = _padded_block(vectors, offsets, lengths, docids, length, dtype)
            resident = used + block.nbytes <= budget_bytes
            if resident:
                used += block.nbytes
                block = block.to(device)
            elif device.startswith('cuda'):
                block = block.pin_memory()
            chunks.append(GroupChunk(torch.from_numpy(docids).to(device), block, resident))
        return cls(chunks, device, dtype, exact=dtype == torch.float16 and vectors.dtype == np.float16)

    def chunks(self) -> Iterator[GroupChunk]:
        """Every chunk, its vectors on the search device (copied there from host memory where they are kept)."""
        for chunk in self.chunk_list:
            if chunk.resident:
                yield chunk
            else:
                self.copies += 1
                yield GroupChunk(chunk.docids, chunk.vectors.to(self.device, non_blocking=True), True)

    def __len__(self):
        return len(self.chunk_list)


def _padded_block(vectors, offsets: np.ndarray, lengths: np.ndarray, docids: np.ndarray, length: int,
                  dtype: 'torch.dtype') -> 'torch.Tensor':
    """The ``(documents, length, dim)`` vectors of ``docids`` in ``dtype``, each padded with copies of its last
    vector."""
    first, last = offsets[docids[0]], offsets[docids[-1] + 1]
    if (lengths[docids] == length).all() and last - first == len(docids) * length:  # consecutive, unpadded
        rows = np.asarray(vectors[first:last])
    else:
        index = np.minimum(offsets[docids][:, None] + np.arange(length), offsets[docids + 1][:, None] - 1)
        rows = np.asarray(vectors[index.reshape(-1)])
    with warnings.catch_warnings():  # a read-only memory map: only read here, by the conversion
        warnings.filterwarnings('ignore', message='The given NumPy array is not writable')
        return torch.from_numpy(np.ascontiguousarray(rows)).to(dtype).view(len(docids), length, -1)


def grouped_similarity_error(dim: int, backend: str, dtype: 'torch.dtype' = torch.bfloat16,
                             exact_documents: bool = False) -> float:
    """The bound of a screened inner product of ``dim`` terms (:func:`~.exact.product_error`): inputs in ``dtype``
    (the documents' held exactly where ``exact_documents``), float32 sums with :data:`ACCUMULATION_ROUNDOFF`, and
    the torch backend's bfloat16 result."""
    u16 = UNIT_ROUNDOFF[dtype]
    output = u16 if backend == 'torch' and dtype == torch.bfloat16 else 0.0
    return product_error(dim, u16, output, ACCUMULATION_ROUNDOFF, 0.0 if exact_documents else u16)


@functools.lru_cache(maxsize=None)
def screening_backend(device: str) -> str:
    """``triton`` (the fused kernel) on a GPU where Triton is installed, else ``torch``."""
    if not device.startswith('cuda'):
        return 'torch'
    try:
        import triton  # noqa: F401
    except ModuleNotFoundError:
        return 'torch'
    return 'triton'


def padded_query_tensors(queries: List[np.ndarray], aggregate: str, device: str,
                         dtype: 'torch.dtype' = torch.bfloat16) -> Tuple['torch.Tensor', 'torch.Tensor', float]:
    """Queries as ``(queries, power of two, dim)`` vectors in ``dtype`` padded with zero vectors, the float32 weight
    of each vector's maximum (1, or 1 / the query's length for the mean; 0 for padding), and the power of two the
    vectors were scaled by for float16 (the weights carry its inverse; 1 for bfloat16)."""
    padded, lengths = padded_queries(queries)
    width = int(padded_lengths(lengths.max(keepdims=True))[0])
    padded = np.pad(padded, ((0, 0), (0, width - padded.shape[1]), (0, 0)))
    weights = np.where(np.arange(width) < lengths[:, None], 1 / lengths[:, None] if aggregate == 'mean' else 1.0,
                       0.0).astype(np.float32)
    largest = float(np.abs(padded).max(initial=0.0))  # float16: to (2^13, 2^14], in range and above its subnormals
    scale = 2.0 ** (14 - int(np.ceil(np.log2(largest)))) if dtype == torch.float16 and largest > 0 else 1.0
    return (torch.from_numpy(padded * np.float32(scale)).to(device).to(dtype),
            torch.from_numpy(weights / np.float32(scale)).to(device), scale)


def screen(docs: 'torch.Tensor', queries: 'torch.Tensor', weights: 'torch.Tensor', backend: str,
           tile_bytes: int) -> 'torch.Tensor':
    """``(queries, documents)`` float32 screened scores of a chunk's documents (:func:`padded_query_tensors`'s
    queries and weights), by the fused kernel or by torch, a tile of at most about ``tile_bytes`` at a time."""
    if backend == 'triton':
        from pyterrier_multiquery.index.maxsim_kernel import fused_maxsim
        return fused_maxsim(docs, queries, weights)
    count, length, dim = docs.shape
    columns = queries.shape[0] * queries.shape[1]
    step = max(1, tile_bytes // (2 * length * columns))
    widen = docs.dtype == torch.float16  # in float32, whose products of float16 numbers are exact: no overflow
    flat_queries = queries.reshape(columns, dim).float() if widen else queries.reshape(columns, dim)
    parts = []
    previous = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # float32 sums, as the bound has
    try:
        for start in range(0, count, step):
            tile = docs[start:start + step]
            rows = tile.reshape(-1, dim).float() if widen else tile.reshape(-1, dim)
            sims = rows @ flat_queries.T  # (tile vectors, query vectors), in bfloat16 or float32
            maxima = sims.view(len(tile), length, columns).amax(dim=1).float()
            parts.append((maxima.view(len(tile), *weights.shape) * weights).sum(dim=2))
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = previous
    return torch.cat(parts).T


def grouped_exact_top(queries: List[np.ndarray], groups: LengthGroups, vectors, offsets: np.ndarray, *,
                      num_results: int, aggregate: str, batch_size: int, tile_bytes: int, device: str,
                      max_norm: float, backend: Optional[str] = None, label: Optional[str] = None, check=None,
                      merge_bytes: int = MERGE_BYTES):
    """Each query's top documents by exact MaxSim, as :func:`~.exact.exact_top`, screening the documents' grouped
    vectors (every query against a chunk in one call, their running top ``k`` and survivors kept together) before
    scoring the survivors from the stored ``vectors`` (in steps of ``tile_bytes``).

    Args:
        batch_size: The queries of each ``(scores, docids)`` returned.
        backend: ``triton`` or ``torch`` (default: :func:`screening_backend` of the device).
        merge_bytes: The screened scores of consecutive chunks are taken into the running top ``k`` together up to
            this size (a larger chunk alone).
    """
    backend = backend or screening_backend(device)
    similarity = grouped_similarity_error(vectors.shape[1], backend, groups.dtype, groups.exact)
    padded, weights, scale = padded_query_tensors(queries, aggregate, device, groups.dtype)
    batch = ScreenedBatch(queries, k=num_results, aggregate=aggregate, max_norm=max_norm, device=device,
                          dtype=groups.dtype, similarity=similarity, underflow=UNDERFLOW[groups.dtype] / scale)
    chunks = groups.chunks()
    if label is not None:
        chunks = pt.tqdm(chunks, total=len(groups), desc=label, unit='chunk')
    pending = []  # (screened scores, docids) of chunks not yet taken in

    def take_in():
        scores, docids = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1) for parts in zip(*pending))
        pending.clear()
        unknown = batch.add(scores, docids)
        if check is not None and unknown is not None:  # a damaged document, or an overflow
            check.stored_vectors(np.unique(docids[torch.nonzero(unknown)[:, 1]].cpu().numpy()))

    for docids, docs, _ in chunks:
        screened = screen(docs, padded, weights, backend, tile_bytes)
        if pending and sum(scores.nbytes for scores, _ in pending) + screened.nbytes > merge_bytes:
            take_in()
        pending.append((screened, docids))
    if pending:
        take_in()
    (scores, docids), = scored_candidates([batch], queries, len(queries), vectors, offsets, num_results=num_results,
                                          aggregate=aggregate, tile_bytes=tile_bytes, device=device, check=check)
    return [(scores[start:start + batch_size], docids[start:start + batch_size])
            for start in range(0, len(queries), batch_size)]
