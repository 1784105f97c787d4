"""Late-interaction (MaxSim) retrieval and re-scoring over a MultiVectorIndex, in torch on the CPU or a GPU."""
from typing import List, Optional, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._device import check_threads, cpu_threads, resolve_device
from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.index.errors import retried_if_replaced
from pyterrier_multiquery._transformer import DerivedIdentity, NumResultsCutoff, check_positive, validate_frame
from pyterrier_multiquery.index.checks import ScoreCheck

with requires('dense'):
    import torch

AGGREGATES = ('mean', 'sum')
#: Stored vectors read from disk together by the exact search, by default.
BLOCK_VECTORS = 65536


def maxsim_scores(query, doc_vectors, doc_lengths, aggregate: str):
    """MaxSim of one or more queries against consecutive documents, as torch tensors.

    Args:
        query: ``(Q, d)`` query vectors, or a list of them for a batch.
        doc_vectors: ``(V, d)`` stored vectors of the documents, one document after another.
        doc_lengths: ``(D,)`` number of vectors of each document (summing to ``V``).
        aggregate: ``mean`` or ``sum`` over each query's vectors.

    Returns:
        ``(batch, D)`` float32 scores, computed in float64: a float32 product's sums are rounded in an order that
        depends on the product's shape, so that a query's scores would depend on the queries batched with it.
    """
    queries = query if isinstance(query, list) else [query]
    stacked = torch.cat(queries).double()
    sims = doc_vectors.double() @ stacked.T  # documents as rows: a document's maximum is over consecutive rows
    doc_count = len(doc_lengths)
    if doc_count and bool((doc_lengths == doc_lengths[0]).all()):  # equal lengths: a plain reshape
        per_doc = sims.view(doc_count, -1, len(stacked)).amax(dim=1).T
    else:
        doc_of_vector = torch.repeat_interleave(torch.arange(doc_count, device=sims.device), doc_lengths)
        per_doc = torch.full((doc_count, len(stacked)), -torch.inf, device=sims.device, dtype=sims.dtype)
        per_doc = per_doc.scatter_reduce_(0, doc_of_vector[:, None].expand(-1, len(stacked)), sims, reduce='amax').T
    query_lengths = torch.tensor([len(q) for q in queries], device=sims.device)
    query_of_row = torch.repeat_interleave(torch.arange(len(queries), device=sims.device), query_lengths)
    scores = torch.zeros((len(queries), doc_count), device=sims.device, dtype=sims.dtype)
    scores.index_add_(0, query_of_row, per_doc)
    return (scores / query_lengths[:, None] if aggregate == 'mean' else scores).float()


