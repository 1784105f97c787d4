"""Late-interaction (MaxSim) retrieval and re-scoring over a MultiVectorIndex, in torch on the CPU or a GPU."""
import copy
from typing import List, Optional, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._device import resolve_device
from pyterrier_multiquery._extras import requires

with requires('dense'):
    import torch

AGGREGATES = ('mean', 'sum')


def maxsim_scores(query, doc_vectors, doc_lengths, aggregate: str):
    """MaxSim of one or more queries against consecutive documents, as torch tensors.

    Args:
        query: ``(Q, d)`` query vectors, or a list of them for a batch.
        doc_vectors: ``(V, d)`` stored vectors of the documents, one document after another.
        doc_lengths: ``(D,)`` number of vectors of each document (summing to ``V``).
        aggregate: ``mean`` or ``sum`` over each query's vectors.

    Returns:
        ``(batch, D)`` scores.
    """
    queries = query if isinstance(query, list) else [query]
    stacked = torch.cat(queries)
    sims = stacked @ doc_vectors.T
    doc_count = len(doc_lengths)
    if doc_count and bool((doc_lengths == doc_lengths[0]).all()):  # equal lengths: a plain reshape
        per_doc = sims.view(len(stacked), doc_count, -1).amax(dim=2)
    else:
        doc_of_vector = torch.repeat_interleave(torch.arange(doc_count, device=sims.device), doc_lengths)
        per_doc = torch.full((len(stacked), doc_count), -torch.inf, device=sims.device, dtype=sims.dtype)
        per_doc.scatter_reduce_(1, doc_of_vector.expand(len(stacked), -1), sims, reduce='amax')
    query_lengths = torch.tensor([len(q) for q in queries], device=sims.device)
    query_of_row = torch.repeat_interleave(torch.arange(len(queries), device=sims.device), query_lengths)
    scores = torch.zeros((len(queries), doc_count), device=sims.device, dtype=sims.dtype)
    scores.index_add_(0, query_of_row, per_doc)
    return scores / query_lengths[:, None] if aggregate == 'mean' else scores


