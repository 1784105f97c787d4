"""Every search of the index as a map over its shards and a merge.

Each shard's part is a method of :class:`ShardSearcher`, computed over the shard's own memory-mapped files, where
the shard is held: in this process (:class:`LocalShards`), or in a Ray actor
(:class:`~pyterrier_multiquery.index.distributed.RayIndex`). The retrievers merge the parts the same way in both
cases, so an index searched over Ray ranks and scores exactly as in one process.
"""
from typing import List, Optional

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._device import fits_on_device
from pyterrier_multiquery._extras import requires

from pyterrier_multiquery.index.errors import IndexReplacedError
from pyterrier_multiquery.index.exact import exact_top, stored_max_norm
from pyterrier_multiquery.index.checks import ScoreCheck
from pyterrier_multiquery.index.maxsim import aligned, rescore_candidates, score_documents

with requires('dense'):
    import torch


#: Stored vectors copied to a GPU at once when it keeps them resident.
RESIDENT_CHUNK = 1 << 20


def uses_length_groups(device: str) -> bool:
    """Whether exact search on ``device`` screens the documents grouped by length (:mod:`.grouped`): on a GPU."""
    return device.startswith('cuda')


class ShardSearcher:
    """The part of every search that one shard (a :class:`MultiVectorIndex`) computes. The docids it takes and gives
    are the sharded index's (the shard's own plus ``first``), but for :meth:`rescore` and :meth:`docnos`, which take
    the shard's own. Every part is of the shard's build ``build_id``: a shard replaced since is refused.

    The parts that score raise naming the document whose stored vectors are not finite
    (:class:`~.errors.CorruptIndexError`), else the query (by its qid) whose score overflows float32 (ValueError).
    """

    def __init__(self, shard, first: int, build_id: Optional[str] = None):
        """
        Args:
            shard: The :class:`MultiVectorIndex`.
            first: The docid of its first document in the sharded index.
            build_id: The shard's build where the search opened the index (default: its build now).
        """
        self.shard = shard
        self.first = first
        self.build_id = shard.payload()[0]['build_id'] if build_id is None else build_id
        self._stages = {}
        self._max_norm = {}
        self._resident = {}

    def payload(self):
        """The shard's ``payload()``, checked to be of ``build_id``.

        Raises:
            CorruptIndexError: If the shard was replaced by another build.
        """
        payload = self.shard.payload()
        if payload[0]['build_id'] != self.build_id:
            raise IndexReplacedError(f'the index at {str(self.shard.path)!r} was replaced by another build while this '
                                    'search opened it; search again')
        return payload

    def doc_count(self) -> int:
        """Documents in the shard."""
        return self.payload()[0]['doc_count']

    def exact(self, queries: List[np.ndarray], *, qids: list, **settings) -> list:
        """Each batch's top documents by exact MaxSim (``settings`` as :func:`~.exact.exact_top`; ``qids``: the
        queries'), as ``(scores, docids, counts)``: on a GPU over the documents grouped by length
        (:func:`~.grouped.grouped_exact_top`; the survivors scored from the stored vectors' copy there where it fits,
        :meth:`stored_vectors`), elsewhere block by block in index order."""
        payload = self.payload()
        check = ScoreCheck(qids, payload, self.shard.path)
        device = settings['device']
        if uses_length_groups(device):
            from pyterrier_multiquery.index.grouped import grouped_exact_top
            settings.pop('block_vectors')
            groups = self.length_groups(payload, device, settings['label'])  # before the copy: it takes memory
            top = grouped_exact_top(queries, groups, self.stored_vectors(payload, device), payload[2], check=check,
                                    max_norm=self.max_norm(payload), **settings)
        else:
            top = exact_top(queries, self.stored_vectors(payload, device), payload[2], check=check,
                            max_norm=self.max_norm(payload), **settings)
        return [(scores, docids + self.first, np.full(len(scores), scores.shape[1])) for scores, docids in top]

    def length_groups(self, payload, device: str, label: Optional[str] = None):
        """The shard's documents grouped by length for searches on ``device`` (:class:`~.grouped.LengthGroups`),
        made at the first search there and kept while the shard is unchanged."""
        from pyterrier_multiquery.index.grouped import LengthGroups, group_dtype
        key = ('groups', device)
        if key not in self._resident or self._resident[key][0] is not payload[0]:
            self._resident.pop(key, None)  # the groups of an earlier build go before their successor comes
            self._resident[key] = (payload[0], LengthGroups.build(
                payload[1], payload[2], device, dtype=group_dtype(self.max_norm(payload)), verbose=label is not None))
        return self._resident[key][1]

    def stored_vectors(self, payload, device: str):
        """The shard's stored vectors for a search on ``device``: the memory-mapped array (read a block at a time),
        or, on a GPU whose free memory holds them twice over, a copy there, made at the first search and kept
        while the shard is unchanged (:func:`fits_on_device`)."""
        vectors = payload[1]
        if device in self._resident and self._resident[device][0] is payload[0]:
            return self._resident[device][1]
        self._resident.pop(device, None)  # the copy of an earlier build goes before its successor comes
        if not fits_on_device(vectors.nbytes, device):  # asked before a copy only: the copy takes free memory
            return vectors
        resident = torch.empty(vectors.shape, dtype=getattr(torch, vectors.dtype.name), device=device)
        for start in range(0, len(vectors), RESIDENT_CHUNK):
            resident[start:start + RESIDENT_CHUNK] = aligned(vectors[start:start + RESIDENT_CHUNK]).to(device)
        self._resident[device] = (payload[0], resident)
        return resident

    def max_norm(self, payload) -> float:
        """The largest norm of the shard's stored vectors: its ``max_norm``, or computed once for an index built
        before indexes recorded it."""
        build_id = payload[0]['build_id']
        if build_id not in self._max_norm:
            self._max_norm[build_id] = stored_max_norm(payload)
        return self._max_norm[build_id]

    def ann_hits(self, vectors: np.ndarray, k: int, *, kind: str, quantizer: Optional[str], search_effort: int,
                 device: str):
        """The ``k`` nearest stored vectors of each query vector (as :meth:`~.ann.CandidateStage.search`); the FAISS
        index is loaded (or built) once for every search effort, again when the shard is rebuilt."""
        from pyterrier_multiquery.index.ann import CandidateStage
        payload = self.payload()
        key = (kind, quantizer, device)
        if key not in self._stages or self._stages[key][0] is not payload[0]:
            self._stages[key] = (payload[0], CandidateStage(self.shard, kind, quantizer, device, first=self.first,
                                                            payload=payload))
        return self._stages[key][1].search(vectors, k, search_effort)

    def rescore(self, batches, queries: List[np.ndarray], *, qids: list, **settings) -> list:
        """Exact MaxSim of each batch's queries against their candidates in this shard (``batches`` and
        ``settings`` as :func:`~.maxsim.rescore_candidates`, the shard's own docids; ``qids``: the queries'), as
        ``(scores, docids, counts)``."""
        payload = self.payload()
        check = ScoreCheck(qids, payload, self.shard.path)
        return [(scores, np.where(docids >= 0, docids + self.first, -1), counts)
                for scores, docids, counts in rescore_candidates(queries, batches,
                                                                 self.stored_vectors(payload, settings['device']),
                                                                 payload[2], check=check, **settings)]

    def mean(self, query_vecs: np.ndarray, *, num_results: int, normalise: bool, verbose: bool = False) -> list:
        """Each query's top documents by the inner product of the mean vectors (as :class:`~.mean.MeanRetriever`,
        the means read from its FlexIndex in the shard's folder), as ``[(scores, docids, counts)]``."""
        from pyterrier_multiquery.index.mean import MeanRetriever
        self.payload()  # refused where the shard was replaced since the search opened it
        means = MeanRetriever(self.shard, normalise=normalise, verbose=verbose).flex_index().payload(
            return_docnos=False)[0]
        # a mean is a document (or query) of one vector, whose MaxSim is the inner product
        top = exact_top([vec[None, :] for vec in query_vecs], means, np.arange(len(means) + 1), num_results=num_results,
                        aggregate='sum', batch_size=len(query_vecs), block_vectors=65536, tile_bytes=4 << 20,
                        device='cpu')
        scores, docids = top[0]
        return [(scores, docids + self.first, np.full(len(scores), scores.shape[1]))]

    def score(self, queries: List[np.ndarray], docnos: List[np.ndarray], *, qids: list, aggregate: str, device: str,
              label: Optional[str] = None) -> list:
        """Exact MaxSim of each query (None: a malformed one, not scored; ``qids``: the queries') against those of
        its docnos (a str array each) that this shard holds.

        Returns:
            For each query, ``(held, scores)``: which of its docnos the shard holds, and their scores.
        """
        payload = self.payload()
        _, _, offsets, lookup = payload
        vectors = self.stored_vectors(payload, device)
        check = ScoreCheck(qids, payload, self.shard.path)
        pairs = zip(queries, docnos)
        if label is not None:
            pairs = pt.tqdm(pairs, total=len(queries), desc=label, unit='q')
        out = []
        for position, (query, names) in enumerate(pairs):
            docids = np.asarray(lookup.inv[names], dtype=np.int64) if len(names) else np.zeros(0, dtype=np.int64)
            held = docids >= 0
            scores = np.zeros(int(held.sum()), dtype=np.float32)  # left as they are for a malformed query
            if query is not None and held.any():
                scores = score_documents(aligned(query).to(device), docids[held], vectors, offsets, aggregate)
                check(scores[None], docids[held], position)
            out.append((held, scores))
        return out

    def docnos(self, docids: np.ndarray) -> np.ndarray:
        """The docnos of the shard's own ``docids``."""
        lookup = self.payload()[3]
        return np.asarray(lookup.fwd[docids], dtype=str) if len(docids) else np.zeros(0, dtype=str)


class LocalShards:
    """The shards of an index searched in this process, one after the other."""

    def __init__(self, index):
        """
        Args:
            index: A :class:`MultiVectorIndex` (one shard) or :class:`ShardedMultiVectorIndex`.
        """
        self.meta, _, _, self.docnos = index.payload()
        build_ids = self.meta.get('shard_build_ids', [self.meta['build_id']])
        self.searchers = []
        for shard, build_id in zip(index.shards(), build_ids):
            self.searchers.append(ShardSearcher(shard, sum(s.doc_count() for s in self.searchers), build_id))
        self.counts = [searcher.doc_count() for searcher in self.searchers]
        self.firsts = [searcher.first for searcher in self.searchers]

    def map(self, method: str, *args, shard_args: Optional[list] = None, **kwargs) -> list:
        """``ShardSearcher.<method>(*args, **kwargs)`` of every shard, in document order; with ``shard_args``, each
        shard's own first argument before ``args``."""
        return [getattr(searcher, method)(*(() if shard_args is None else (shard_args[i],)), *args, **kwargs)
                for i, searcher in enumerate(self.searchers)]
