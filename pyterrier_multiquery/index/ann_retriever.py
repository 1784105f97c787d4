"""Approximate MaxSim retrieval: each query vector's nearest stored vectors from a FAISS index (:mod:`.ann`), then exact
MaxSim over their documents only."""
from typing import List, Optional, Tuple

import numpy as np

from pyterrier_multiquery._transformer import check_positive
from pyterrier_multiquery.index.maxsim import (
    MaxSimSearch,
    candidate_documents,
    merge_top,
    shard_documents,
)


class ApproxMaxSimRetriever(MaxSimSearch):
    """Retrieves each query's top ``num_results`` documents by MaxSim over ANN candidates.

    Each query vector takes its ``candidates`` nearest stored vectors from a FAISS index (``ann``: flat, ivf or hnsw,
    storing ``quantizer`` codes; built once and cached in the index folder; one search for all the queries of a
    frame), and exact MaxSim (as :class:`~.maxsim.MaxSimRetriever` scores it) is computed over their documents only,
    for as many queries at once as ``batch_size`` and ``tile_bytes`` allow. A query whose candidates hold fewer than
    ``num_results`` documents is searched exactly instead, so that every query gets ``num_results`` documents where
    the index holds that many. The candidate count and search effort are the user's where given; else those that
    :meth:`calibrate` measured on this machine for this index build, setting and kind of device (exact search where
    that was faster); else :data:`~.calibration.DEFAULT_CANDIDATES` and :data:`~.calibration.DEFAULT_SEARCH_EFFORT`,
    with a warning that names :meth:`calibrate`. FAISS searches on the GPU when it has GPU support; on the CPU, torch
    and FAISS both use ``threads`` threads during a search.
    """
    schematic = {'label': 'MaxSim (ANN)'}
    uses_faiss = True

    def __init__(self, index, *, num_results: int = 1000, aggregate: str = 'mean', ann: str = 'ivf',
                 quantizer: Optional[str] = None, candidates: Optional[int] = None,
                 search_effort: Optional[int] = None, device: Optional[str] = None, batch_size: int = 64,
                 tile_bytes: Optional[int] = None, threads: Optional[int] = None, drop_query_embs: bool = False,
                 verbose: bool = False):
        """
        Args:
            index: The :class:`MultiVectorIndex` (or :class:`ShardedMultiVectorIndex`) to search.
            num_results: Documents returned per query.
            aggregate: ``mean`` or ``sum`` over the query's vectors.
            ann: FAISS index kind for the candidates: ``flat``, ``ivf`` or ``hnsw``.
            quantizer: FAISS storage of the ANN stage: ``Flat`` (float32), ``SQ8``, ``SQ4``, ``SQfp16`` or
                ``PQ<m>``; None for the kind's default (``SQ8`` for ivf, ``Flat`` for flat and hnsw).
            candidates: Stored vectors fetched per query vector; None for this machine's calibration
                (:meth:`calibrate`), else the default.
            search_effort: IVF lists probed (``nprobe``) or HNSW ``efSearch``; None for the calibration's (with a
                given ``candidates``: the default).
            device: torch device for scoring (default: CUDA if available, else CPU).
            batch_size: Queries scored together.
            tile_bytes: Working memory of one scoring step (default: 4 MiB on the CPU; 256 MiB on a GPU).
            threads: CPU threads of torch and FAISS during a search (default: ``torch.get_num_threads()``); the
                counts before are restored after it.
            drop_query_embs: Whether to drop ``query_embs`` from the output.
            verbose: Whether to show progress bars.
        """
        from pyterrier_multiquery.index.ann import ann_storage
        super().__init__(index, num_results=num_results, aggregate=aggregate, device=device, batch_size=batch_size,
                         tile_bytes=tile_bytes, threads=threads, drop_query_embs=drop_query_embs, verbose=verbose)
        check_positive(candidates=candidates, search_effort=search_effort)
        self.ann = ann
        self.quantizer = ann_storage(ann, quantizer)  # checks both
        self.candidates = candidates
        self.search_effort = search_effort

    def calibrate(self):
        """Measures, on this machine, the candidate count and search effort this retriever's index and ANN setting
        need (:func:`~.calibration.calibrate`), and keeps them for later searches on this machine (outside the
        index folder, so that a copied or shared index carries none); returns the
        :class:`~.calibration.Calibration`."""
        from pyterrier_multiquery.index.calibration import calibrated
        return calibrated(self, remeasure=True)

    def setting(self) -> Tuple[Optional[int], int]:
        """The candidate count (None: exact search) and search effort a search runs with: the user's, else this
        machine's calibration, else the defaults."""
        from pyterrier_multiquery.index.calibration import DEFAULT_SEARCH_EFFORT, stored_setting
        if self.candidates is not None:
            return self.candidates, self.search_effort or DEFAULT_SEARCH_EFFORT
        return stored_setting(self)

    def search(self, queries, shards, qids: list) -> List[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The ANN candidates of every query vector over all shards (one search for all the queries), then exact
        MaxSim of each query's candidate documents by the shards that hold them, merged batch by batch."""
        from pyterrier_multiquery.index.ann import merge_hits
        candidates, effort = self.setting()
        if candidates is None:
            return self._search_exact(queries, shards, qids)
        hits = merge_hits(shards.map('ann_hits', np.concatenate(queries), candidates, kind=self.ann,
                                     quantizer=self.quantizer, search_effort=effort, device=self.device),
                          candidates)[1]
        vector_counts = np.array([len(q) for q in queries])
        first_rows = np.cumsum(vector_counts) - vector_counts
        batches = []
        for start in range(0, len(queries), self.batch_size):
            stop = min(len(queries), start + self.batch_size)
            rows = slice(first_rows[start], first_rows[stop - 1] + vector_counts[stop - 1])
            batches.append((start, stop, candidate_documents(hits[rows], vector_counts[start:stop])))
        per_shard = shards.map(
            'rescore', queries, qids=qids, num_results=self.num_results, aggregate=self.aggregate,
            tile_bytes=self.tile_bytes, device=self.device, label=repr(self) if self.verbose else None,
            shard_args=[[(start, stop, shard_documents(docids, first, count)) for start, stop, docids in batches]
                        for first, count in zip(shards.firsts, shards.counts)])
        return self._completed([merge_top(parts, self.num_results) for parts in zip(*per_shard)], queries, shards,
                               qids)

    def _completed(self, results: list, queries, shards, qids: list) -> list:
        """``results`` where each query whose candidates held fewer than ``num_results`` documents (of an index that
        holds that many) is searched exactly instead, so that every query gets its ``num_results`` documents."""
        counts = np.concatenate([c for _, _, c in results])
        short = np.flatnonzero(counts < min(self.num_results, sum(shards.counts)))
        if not len(short):
            return results
        rows = [(s[i:i + 1], d[i:i + 1], c[i:i + 1]) for s, d, c in results for i in range(len(c))]
        exact = [(s[i:i + 1], d[i:i + 1], c[i:i + 1]) for s, d, c in
                 self._search_exact([queries[i] for i in short], shards, [qids[i] for i in short])
                 for i in range(len(c))]
        for position, row in zip(short, exact):
            rows[position] = row
        return rows