class MaxSimRetriever(pt.Transformer):
    """Retrieves each query's top ``num_results`` documents by ColBERT-style MaxSim.

    ``score(q, d) = agg_i max_j <q_i, d_j>`` over the query's vectors ``q_i`` (``query_embs``) and the document's
    stored vectors ``d_j``, ``agg`` being the mean (default) or the sum. With ``exact=True`` every document is
    scored, in blocks of about ``block_vectors`` stored vectors. With ``exact=False`` each query vector first
    takes its ``candidates`` nearest stored vectors from a FAISS index (``ann``: flat, ivf or hnsw, with an
    optional ``quantizer``; built once and cached in the index folder), and exact MaxSim is computed over
    their documents only. Scoring runs in torch on ``device`` (CUDA when available), FAISS search on the GPU
    when FAISS has GPU support; the CPU gives the same rankings.
    """
    schematic = {'label': 'MaxSim'}

    def __init__(self, index, *, num_results: int = 1000, aggregate: str = 'mean', exact: bool = True,
                 ann: str = 'ivf', quantizer: Optional[str] = None, candidates: int = 256, search_effort: int = 32,
                 device: Optional[str] = None, batch_size: int = 64, block_vectors: int = 65536,
                 drop_query_embs: bool = False, verbose: bool = False):
        """
        Args:
            index: The :class:`MultiVectorIndex` to search.
            num_results: Documents returned per query.
            aggregate: ``mean`` or ``sum`` over the query's vectors.
            exact: Score every document (True) or only the ANN candidates (False).
            ann: FAISS index kind for the candidates: ``flat``, ``ivf`` or ``hnsw``.
            quantizer: FAISS storage of the ANN stage: None, ``SQ8``, ``SQfp16`` or ``PQ<m>``.
            candidates: Stored vectors fetched per query vector by the ANN stage.
            search_effort: IVF lists probed (``nprobe``) or HNSW ``efSearch``.
            device: torch device for scoring (default: CUDA if available, else CPU).
            batch_size: Queries scored together.
            block_vectors: Stored vectors scored together by the exact search.
            drop_query_embs: Whether to drop ``query_embs`` from the output.
            verbose: Whether to show progress bars.
        """
        from pyterrier_multiquery.index.ann import faiss_factory
        if aggregate not in AGGREGATES:
            raise ValueError(f'aggregate must be one of {AGGREGATES}, got {aggregate!r}')
        if num_results < 1 or candidates < 1:
            raise ValueError(f'num_results and candidates must be positive, got {num_results} and {candidates}')
        faiss_factory(ann, quantizer, 1)  # checks ann and quantizer
        self.index = index
        self.num_results = num_results
        self.aggregate = aggregate
        self.exact = exact
        self.ann = ann
        self.quantizer = quantizer
        self.candidates = candidates
        self.search_effort = search_effort
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.block_vectors = block_vectors
        self.drop_query_embs = drop_query_embs
        self.verbose = verbose
        self._faiss = None

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Retrieves for each query row (``qid``, ``query_embs``)."""
        pt.validate.query_frame(inp, extra_columns=['query_embs'])
        check_unique_qids(inp)
        meta, vectors, offsets, docnos = self.index.payload()
        queries = [query_embs(embs, meta['dim'], qid) for qid, embs in zip(inp['qid'], inp['query_embs'])]
        search = self._search_exact if self.exact else self._search_approximate
        batches = range(0, len(queries), self.batch_size)
        if self.verbose and not self.exact:
            batches = pt.tqdm(batches, desc=repr(self), unit='batch')
        results = []
        for start in batches:
            results.extend(search(queries[start:start + self.batch_size], vectors, offsets))
        columns = [c for c in inp.columns if not (self.drop_query_embs and c == 'query_embs')]
        return result_frame(inp[columns], results, docnos)

    def _search_exact(self, queries, vectors, offsets) -> List[Tuple[np.ndarray, np.ndarray]]:
        batch = [torch.from_numpy(q).to(self.device) for q in queries]
        best_scores = torch.empty((len(queries), 0), device=self.device)
        best_docids = torch.empty((len(queries), 0), dtype=torch.long, device=self.device)
        blocks = document_blocks(offsets, self.block_vectors)
        if self.verbose:
            blocks = pt.tqdm(blocks, desc=repr(self), unit='block')
        for first, last in blocks:
            block = torch.from_numpy(np.array(vectors[offsets[first]:offsets[last]], dtype=np.float32)).to(self.device)
            lengths = torch.from_numpy(np.diff(offsets[first:last + 1])).to(self.device)
            scores = maxsim_scores(batch, block, lengths, self.aggregate)
            best_scores = torch.cat([best_scores, scores], dim=1)
            block_docids = torch.arange(first, last, device=self.device).expand(len(queries), -1)
            best_docids = torch.cat([best_docids, block_docids], dim=1)
            if best_scores.shape[1] > self.num_results:
                best_scores, keep = best_scores.topk(self.num_results, dim=1)
                best_docids = best_docids.gather(1, keep)
        return [ranked(s, d) for s, d in zip(best_scores.cpu().numpy(), best_docids.cpu().numpy())]

    def _search_approximate(self, queries, vectors, offsets) -> List[Tuple[np.ndarray, np.ndarray]]:
        from pyterrier_multiquery.index.ann import load_or_build, set_search_effort, to_device
        meta = self.index.payload()[0]
        if self._faiss is None or self._faiss[0] != meta:  # first search, or the index was rebuilt
            ann = to_device(load_or_build(self.index, self.ann, self.quantizer, verbose=self.verbose), self.device)
            set_search_effort(ann, self.ann, self.search_effort)
            self._faiss = (meta, ann)
        _, hits = self._faiss[1].search(np.concatenate(queries), self.candidates)
        hit_docs = np.searchsorted(offsets, hits, side='right') - 1  # -1 marks an empty slot
        results, row = [], 0
        for query in queries:
            docs = np.unique(hit_docs[row:row + len(query)])
            docs = docs[docs >= 0]
            row += len(query)
            scores = score_documents(torch.from_numpy(query).to(self.device), docs, vectors, offsets, self.aggregate)
            results.append(ranked(scores, docs, self.num_results))
        return results

    def fuse_rank_cutoff(self, k: int):
        """``retriever % k`` with ``k`` below ``num_results`` becomes a retriever of ``k`` results."""
        if k < self.num_results:
            fused = copy.copy(self)  # shares the loaded FAISS stage
            fused.num_results = k
            return fused
        return None

    def _key(self):
        approximate = () if self.exact else (self.ann, self.quantizer, self.candidates, self.search_effort)
        return (str(self.index.path), self.num_results, self.aggregate, self.exact, approximate, self.drop_query_embs)

    def __eq__(self, other):
        return isinstance(other, MaxSimRetriever) and self._key() == other._key()

    def __hash__(self):
        return hash((MaxSimRetriever, self._key()))

    def __repr__(self):
        mode = 'exact=True' if self.exact else f'exact=False, ann={self.ann!r}, candidates={self.candidates}'
        return f'{self.index!r}.maxsim_retriever(num_results={self.num_results}, aggregate={self.aggregate!r}, {mode})'


class MaxSimScorer(pt.Transformer):
    """Re-scores an existing result frame (``qid``, ``docno``, ``query_embs``) by exact MaxSim against the index.

    A query's vectors are read from its first row (a result frame repeats them on every row of the query).
    """
    schematic = {'label': 'MaxSim scorer'}

    def __init__(self, index, *, aggregate: str = 'mean', num_results: Optional[int] = None,
                 device: Optional[str] = None, verbose: bool = False):
        """
        Args:
            index: The :class:`MultiVectorIndex` that holds the documents' vectors.
            aggregate: ``mean`` or ``sum`` over the query's vectors.
            num_results: Keep only this many re-scored documents per query (default: all).
            device: torch device for scoring.
            verbose: Whether to show a progress bar over queries.
        """
        if aggregate not in AGGREGATES:
            raise ValueError(f'aggregate must be one of {AGGREGATES}, got {aggregate!r}')
        self.index = index
        self.aggregate = aggregate
        self.num_results = num_results
        self.device = resolve_device(device)
        self.verbose = verbose

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Replaces ``score`` and ``rank`` with MaxSim's, per query."""
        pt.validate.result_frame(inp, extra_columns=['query_embs'])
        meta, vectors, offsets, docnos = self.index.payload()
        if len(inp) == 0:
            return pt.model.add_ranks(inp.assign(score=pd.Series(dtype=float)))
        docids = lookup_docids(docnos, inp['docno'])
        scores = np.empty(len(inp), dtype=np.float32)
        groups = inp.groupby('qid', sort=False).indices.items()
        if self.verbose:
            groups = pt.tqdm(groups, desc=repr(self), unit='q')
        for qid, rows in groups:
            query = torch.from_numpy(query_embs(inp['query_embs'].iloc[rows[0]], meta['dim'], qid)).to(self.device)
            scores[rows] = score_documents(query, docids[rows], vectors, offsets, self.aggregate)
        out = pt.model.add_ranks(inp.assign(score=scores))
        if self.num_results is not None:
            out = out[out['rank'] < self.num_results].reset_index(drop=True)
        return out

    def __repr__(self):
        return f'{self.index!r}.maxsim_scorer(aggregate={self.aggregate!r})'

    def __eq__(self, other):
        return isinstance(other, MaxSimScorer) and (str(self.index.path), self.aggregate, self.num_results) == \
            (str(other.index.path), other.aggregate, other.num_results)

    def __hash__(self):
        return hash((MaxSimScorer, str(self.index.path), self.aggregate, self.num_results))


