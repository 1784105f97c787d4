"""A Triton kernel for the screening of exact MaxSim search on a GPU: the products of documents' and queries'
vectors on the tensor cores (float16 or bfloat16 inputs, float32 accumulation), each document's maxima and each
query's weighted sum of them in registers, so that only the ``(queries, documents)`` scores reach device memory.

Documents come as a ``(documents, length, dim)`` tensor of one length, a power of two (:mod:`.grouped` pads them);
queries as a ``(queries, query_length, dim)`` tensor padded with zero vectors, whose weights are 0. With
``TRITON_INTERPRET=1`` set before this module is imported, Triton's interpreter runs the same kernel on CPU
tensors: the tests run it so.
"""
import functools
import os
from typing import Dict, NamedTuple, Tuple

from pyterrier_multiquery._extras import requires

with requires('gpu'):
    import triton
    import triton.language as tl

with requires('dense'):
    import torch


@triton.jit
def _maxsim_kernel(docs, queries, weights, out, doc_count, query_count,
                   DIM: tl.constexpr, LENGTH: tl.constexpr, SUB_LENGTH: tl.constexpr, QUERY_LENGTH: tl.constexpr,
                   BLOCK_DOCS: tl.constexpr, BLOCK_QUERIES: tl.constexpr, BLOCK_K: tl.constexpr,
                   WIDEN: tl.constexpr):
    """``out[q, d] = sum_i weights[q, i] * max_j <docs[d, j], queries[q, i]>`` for a tile of ``BLOCK_DOCS``
    documents and ``BLOCK_QUERIES`` queries; consecutive programs take the query tiles of one document tile, whose
    vectors they then read from the L2 cache. ``WIDEN`` multiplies the 16-bit inputs in float32, as the interpreter
    must (its bfloat16 products are wrong); the products of 16-bit numbers are exact in float32, so the sums are
    those of a GPU's tensor cores but for the order of the additions."""
    columns: tl.constexpr = BLOCK_QUERIES * QUERY_LENGTH
    rows: tl.constexpr = BLOCK_DOCS * SUB_LENGTH
    query_tiles = tl.cdiv(query_count, BLOCK_QUERIES)
    pid = tl.program_id(0)
    doc = (pid // query_tiles).to(tl.int64) * BLOCK_DOCS + tl.arange(0, BLOCK_DOCS)
    query = (pid % query_tiles) * BLOCK_QUERIES + tl.arange(0, BLOCK_QUERIES)
    column = (pid % query_tiles) * columns + tl.arange(0, columns)  # query vectors, a query's rows one after another
    column_ok = column < query_count * QUERY_LENGTH
    best = tl.full((BLOCK_DOCS, columns), float('-inf'), tl.float32)
    for part in tl.static_range(0, LENGTH, SUB_LENGTH):  # a long document's rows a sub-tile at a time
        row = tl.reshape(doc[:, None] * LENGTH + part + tl.arange(0, SUB_LENGTH)[None, :], (rows,))
        row_ok = tl.reshape(tl.broadcast_to(doc[:, None] < doc_count, (BLOCK_DOCS, SUB_LENGTH)), (rows,))
        products = tl.zeros((rows, columns), tl.float32)
        for start in tl.static_range(0, DIM, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            k_ok = k < DIM
            a = tl.load(docs + row[:, None] * DIM + k[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(queries + column[None, :].to(tl.int64) * DIM + k[:, None],
                        mask=column_ok[None, :] & k_ok[:, None], other=0.0)
            if WIDEN:
                a, b = a.to(tl.float32), b.to(tl.float32)
            products = tl.dot(a, b, products)
        best = tl.maximum(best, tl.max(tl.reshape(products, (BLOCK_DOCS, SUB_LENGTH, columns)), axis=1))
    weight = tl.load(weights + column, mask=column_ok, other=0.0)
    scores = tl.sum(tl.reshape(best * weight[None, :], (BLOCK_DOCS, BLOCK_QUERIES, QUERY_LENGTH)), axis=2)
    tl.store(out + query[None, :].to(tl.int64) * doc_count + doc[:, None], scores,
             mask=(doc[:, None] < doc_count) & (query[None, :] < query_count))


class KernelConfig(NamedTuple):
    """A launch shape of the kernel: stored vectors and query vectors per tile, Triton's warps and pipeline stages."""
    rows: int
    columns: int
    num_warps: int
    num_stages: int


#: The shapes timed on a GPU (:func:`tuned_config`); the first is the one the interpreter runs.
CONFIGS = (KernelConfig(64, 64, 4, 2), KernelConfig(128, 64, 4, 3), KernelConfig(128, 128, 8, 3),
           KernelConfig(256, 64, 8, 3))


def interpreted() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``) rather than compiling for a GPU."""
    return os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')


def launch(docs: 'torch.Tensor', queries: 'torch.Tensor', weights: 'torch.Tensor', config: KernelConfig,
           out: 'torch.Tensor' = None) -> 'torch.Tensor':
    """Runs the kernel with one launch shape; returns the ``(queries, documents)`` float32 scores."""
    doc_count, length, dim = docs.shape
    query_count, query_length, _ = queries.shape
    sub_length = min(length, config.rows)
    block_docs = max(1, config.rows // sub_length)
    block_queries = max(1, config.columns // query_length)
    block_k = next(size for size in (64, 32, 16) if dim % size == 0 or size == 16)
    if out is None:
        out = torch.empty((query_count, doc_count), dtype=torch.float32, device=docs.device)
    grid = (triton.cdiv(doc_count, block_docs) * triton.cdiv(query_count, block_queries),)
    _maxsim_kernel[grid](docs, queries, weights, out, doc_count, query_count, DIM=dim, LENGTH=length,
                         SUB_LENGTH=sub_length, QUERY_LENGTH=query_length, BLOCK_DOCS=block_docs,
                         BLOCK_QUERIES=block_queries, BLOCK_K=block_k, WIDEN=interpreted(), num_warps=config.num_warps,
                         num_stages=config.num_stages)
    return out


_TUNED: Dict[Tuple, KernelConfig] = {}


def tuned_config(docs: 'torch.Tensor', queries: 'torch.Tensor', weights: 'torch.Tensor') -> KernelConfig:
    """The fastest of :data:`CONFIGS` for this shape of work (documents' length, queries' length, dimension, GPU),
    timed once per process on the first such call (the interpreter: the first config)."""
    if interpreted() or docs.device.type != 'cuda':
        return CONFIGS[0]
    key = (docs.shape[1], queries.shape[1], docs.shape[2], torch.cuda.get_device_name(docs.device))
    if key not in _TUNED:
        with requires('gpu'):
            from triton.testing import do_bench
        out = torch.empty((len(queries), len(docs)), dtype=torch.float32, device=docs.device)
        _TUNED[key] = min(CONFIGS, key=lambda config: do_bench(
            functools.partial(launch, docs, queries, weights, config, out), warmup=5, rep=20))
    return _TUNED[key]


def fused_maxsim(docs: 'torch.Tensor', queries: 'torch.Tensor', weights: 'torch.Tensor') -> 'torch.Tensor':
    """Screened scores of documents of one length against padded queries.

    Args:
        docs: ``(documents, length, dim)`` float16 or bfloat16 vectors, ``length`` a power of two.
        queries: ``(queries, query_length, dim)`` vectors of the same format, ``query_length`` a power of two.
        weights: ``(queries, query_length)`` float32 weights of each query vector's maximum (0 for padding).

    Returns:
        ``(queries, documents)`` float32 scores.
    """
    docs, queries, weights = docs.contiguous(), queries.contiguous(), weights.contiguous()
    return launch(docs, queries, weights, tuned_config(docs, queries, weights))