class MaxSimSearch(DerivedIdentity, NumResultsCutoff, pt.Transformer):
    """What the MaxSim searches share: the frame in and out, the device and threads, and exact search (which the
    approximate search falls back to). A search kind is a subclass with its own arguments (:class:`MaxSimRetriever`,
    :class:`~.ann_retriever.ApproxMaxSimRetriever`) that implements :meth:`search`."""
    #: Stored vectors read from disk together by the exact search (the approximate search's fallback uses the
    #: default).
    block_vectors = BLOCK_VECTORS
    #: Whether the search runs FAISS (whose threads follow ``threads`` too).
    uses_faiss = False

    def __init__(self, index, *, num_results: int, aggregate: str, device: Optional[str], batch_size: int,
                 tile_bytes: Optional[int], threads: Optional[int], drop_query_embs: bool, verbose: bool):
        if aggregate not in AGGREGATES:
            raise ValueError(f'aggregate must be one of {AGGREGATES}, got {aggregate!r}')
        check_positive(num_results=num_results, batch_size=batch_size, tile_bytes=tile_bytes)
        self.index = index
        self.num_results = num_results
        self.aggregate = aggregate
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.tile_bytes = tile_bytes or ((256 if self.device.startswith('cuda') else 4) << 20)
        self.threads = check_threads(threads)
        self.drop_query_embs = drop_query_embs
        self.verbose = verbose

    @retried_if_replaced
    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Retrieves for each query row (``qid``, ``query_embs``)."""
        validate_frame(self, inp, 'query', ['query_embs'])
        check_unique_qids(inp)
        shards = self.index.searchers()
        queries = query_matrices(inp, shards.meta['dim'])
        columns = [c for c in inp.columns if not (self.drop_query_embs and c == 'query_embs')]
        results = []
        if queries:
            with cpu_threads(self.threads, with_faiss=self.uses_faiss):
                results = self.search(queries, shards, inp['qid'].tolist())
        return result_frame(inp[columns], results, shards.docnos)

    def search(self, queries, shards, qids: list) -> List[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Each batch's ``(scores, docids, counts)`` over all shards."""
        raise NotImplementedError

    def _search_exact(self, queries, shards, qids: list) -> List[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Every shard's top documents for each batch of queries, merged batch by batch."""
        per_shard = shards.map('exact', queries, qids=qids, num_results=self.num_results, aggregate=self.aggregate,
                               batch_size=self.batch_size, block_vectors=self.block_vectors, tile_bytes=self.tile_bytes,
                               device=self.device, label=repr(self) if self.verbose else None)
        return [merge_top(parts, self.num_results) for parts in zip(*per_shard)]


class MaxSimRetriever(MaxSimSearch):
    """Retrieves each query's top ``num_results`` documents by ColBERT-style MaxSim over every document: exact search.

    ``score(q, d) = agg_i max_j <q_i, d_j>`` over the query's vectors ``q_i`` (``query_embs``) and the document's
    stored vectors ``d_j``, ``agg`` being the mean (default) or the sum. The stored vectors are read in blocks of about
    ``block_vectors`` (each block once, for all queries) and screened in tiles of about ``tile_bytes`` in a low
    precision whose error is bounded, then the documents the bound cannot rule out are scored in float64, so that
    rankings and scores are the same on every device. On a GPU the documents are grouped by length and screened by a
    fused kernel (:mod:`.grouped`), kept on the device between searches. Ties are broken by the documents' order in
    the index. On the CPU, torch uses ``threads`` threads during a search. The approximate search is
    :class:`~.ann_retriever.ApproxMaxSimRetriever`.
    """
    schematic = {'label': 'MaxSim'}

    def __init__(self, index, *, num_results: int = 1000, aggregate: str = 'mean', device: Optional[str] = None,
                 batch_size: int = 64, block_vectors: int = BLOCK_VECTORS, tile_bytes: Optional[int] = None,
                 threads: Optional[int] = None, drop_query_embs: bool = False, verbose: bool = False):
        """
        Args:
            index: The :class:`MultiVectorIndex` (or :class:`ShardedMultiVectorIndex`) to search.
            num_results: Documents returned per query.
            aggregate: ``mean`` or ``sum`` over the query's vectors.
            device: torch device for scoring (default: CUDA if available, else CPU).
            batch_size: Queries scored together.
            block_vectors: Stored vectors read from disk together (the CPU's blockwise search).
            tile_bytes: Working memory of one scoring step (default: 4 MiB on the CPU, to stay in its caches;
                256 MiB on a GPU).
            threads: CPU threads of torch during a search (default: ``torch.get_num_threads()``); the count before
                is restored after it.
            drop_query_embs: Whether to drop ``query_embs`` from the output.
            verbose: Whether to show progress bars.
        """
        super().__init__(index, num_results=num_results, aggregate=aggregate, device=device, batch_size=batch_size,
                         tile_bytes=tile_bytes, threads=threads, drop_query_embs=drop_query_embs, verbose=verbose)
        check_positive(block_vectors=block_vectors)
        self.block_vectors = block_vectors

    def search(self, queries, shards, qids: list) -> List[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Exact search of every shard (:meth:`MaxSimSearch._search_exact`)."""
        return self._search_exact(queries, shards, qids)


class MaxSimScorer(DerivedIdentity, NumResultsCutoff, pt.Transformer):
    """Re-scores an existing result frame (``qid``, ``docno``, ``query_embs``) by exact MaxSim against the index.

    A query's vectors are read from its first row (a result frame repeats them on every row of the query).
    """
    schematic = {'label': 'MaxSim scorer'}

    def __init__(self, index, *, aggregate: str = 'mean', num_results: Optional[int] = None,
                 device: Optional[str] = None, threads: Optional[int] = None, verbose: bool = False):
        """
        Args:
            index: The :class:`MultiVectorIndex` (or :class:`ShardedMultiVectorIndex`) that holds the documents'
                vectors.
            aggregate: ``mean`` or ``sum`` over the query's vectors.
            num_results: Keep only this many re-scored documents per query (default: all).
            device: torch device for scoring.
            threads: CPU threads of torch while scoring (default: ``torch.get_num_threads()``), restored after.
            verbose: Whether to show a progress bar over queries.
        """
        if aggregate not in AGGREGATES:
            raise ValueError(f'aggregate must be one of {AGGREGATES}, got {aggregate!r}')
        check_positive(num_results=num_results)
        self.index = index
        self.aggregate = aggregate
        self.num_results = num_results
        self.device = resolve_device(device)
        self.threads = check_threads(threads)
        self.verbose = verbose

    @retried_if_replaced
    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Replaces ``score`` and ``rank`` with MaxSim's, per query."""
        validate_frame(self, inp, 'result', ['query_embs'])
        check_qid_types(inp['qid'])
        shards = self.index.searchers()
        if len(inp) == 0:
            return pt.model.add_ranks(inp.assign(score=pd.Series(dtype=float)))
        groups = list(inp.groupby('qid', sort=False).indices.items())
        queries, invalid = [], []
        for qid, rows in groups:  # an unknown docno is reported first, then a malformed query
            try:
                queries.append(query_embs(inp['query_embs'].iloc[rows[0]], shards.meta['dim'], qid))
            except ValueError as e:
                queries.append(None)
                invalid.append(e)
        docnos, strings = docno_array(inp['docno'])  # a docno that is not a string is not found: reported in order
        with cpu_threads(self.threads):
            per_shard = shards.map('score', queries, [docnos[rows[strings[rows]]] for _, rows in groups],
                                   qids=[qid for qid, _ in groups], aggregate=self.aggregate, device=self.device,
                                   label=repr(self) if self.verbose else None)
        scores, found = np.zeros(len(inp), dtype=np.float32), np.zeros(len(inp), dtype=bool)
        for part in per_shard:
            for (_, rows), (held, shard_scores) in zip(groups, part):
                scores[rows[strings[rows]][held]] = shard_scores
                found[rows[strings[rows]][held]] = True
        if not found.all():
            first = int(np.argmin(found))
            raise KeyError(f'docno {inp["docno"].tolist()[first]!r} is not in the index' +
                           ('' if strings[first] else ' (docnos are strings)'))
        if invalid:
            raise invalid[0]
        out = pt.model.add_ranks(inp.assign(score=scores))
        if self.num_results is not None:
            out = out[out['rank'] < self.num_results].reset_index(drop=True)
        return out


def score_documents(query, docids: np.ndarray, vectors, offsets: np.ndarray, aggregate: str) -> np.ndarray:
    """Exact MaxSim of one query (a ``(Q, d)`` tensor) against the given documents of an index's vectors."""
    lengths = offsets[docids + 1] - offsets[docids]
    rows = np.repeat(offsets[docids] - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    doc_vectors = stored_rows(vectors, rows, query.device).double()
    return maxsim_scores(query, doc_vectors, torch.from_numpy(lengths).to(query.device), aggregate)[0].cpu().numpy()


def rescore_candidates(queries: List[np.ndarray], batches, vectors, offsets: np.ndarray, *, num_results: int,
                       aggregate: str, tile_bytes: int, device: str, label: Optional[str] = None,
                       check: Optional[ScoreCheck] = None, dtype: 'torch.dtype' = torch.float32):
    """Exact MaxSim of queries against their candidate documents of an index (or one shard).

    Args:
        queries: The queries' vectors.
        batches: ``(start, stop, docids)``: the candidates of ``queries[start:stop]``, a row each, ascending, -1
            padded; scored for as many queries at once as ``tile_bytes`` allows, at least one, padded to the
            longest candidate; a query whose padding would take too much memory (:func:`padding_is_bounded`) alone,
            unpadded.
        check: Given the scores of each step.
        dtype: The products' format: float32, or float64 (scores rounded to float32 once summed, as
            :func:`maxsim_scores` gives them).

    Returns:
        For each batch, ``(scores, docids, counts)``: each query's top ``num_results`` candidates in a row, by score,
        ties by docid, of which the first ``counts`` are results (-inf and -1 beyond).
    """
    lengths = np.diff(offsets)
    if label is not None:
        batches = pt.tqdm(batches, desc=label, unit='batch')
    results = []
    for start, _, docids in batches:
        bounded = padding_is_bounded(docids, lengths, vectors.shape[1], tile_bytes)
        chunks = []
        for first, last in _runs(bounded):
            if not bounded[first]:  # one query, whose candidates padded to its longest would take too much memory
                chunks.append(_rescore_unpadded(queries[start + first], docids[first], vectors, offsets, num_results,
                                                aggregate, device, check, start + first))
                continue
            run = docids[first:last]
            per_query = dtype.itemsize * run.shape[1] * _widest(run, lengths) * vectors.shape[1]
            step = max(1, tile_bytes // max(1, per_query))  # as many queries as fit in a tile, at least one
            for a in range(first, last, step):
                chunk = docids[a:min(last, a + step)]
                chunk = chunk[:, :int((chunk >= 0).sum(axis=1).max())]
                chunks.append(_rescore(queries[start + a:start + a + len(chunk)], chunk, vectors, offsets, lengths,
                                       num_results, aggregate, device, check, start + a, dtype))
        width = max(scores.shape[1] for scores, _, _ in chunks)
        results.append(tuple(np.concatenate(parts) for parts in zip(*[
            (np.pad(scores, ((0, 0), (0, width - scores.shape[1])), constant_values=-np.inf),
             np.pad(ids, ((0, 0), (0, width - ids.shape[1])), constant_values=-1), found)
            for scores, ids, found in chunks])))
    return results


def _rescore_unpadded(query: np.ndarray, docids: np.ndarray, vectors, offsets, num_results: int, aggregate: str,
                      device: str, check: Optional[ScoreCheck], position: int) -> Tuple[np.ndarray, ...]:
    """Exact MaxSim of one query against its candidates (``docids``, ascending, -1 padded), their vectors one after
    another; returns its top (scores, docids, count) as :func:`_rescore` does for several queries."""
    docids = docids[docids >= 0]
    scores = score_documents(aligned(query).to(device), docids, vectors, offsets, aggregate)
    if check is not None:
        check(scores[None], docids, position)
    order = np.argsort(-scores, kind='stable')[:num_results]  # ties: ascending docid, as docids are
    return scores[None, order], docids[None, order], np.array([len(order)])


def _rescore(queries, docids: np.ndarray, vectors, offsets, lengths, num_results: int, aggregate: str,
             device: str, check: Optional[ScoreCheck], first_query: int,
             dtype: 'torch.dtype') -> Tuple[np.ndarray, ...]:
    """Exact MaxSim of queries against their candidates (``docids``, ascending, -1 padded) in one padded
    (queries x candidates x document vectors) product in ``dtype``; returns each query's top (float32 scores,
    docids, count)."""
    count, width = docids.shape
    found = np.minimum((docids >= 0).sum(axis=1), num_results)
    if width == 0:
        return np.zeros((count, 0), dtype=np.float32), docids, found
    valid = docids >= 0
    safe = np.where(valid, docids, 0)
    starts, ends = offsets[safe], offsets[safe] + lengths[safe]
    widest = _widest(docids, lengths)
    # each document's rows, its last row repeated up to the widest candidate (a repeat leaves the max as it is)
    rows = np.minimum(starts[:, :, None] + np.arange(widest), ends[:, :, None] - 1)
    doc_vectors = stored_rows(vectors, rows.reshape(-1), device).to(dtype).view(count, width * widest, -1)
    padded, query_lengths = padded_queries(queries)  # zero rows: a max of 0, which adds nothing to the sum
    sims = torch.bmm(aligned(padded).to(device).to(dtype), doc_vectors.transpose(1, 2))
    scores = sims.view(count, -1, width, widest).amax(dim=3).sum(dim=1)
    if aggregate == 'mean':
        scores = scores / torch.from_numpy(query_lengths).to(device)[:, None]
    scores = scores.float()
    if check is not None:
        check(scores.masked_fill(~torch.from_numpy(valid).to(device), 0), safe, first_query)
    scores = scores.masked_fill(~torch.from_numpy(valid).to(device), -torch.inf)
    scores, order = scores.sort(dim=1, descending=True, stable=True)  # ties: ascending docid, as docids are
    keep = min(width, num_results)
    return scores[:, :keep].cpu().numpy(), np.take_along_axis(docids, order[:, :keep].cpu().numpy(), 1), found


def merge_top(parts, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rankings of the same queries by the shards of an index merged into each query's top ``k``, by score, ties
    by the order of the shards (document order), then by each shard's ranking.

    Args:
        parts: ``(scores, docids, counts)`` of each shard, in document order: each query's ranking in a row, of
            which the first ``counts`` are results.
        k: Results kept per query.

    Returns:
        ``(scores, docids, counts)`` as each part.
    """
    if len(parts) == 1:
        return parts[0]
    scores = np.concatenate([np.where(np.arange(s.shape[1]) < c[:, None], s, -np.inf).astype(s.dtype)
                             for s, _, c in parts], axis=1)
    order = np.argsort(-scores, axis=1, kind='stable')[:, :k]
    docids = np.concatenate([d for _, d, _ in parts], axis=1)
    counts = np.minimum(np.sum([c for _, _, c in parts], axis=0), k)
    return np.take_along_axis(scores, order, 1), np.take_along_axis(docids, order, 1), counts


def shard_documents(docids: np.ndarray, first: int, count: int) -> np.ndarray:
    """The documents of one shard (docids ``first`` to ``first + count - 1``) among rows of ascending, -1 padded
    docids, as the shard's own docids, ascending, -1 padded."""
    inside = (docids >= first) & (docids < first + count)
    out = np.full((len(docids), int(inside.sum(axis=1).max(initial=0))), -1, dtype=np.int64)
    out[np.nonzero(inside)[0], (np.cumsum(inside, axis=1) - 1)[inside]] = docids[inside] - first
    return out


def aligned(array: np.ndarray) -> torch.Tensor:
    """A copy of an array in memory that torch allocated, which starts at a 64-byte boundary.

    The CPU's matrix products (MKL) may round differently where their operands start at different alignments, and
    NumPy's (or a memory map's, or Ray's object store's) arrays start wherever they were put: copied here, the same
    vectors give the same scores bit for bit, whichever process reads them.
    """
    out = torch.empty(array.shape, dtype=getattr(torch, np.dtype(array.dtype).name))
    out.numpy()[...] = array
    return out


def stored_rows(vectors, rows, device) -> torch.Tensor:
    """``vectors[rows]`` (a slice or an array of row numbers) as a tensor on ``device``: indexed where the stored
    vectors are already a tensor there (:meth:`~.shardwise.ShardSearcher.stored_vectors`), else copied from the
    array (:func:`aligned`)."""
    if isinstance(vectors, torch.Tensor):
        return vectors[rows if isinstance(rows, slice) else torch.from_numpy(rows).to(vectors.device)]
    return aligned(vectors[rows]).to(device)


def query_embs(embs, dim: int, qid) -> np.ndarray:
    """A query's vectors as a float32 ``(Q, dim)`` array (``query_vec`` rows are accepted as one vector).

    Raises:
        ValueError: Naming the query, if its vectors are not a non-empty 2-D array of finite numbers of size ``dim``.
    """
    try:
        embs = np.asarray(embs, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ValueError(f'query {qid!r}: query_embs is not an array of numbers ({e})') from None
    if embs.ndim == 1:
        embs = embs[None, :]
    if embs.ndim != 2 or embs.shape[0] == 0 or embs.shape[1] != dim:
        raise ValueError(f'query {qid!r}: query_embs must be a non-empty 2-D array with rows of size {dim} '
                         f'(the index\'s vector size), got shape {embs.shape}')
    if not np.isfinite(embs).all():
        raise ValueError(f'query {qid!r}: query_embs has non-finite values (NaN or inf); check the query encoder')
    return np.ascontiguousarray(embs)


def query_matrices(inp: pd.DataFrame, dim: int) -> List[np.ndarray]:
    """Each row's ``query_embs`` as :func:`query_embs` gives it (read from the columns as lists: iterating a column of
    pandas' string dtype costs microseconds a value)."""
    return [query_embs(embs, dim, qid) for qid, embs in zip(inp['qid'].tolist(), inp['query_embs'].tolist())]


def check_qid_types(qids: pd.Series) -> None:
    """Raises naming the first qid that is not a non-null string or integer (None or NaN would come back as NaN)."""
    for qid in qids.tolist():  # not unique(): it takes 0.0 for 0; a list: iterating a str column is slow
        if not isinstance(qid, (str, int, np.integer)) or isinstance(qid, (bool, np.bool_)):
            raise ValueError(f'qid {qid!r} ({type(qid).__name__}) is not a non-null string or integer; give each query '
                             'a string qid')


def check_unique_qids(inp: pd.DataFrame) -> None:
    """Raises naming the first qid that is not a non-null string or integer, or has more than one row in a query
    frame (its lists would be mixed)."""
    check_qid_types(inp['qid'])
    repeated = inp['qid'].duplicated()
    if repeated.any():
        raise ValueError(f'qid {inp["qid"][repeated].iloc[0]!r} has more than one row; a query frame has one row '
                         'per query (give each its own qid)')


def docno_array(values) -> Tuple[np.ndarray, np.ndarray]:
    """Docnos (strings of any characters) as a str array, which npids looks up by their UTF-8 (an object array, as
    ASCII), and which of the values are strings (the others, as empty strings in the array, are to be looked up
    by no one)."""
    values = list(values)
    strings = np.array([isinstance(value, str) for value in values], dtype=bool)
    return np.array([value if ok else '' for value, ok in zip(values, strings)], dtype=str), strings


def document_blocks(offsets: np.ndarray, block_vectors: int) -> List[Tuple[int, int]]:
    """Splits documents into consecutive ranges ``(first, last)`` of about ``block_vectors`` vectors each."""
    bounds = np.searchsorted(offsets, np.arange(0, offsets[-1], block_vectors), side='right') - 1
    bounds = np.unique(np.append(bounds, len(offsets) - 1))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def candidate_documents(hits: np.ndarray, vector_counts: np.ndarray) -> np.ndarray:
    """Each query's distinct candidate documents, ascending, padded with -1.

    Args:
        hits: ``(rows, k)`` documents found by the query vectors (-1: none), each query's rows one after another.
        vector_counts: Number of vectors (rows) of each query.

    Returns:
        ``(queries, most candidates of a query)`` document ids.
    """
    count, most = len(vector_counts), int(vector_counts.max())
    query = np.repeat(np.arange(count), vector_counts)
    position = np.arange(len(hits)) - np.repeat(np.cumsum(vector_counts) - vector_counts, vector_counts)
    per_query = np.full((count, most, hits.shape[1]), -1, dtype=np.int64)
    per_query[query, position] = hits
    found = np.sort(per_query.reshape(count, -1), axis=1)
    keep = found >= 0
    keep[:, 1:] &= found[:, 1:] != found[:, :-1]
    docids = np.full((count, int(keep.sum(axis=1).max())), -1, dtype=np.int64)
    docids[np.nonzero(keep)[0], (np.cumsum(keep, axis=1) - 1)[keep]] = found[keep]
    return docids


def padded_queries(queries) -> Tuple[np.ndarray, np.ndarray]:
    """Queries' vectors in one zero-padded ``(queries, most vectors, dim)`` array, and each query's count."""
    lengths = np.array([len(q) for q in queries])
    padded = np.zeros((len(queries), lengths.max(), queries[0].shape[1]), dtype=np.float32)
    padded[np.repeat(np.arange(len(queries)), lengths),
           np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = np.concatenate(queries)
    return padded, lengths


def padding_is_bounded(docids: np.ndarray, lengths: np.ndarray, dim: int, tile_bytes: int) -> np.ndarray:
    """Whether each query's candidates (a row of ``docids``, -1 padded), each padded to the longest of them, take
    at most four times the memory of their own vectors or one tile of ``tile_bytes``."""
    valid = docids >= 0
    candidate_lengths = np.where(valid, lengths[np.where(valid, docids, 0)], 0)
    padded = valid.sum(axis=1) * candidate_lengths.max(axis=1, initial=0)
    return (padded <= 4 * candidate_lengths.sum(axis=1)) | (4 * padded * dim <= tile_bytes)


def _runs(flags: np.ndarray) -> List[Tuple[int, int]]:
    """``(first, last)`` ranges of consecutive True flags, and each False flag alone."""
    runs, first = [], 0
    while first < len(flags):
        last = first + 1
        while flags[first] and last < len(flags) and flags[last]:
            last += 1
        runs.append((first, last))
        first = last
    return runs


def _widest(docids: np.ndarray, lengths: np.ndarray) -> int:
    """The most vectors of a document among ``docids`` (-1 padded)."""
    valid = docids[docids >= 0]
    return int(lengths[valid].max()) if len(valid) else 0


def result_frame(queries: pd.DataFrame, results, docnos) -> pd.DataFrame:
    """One row per (query, retrieved document), the query's columns repeated, with docno, docid, score, rank.

    Args:
        queries: The query frame.
        results: ``(scores, docids, counts)`` of consecutive batches of queries: each query's ranking in a row of
            ``scores`` and ``docids``, of which the first ``counts`` are results.
        docnos: The index's docno lookup.
    """
    scores, docids, counts = [np.zeros(0, dtype=np.float32)], [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=int)]
    for batch_scores, batch_docids, batch_counts in results:
        kept = np.arange(batch_scores.shape[1]) < batch_counts[:, None]
        scores.append(batch_scores[kept])
        docids.append(batch_docids[kept].astype(np.int64))
        counts.append(batch_counts)
    counts, docids = np.concatenate(counts), np.concatenate(docids)
    found = pd.DataFrame({'docno': looked_up(docnos, docids), 'docid': docids, 'score': np.concatenate(scores),
                          'rank': np.arange(len(docids)) - np.repeat(np.cumsum(counts) - counts, counts)})
    out = queries.drop(columns=[c for c in found.columns if c in queries.columns])
    return pd.concat([out.take(np.repeat(np.arange(len(queries)), counts)).reset_index(drop=True), found], axis=1)


def looked_up(docnos, docids: np.ndarray) -> np.ndarray:
    """The docnos of ``docids`` from an index's docno lookup, each distinct docid looked up once (a query's vectors
    searched one by one find the same documents)."""
    if not len(docids):
        return np.zeros(0, dtype=object)
    distinct, position = np.unique(docids, return_inverse=True)
    return docnos.fwd[distinct][position]