def score_documents(query, docids: np.ndarray, vectors, offsets: np.ndarray, aggregate: str) -> np.ndarray:
    """Exact MaxSim of one query (a ``(Q, d)`` tensor) against the given documents of an index's vectors."""
    lengths = offsets[docids + 1] - offsets[docids]
    rows = np.repeat(offsets[docids] - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    doc_vectors = torch.from_numpy(np.asarray(vectors[rows], dtype=np.float32)).to(query.device)
    return maxsim_scores(query, doc_vectors, torch.from_numpy(lengths).to(query.device), aggregate)[0].cpu().numpy()


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


def check_unique_qids(inp: pd.DataFrame) -> None:
    """Raises naming the first qid that has more than one row in a query frame (its lists would be mixed)."""
    repeated = inp['qid'].duplicated()
    if repeated.any():
        raise ValueError(f'qid {inp["qid"][repeated].iloc[0]!r} has more than one row; a query frame has one row '
                         'per query (give each its own qid)')


def lookup_docids(docnos, values: pd.Series) -> np.ndarray:
    """Internal ids of docnos, with an error naming the first docno the index does not hold."""
    docids = np.asarray(docnos.inv[values.to_numpy()], dtype=np.int64)
    if (docids < 0).any():
        raise KeyError(f'docno {values.iloc[int(np.argmax(docids < 0))]!r} is not in the index')
    return docids


def document_blocks(offsets: np.ndarray, block_vectors: int) -> List[Tuple[int, int]]:
    """Splits documents into consecutive ranges ``(first, last)`` of about ``block_vectors`` vectors each."""
    bounds = np.searchsorted(offsets, np.arange(0, offsets[-1], block_vectors), side='right') - 1
    bounds = np.unique(np.append(bounds, len(offsets) - 1))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def ranked(scores: np.ndarray, docids: np.ndarray, limit: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Sorts by score descending (docid ascending on ties) and keeps the top ``limit``."""
    order = np.lexsort((docids, -scores))[:limit]
    return scores[order], docids[order]


def result_frame(queries: pd.DataFrame, results, docnos) -> pd.DataFrame:
    """One row per (query, retrieved document), the query's columns repeated, with docno, docid, score, rank."""
    counts = [len(docids) for _, docids in results]
    out = queries.iloc[np.repeat(np.arange(len(queries)), counts)].reset_index(drop=True)
    docids = np.concatenate([d for _, d in results] + [np.zeros(0, dtype=np.int64)]).astype(np.int64)
    return out.assign(
        docno=docnos.fwd[docids] if len(docids) else np.zeros(0, dtype=object),
        docid=docids,
        score=np.concatenate([s for s, _ in results] + [np.zeros(0, dtype=np.float32)]),
        rank=np.concatenate([np.arange(c) for c in counts] + [np.zeros(0, dtype=np.int64)]),
    )
