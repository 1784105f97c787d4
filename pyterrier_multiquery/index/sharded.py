"""Several MultiVectorIndex shards searched as one, and the indexer that splits a corpus into them."""
import itertools
import json
import multiprocessing
import os
import queue
import shutil
import uuid
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Union

import more_itertools
import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from pyterrier_multiquery._files import _remove, building, exclusive_lock, exit_with_parent
from pyterrier_multiquery.index.errors import CorruptIndexError
from pyterrier_multiquery.index.core import (
    _DTYPES,
    MultiVectorIndex,
    SearchableIndex,
    _check_target,
    _read_meta,
    docno_set,
    open_whole,
    stored_chunks,
)

DEFAULT_SHARD_SIZE = 1_000_000


class ShardedMultiVectorIndex(SearchableIndex, pta.Artifact, pt.Indexer):
    """MultiVectorIndex shards searched as one index.

    The documents are numbered shard after shard, so every retriever (exact and approximate MaxSim, multi-query,
    mean, the MaxSim scorer) ranks as one :class:`MultiVectorIndex` holding the same documents in that order would,
    ties included (broken by that order). The approximate search has a FAISS stage per shard, and merges their
    hits by score: with an exhaustive stage (``ann='flat'``) the candidates, and so the rankings, are the
    unsharded index's; with IVF or HNSW they approximate them as each shard's own lists or graph do, and 8-bit codes
    (the IVF default) as each shard's own value ranges do.

    Files: ``pt_meta.json`` (the shards' folder names and build ids) and the shard folders ``shard-000``, ...,
    each a :class:`MultiVectorIndex`, written by :meth:`indexer` from one corpus or assembled by :meth:`from_shards`
    from indexes built apart.
    """
    ARTIFACT_TYPE = 'multi_vector_index'
    ARTIFACT_FORMAT = 'sharded_mvi'

    def __init__(self, path: Union[str, Path], *, verbose: bool = True):
        """
        Args:
            path: The folder of the sharded index.
            verbose: Whether to show progress bars.
        """
        super().__init__(path)
        self.path = Path(path)
        self.verbose = verbose
        self._shards = None
        self._payload = None
        self._meta_bytes = None

    def payload(self):
        """Loads and checks the shards, again whenever ``pt_meta.json`` shows the index was rebuilt.

        Returns:
            ``(meta, vectors, offsets, docnos)`` over all shards, as :meth:`MultiVectorIndex.payload`: the vectors
            read from the shards' memory-mapped files, the offsets and docids running on from shard to shard.

        Raises:
            FileNotFoundError: If no finished sharded index is at ``path``, or a shard folder is missing (named).
            CorruptIndexError: If a shard is damaged, or was rebuilt after the sharded index was built.
        """
        meta, raw = _read_meta(self.path, ShardedMultiVectorIndex)
        if self._payload is None or raw != self._meta_bytes:
            (self._shards, self._payload), self._meta_bytes = open_whole(self.path, ShardedMultiVectorIndex,
                                                                         self._open)
        else:  # a shard rebuilt in place since is named
            for i, shard in enumerate(self._shards):
                self._shard_payload(meta, shard, i)
        return self._payload

    def _open(self, meta: dict):
        """The shards the metadata names, and the payload over all of them."""
        shards = [MultiVectorIndex(self.path / name, verbose=self.verbose) for name in _shard_names(meta)]
        payloads = [self._shard_payload(meta, shard, i) for i, shard in enumerate(shards)]
        _check_counts(meta, [shard_meta for shard_meta, _, _, _ in payloads])
        offsets = [np.zeros(1, dtype=np.int64)]
        for _, _, shard_offsets, _ in payloads:
            offsets.append(shard_offsets[1:] + offsets[-1][-1])
        return shards, (meta, ShardedVectors([vectors for _, vectors, _, _ in payloads]), np.concatenate(offsets),
                        ShardedDocnos([docnos for _, _, _, docnos in payloads]))

    def _shard_payload(self, meta: dict, shard: MultiVectorIndex, i: int):
        if not shard.path.is_dir():
            raise FileNotFoundError(f'shard {i} of the sharded index {str(self.path)!r} is missing: no folder '
                                    f'{str(shard.path)!r}')
        payload = shard.payload()
        if payload[0]['build_id'] != meta['shard_build_ids'][i]:
            raise CorruptIndexError(f'shard {str(shard.path)!r} was rebuilt after the sharded index '
                                    f'{str(self.path)!r} was built; rebuild the sharded index')
        return payload

    def shards(self) -> List[MultiVectorIndex]:
        """The shards, in document order."""
        self.payload()
        return list(self._shards)

    @classmethod
    def from_shards(cls, path: Union[str, Path], shard_paths: Iterable[Union[str, Path]], *, move: bool = False,
                    overwrite: bool = False, verbose: bool = True) -> 'ShardedMultiVectorIndex':
        """Assembles a sharded index from MultiVectorIndexes built elsewhere, e.g. one per node of a cluster.

        The shards are checked first, then copied into ``path`` as ``shard-000``, ``shard-001``, ..., in the order
        given, which numbers the documents; the whole is written into a temporary folder renamed when complete.

        Args:
            path: The folder of the sharded index to write.
            shard_paths: The folders of finished MultiVectorIndexes, in document order.
            move: Whether to move the shards rather than copy them: their files are hard-linked (copied across file
                systems) and the shard folders removed once the sharded index is in place.
            overwrite: Whether to replace an existing sharded index (only once the new one is complete).
            verbose: Whether to show progress bars.

        Raises:
            FileExistsError: As :meth:`ShardedMultiVectorIndexer.index`.
            FileNotFoundError: If a shard path holds no finished MultiVectorIndex (named).
            CorruptIndexError: If a shard is damaged or not a MultiVectorIndex (a shard rebuilt while being copied
                is named when the sharded index is opened).
            ValueError: If no shards are given, shards differ in vector size or dtype, or a docno is in two shards.
        """
        if isinstance(shard_paths, (str, Path)):
            raise TypeError(f'shard_paths must be a list of shard folders, got the single path {str(shard_paths)!r}')
        sources = [Path(source) for source in shard_paths]
        if not sources:
            raise ValueError('no shards to assemble: shard_paths is empty')
        index = cls(path, verbose=verbose)
        with exclusive_lock(index.path):  # a concurrent build of the same path waits, then is refused
            index._assemble(sources, move, overwrite)
        if move:
            for source in sources:
                _remove(source)
        return index

    def _assemble(self, sources: List[Path], move: bool, overwrite: bool) -> None:
        _check_target(self.path, overwrite, ShardedMultiVectorIndex)
        labels = [repr(str(source)) for source in sources]
        shards = [MultiVectorIndex(source, verbose=False).payload() for source in sources]
        _check_same_vectors(shards, labels)
        _check_unique_across([docnos for _, _, _, docnos in shards], labels)
        names = [f'shard-{i:03d}' for i in range(len(sources))]
        steps = zip(sources, names)
        if self.verbose:
            steps = pt.tqdm(steps, total=len(names), desc='moving shards' if move else 'copying shards', unit='shard')
        with building(self.path) as tmp:
            tmp.mkdir()
            for source, name in steps:
                shutil.copytree(source, tmp / name, copy_function=_link_or_copy if move else shutil.copy2,
                                ignore=shutil.ignore_patterns('.*'))  # leftovers of killed FAISS builds
            _write_meta(tmp, names, [meta for meta, _, _, _ in shards])
        self._payload = None

    def add_documents(self, inp: Iterable[Dict]) -> 'ShardedMultiVectorIndex':
        """Adds documents (records as :meth:`index` takes) as a new shard after the others.

        The index is assembled again beside the old one, its shards hard-linked (nothing of them is copied) and the
        new shard written, and put in its place when complete: a search running meanwhile gets the whole index
        before or after, a kill leaves it as it was, and the rankings equal a fresh build's of the same documents in
        that order. :meth:`compact` merges the shards that updates leave small.

        Raises:
            ValueError: If a new docno is in the index already or occurs twice, or a record is malformed (as
                :meth:`MultiVectorIndex.index`); the index is then left as it was.
        """
        with exclusive_lock(self.path):
            meta, _, _, docnos = self.payload()
            shards, names = self.shards(), _shard_names(meta)

            def checked(records):
                for record in (records.to_dict(orient='records') if isinstance(records, pd.DataFrame) else records):
                    if isinstance(record.get('docno'), str) and docnos.inv[record['docno']] >= 0:
                        raise ValueError(f'docno {record["docno"]!r} is in the index at {str(self.path)!r} already: '
                                         'remove it first (remove_documents) to replace it; nothing was added')
                    yield record
            name = f'shard-{max(int(n.split("-")[-1]) for n in names if n.startswith("shard-")) + 1:03d}'

            def add(tmp: Path) -> List[str]:
                MultiVectorIndex(tmp / name, verbose=False).indexer(dtype=meta['dtype']).index(checked(inp))
                return [name]
            self._reassemble(shards, names, add)
        return self

    def remove_documents(self, docnos: Iterable[str]) -> 'ShardedMultiVectorIndex':
        """Removes documents by docno: the shards that hold them are written again without them (a shard left empty
        goes), the others hard-linked, and the whole put in place as :meth:`add_documents` does.

        Raises:
            KeyError: If a docno is not in the index (the index is then left as it was).
            ValueError: If every document would go.
        """
        removed = docno_set(docnos)
        with exclusive_lock(self.path):
            meta = self.payload()[0]
            shards, names = self.shards(), _shard_names(meta)
            held = [set(removed & set(shard.payload()[3].fwd[np.arange(len(shard))])) if removed else set()
                    for shard in shards]
            unknown = sorted(removed - set().union(*held))
            if unknown:
                raise KeyError(f'docno {unknown[0]!r} is not in the index at {str(self.path)!r} ({len(unknown)} '
                               'unknown docnos); nothing was removed')
            if sum(len(h) for h in held) == meta['doc_count']:
                raise ValueError(f'removing every document of the index at {str(self.path)!r}: an index holds at '
                                 'least one')
            self._reassemble(shards, names, None, rewrite={i: h for i, h in enumerate(held) if h})
        return self

    def compact(self, shard_size: int = None) -> 'ShardedMultiVectorIndex':
        """Writes the documents again into consecutive shards of ``shard_size`` (default: the indexer's), merging
        the small shards that updates add; rankings are unchanged. The whole is put in place when complete."""
        with exclusive_lock(self.path):
            meta = self.payload()[0]
            ShardedMultiVectorIndexer(self, shard_size=shard_size, dtype=meta['dtype'], overwrite=True)._index(
                self.get_corpus_iter(verbose=False))
        return self

    def _reassemble(self, shards: List[MultiVectorIndex], names: List[str], add, rewrite: Dict[int, set] = None):
        """Writes the index again at a temporary path and puts it in place: each shard hard-linked, or written
        again without the docnos of ``rewrite`` (left out where none remain), then the shards ``add(tmp)`` writes
        (it returns their names)."""
        rewrite = rewrite or {}
        with building(self.path) as tmp:
            tmp.mkdir()
            kept = []
            for i, (shard, name) in enumerate(zip(shards, names)):
                if i not in rewrite:
                    shutil.copytree(shard.path, tmp / name, copy_function=_link_or_copy,
                                    ignore=shutil.ignore_patterns('.*'))
                    kept.append(name)
                elif len(rewrite[i]) < len(shard):
                    _write_without(shard, rewrite[i], tmp / name)
                    kept.append(name)
            kept += add(tmp) if add is not None else []
            _write_meta(tmp, kept, [MultiVectorIndex(tmp / name, verbose=False).payload()[0] for name in kept])
        self._payload = None

    def index(self, inp: Iterable[Dict]) -> 'ShardedMultiVectorIndex':
        """Indexes ``{'docno', 'doc_embs'}`` records into shards of the default size (see :meth:`indexer`)."""
        return self.indexer().index(inp)

    def indexer(self, *, shard_size: Optional[int] = None, num_shards: Optional[int] = None, dtype: str = 'float32',
                processes: int = 1, overwrite: bool = False) -> 'ShardedMultiVectorIndexer':
        """An indexer that splits the corpus into consecutive shards (arguments as
        :class:`ShardedMultiVectorIndexer`)."""
        return ShardedMultiVectorIndexer(self, shard_size=shard_size, num_shards=num_shards, dtype=dtype,
                                         processes=processes, overwrite=overwrite)

    def ray_indexer(self, *, dtype: str = 'float32', overwrite: bool = False, num_cpus: float = 1,
                    address: Optional[str] = None):
        """An indexer whose Ray tasks write one shard each (arguments as :class:`RayShardedIndexer`; needs the
        ``ray`` extra). See docs/distributed.md."""
        return RayShardedIndexer(self, dtype=dtype, overwrite=overwrite, num_cpus=num_cpus, address=address)

    def __repr__(self):
        return f'ShardedMultiVectorIndex({str(self.path)!r})'


class ShardedMultiVectorIndexer(pt.Indexer):
    """Splits a stream of records into consecutive shards, the first ``shard_size`` documents into ``shard-000``,
    the next into ``shard-001``, ..., so that the sharded index keeps the corpus order; written into a temporary
    folder renamed when complete.

    With ``processes`` above 1, shards are written by that many worker processes at once (``multiprocessing``'s
    default start method): this process reads the corpus and sends each shard's records to its worker.
    """

    def __init__(self, index: ShardedMultiVectorIndex, *, shard_size: Optional[int] = None,
                 num_shards: Optional[int] = None, dtype: str = 'float32', processes: int = 1,
                 overwrite: bool = False):
        """
        Args:
            index: The sharded index to write.
            shard_size: Documents per shard (the last takes the rest); default 1,000,000 unless ``num_shards``.
            num_shards: Number of shards of (nearly) equal size; needs a corpus whose length is known (a list or
                a DataFrame).
            dtype: Storage type of the vectors, ``float32`` or ``float16``.
            processes: Shards written at once, each by its own process.
            overwrite: Whether to replace an existing sharded index (only once the new one is complete).
        """
        if shard_size is not None and num_shards is not None:
            raise ValueError(f'give shard_size or num_shards, not both (got {shard_size} and {num_shards})')
        for name, value in (('shard_size', shard_size), ('num_shards', num_shards), ('processes', processes)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f'{name} must be a positive integer, got {value!r}')
        if dtype not in _DTYPES:
            raise ValueError(f'dtype must be one of {list(_DTYPES)}, got {dtype!r}')
        self.index_ref = index
        self.shard_size = shard_size
        self.num_shards = num_shards
        self.dtype = dtype
        self.processes = processes
        self.overwrite = overwrite

    def index_inputs(self):
        return [['docno', 'doc_embs'], ['docno', 'doc_vec']]

    def index(self, inp: Iterable[Dict]) -> ShardedMultiVectorIndex:
        """Indexes the records and returns the finished sharded index.

        Raises:
            FileExistsError: As :meth:`MultiVectorIndexer.index`, for a sharded index.
            ValueError: If a record is malformed (as :meth:`MultiVectorIndexer.index`), a docno occurs in two
                shards, shards have vectors of different sizes, or ``num_shards`` is more than the documents.
        """
        with exclusive_lock(self.index_ref.path):  # a concurrent build of the same path waits, then is refused
            return self._index(inp)

    def _index(self, inp: Iterable[Dict]) -> ShardedMultiVectorIndex:
        path = self.index_ref.path
        _check_target(path, self.overwrite, ShardedMultiVectorIndex)
        if isinstance(inp, pd.DataFrame):
            inp = inp.to_dict(orient='records')
        sizes = itertools.repeat(self.shard_size or DEFAULT_SHARD_SIZE)
        if self.num_shards is not None:
            if not hasattr(inp, '__len__'):
                raise ValueError('num_shards needs a corpus of known length (a list or a DataFrame); give '
                                 'shard_size for an iterator')
            if self.num_shards > len(inp):
                raise ValueError(f'num_shards={self.num_shards} is more than the {len(inp)} documents')
            whole, rest = divmod(len(inp), self.num_shards)
            sizes = [whole + (k < rest) for k in range(self.num_shards)]
        records = iter(inp)
        if self.index_ref.verbose:   # a total where the input has a length (a corpus of known size)
            records = iter(pt.tqdm(inp, desc='indexing', unit='doc'))
        with building(path) as tmp:
            tmp.mkdir()
            groups = _consecutive(records, sizes)
            if self.processes == 1:
                names = []
                for group in groups:
                    names.append(f'shard-{len(names):03d}')
                    MultiVectorIndex(tmp / names[-1], verbose=False).indexer(dtype=self.dtype).index(group)
            else:
                names = _build_in_processes(groups, tmp, self.dtype, self.processes)
            if not names:
                raise ValueError('nothing to index: the input had no documents')
            _register_shards(tmp, names)
        self.index_ref._payload = None
        return self.index_ref

    def __repr__(self):
        size = f'num_shards={self.num_shards}' if self.num_shards else f'shard_size={self.shard_size}'
        return f'{self.index_ref!r}.indexer({size}, dtype={self.dtype!r}, processes={self.processes})'


class RayShardedIndexer:
    """Builds a sharded index with Ray tasks, one shard each, written into a temporary folder beside the index (on
    storage that every node writes to) and registered by renaming it once every shard is complete and checked: a
    failing task leaves nothing."""

    def __init__(self, index: ShardedMultiVectorIndex, *, dtype: str = 'float32', overwrite: bool = False,
                 num_cpus: float = 1, address: Optional[str] = None):
        """
        Args:
            index: The sharded index to write.
            dtype: Storage type of the vectors, ``float32`` or ``float16``.
            overwrite: Whether to replace an existing sharded index (only once the new one is complete).
            num_cpus: CPUs Ray reserves for each task.
            address: The Ray cluster to join (as :meth:`ShardedMultiVectorIndex.ray`); None starts a local one, and
                a Ray already initialised in this process is used as it is.
        """
        if dtype not in _DTYPES:
            raise ValueError(f'dtype must be one of {list(_DTYPES)}, got {dtype!r}')
        self.index_ref = index
        self.dtype = dtype
        self.overwrite = overwrite
        self.num_cpus = num_cpus
        self.address = address

    def index(self, parts: Iterable) -> ShardedMultiVectorIndex:
        """Indexes each part into its shard, in the order given (which numbers the documents).

        Args:
            parts: Each shard's ``{'docno', 'doc_embs'}`` records: a function that gives them, called in the task
                (so that each node reads its own part of the corpus), or the records themselves (a list or a
                DataFrame, sent to the task).

        Raises:
            FileExistsError: As :meth:`ShardedMultiVectorIndexer.index`.
            ValueError: If ``parts`` is empty, or as :meth:`ShardedMultiVectorIndexer.index` (a note names the
                task of the failing shard).
        """
        from pyterrier_multiquery.index.distributed import run_tasks
        path = self.index_ref.path
        _check_target(path, self.overwrite, ShardedMultiVectorIndex)
        parts = list(parts)
        if not parts:
            raise ValueError('nothing to index: no parts were given')
        names = [f'shard-{i:03d}' for i in range(len(parts))]
        with building(path) as tmp:
            tmp.mkdir()
            run_tasks(_index_part, [(str(tmp / name), part, self.dtype) for name, part in zip(names, parts)],
                      names, num_cpus=self.num_cpus, address=self.address, verbose=self.index_ref.verbose)
            _register_shards(tmp, names)
        self.index_ref._payload = None
        return self.index_ref

    def __repr__(self):
        return f'{self.index_ref!r}.ray_indexer(dtype={self.dtype!r})'


def _register_shards(folder: Path, names: List[str]) -> None:
    """Checks the shards built in ``folder`` (same vectors, docnos unique across them) and writes the metadata that
    makes them one sharded index."""
    shards = [MultiVectorIndex(folder / name, verbose=False).payload() for name in names]
    _check_same_vectors(shards, names)
    _check_unique_across([docnos for _, _, _, docnos in shards], names)
    _write_meta(folder, names, [meta for meta, _, _, _ in shards])


def _index_part(path: str, part, dtype: str) -> None:
    """A Ray task of :class:`RayShardedIndexer`: writes one shard."""
    records = part() if callable(part) else part
    MultiVectorIndex(path, verbose=False).indexer(dtype=dtype).index(records)


class ShardedVectors:
    """The stored vectors of several shards as one read-only ``(vec_count, dim)`` array, indexed by a slice of
    rows (read into memory) or an integer array of rows."""

    def __init__(self, parts: List[np.ndarray]):
        self.parts = parts
        self.bases = np.cumsum([0] + [len(part) for part in parts])
        self.shape = (int(self.bases[-1]), parts[0].shape[1])
        self.dtype = parts[0].dtype
        self.ndim = 2

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError('the vectors of a sharded index are read by consecutive rows or row arrays')
            pieces = [part[max(start - base, 0):max(stop - base, 0)] for part, base in zip(self.parts, self.bases)]
            return np.concatenate(pieces)
        rows = np.asarray(key)
        if rows.dtype.kind not in 'iu':
            raise IndexError(f'rows of a sharded index are a slice or an integer array, got {rows.dtype}')
        shard = np.searchsorted(self.bases, rows, side='right') - 1
        out = np.empty(rows.shape + (self.shape[1],), dtype=self.dtype)
        for i in np.unique(shard):
            inside = shard == i
            out[inside] = self.parts[i][rows[inside] - self.bases[i]]
        return out


class ShardedDocnos:
    """The docnos of several shards as one lookup: ``fwd[docids]`` and ``inv[docnos]`` (-1 for a docno no shard
    holds), as npids' :class:`~npids.Lookup`, over docids running on from shard to shard."""

    def __init__(self, lookups: list):
        self.lookups = lookups
        self.bases = np.cumsum([0] + [len(lookup) for lookup in lookups])
        self.fwd = _Indexed(self._forward)
        self.inv = _Indexed(self._inverse)

    def __len__(self):
        return int(self.bases[-1])

    def _forward(self, docids):
        if np.ndim(docids) == 0:
            shard = int(np.searchsorted(self.bases, docids, side='right')) - 1
            return self.lookups[shard].fwd[int(docids) - int(self.bases[shard])]
        docids = np.asarray(docids)
        shard = np.searchsorted(self.bases, docids, side='right') - 1
        out = np.empty(docids.shape, dtype=object)
        for i in np.unique(shard):
            inside = shard == i
            out[inside] = self.lookups[i].fwd[docids[inside] - self.bases[i]]
        return out.astype(str)

    def _inverse(self, docnos):
        if np.ndim(docnos) == 0:
            return int(self._inverse(np.array([docnos], dtype=str))[0])
        out = np.full(np.shape(docnos), -1, dtype=np.int64)
        for lookup, base in zip(self.lookups, self.bases):
            found = np.asarray(lookup.inv[docnos], dtype=np.int64)
            out[found >= 0] = found[found >= 0] + base
        return out


class _Indexed:
    """``obj[key]`` calls a function of the key."""

    def __init__(self, function):
        self.function = function

    def __getitem__(self, key):
        return self.function(key)


def _shard_names(meta: dict) -> List[str]:
    """The shard folders the metadata of a sharded index lists, checked: each once, each a folder inside it."""
    names, build_ids = meta.get('shards'), meta.get('shard_build_ids')
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names) \
            or not isinstance(build_ids, list) or len(build_ids) != len(names):
        raise CorruptIndexError(f'pt_meta.json of a sharded index must list its shard folders (shards) and their '
                                f'build ids (shard_build_ids), got {names!r} and {build_ids!r}')
    for i, name in enumerate(names):
        if name in ('', '.', '..') or '/' in name or '\\' in name or '\0' in name:
            raise CorruptIndexError(f'pt_meta.json of a sharded index lists the shard {name!r}, but {name!r} is not '
                                    'a folder inside the index')
        if name in names[:i]:
            raise CorruptIndexError(f'pt_meta.json of a sharded index lists the shard {name!r} more than once')
    return names


def _check_counts(meta: dict, metas: List[dict]) -> None:
    """Raises unless the counts, vector size and storage of a sharded index's metadata are its shards' ``metas``."""
    for key, verb in (('doc_count', 'hold'), ('vec_count', 'hold'), ('dim', 'have'), ('dtype', 'have')):
        found = sum(m[key] for m in metas) if key.endswith('count') else metas[0][key]
        if meta[key] != found or any(m[key] != metas[0][key] for m in metas if not key.endswith('count')):
            raise CorruptIndexError(f'pt_meta.json of the sharded index gives {key} {meta[key]!r} where its shards '
                                    f'{verb} {found!r}')


def _consecutive(records: Iterator[Dict], sizes: Iterable[int]) -> Iterator[Iterator[Dict]]:
    """Consecutive groups of ``sizes`` records (while records last), each read lazily, one after the other."""
    for size in sizes:
        group = more_itertools.peekable(itertools.islice(records, size))
        if not group:
            return
        yield group
        more_itertools.consume(group)


def _check_same_vectors(shards: list, names: List[str]) -> None:
    """Raises naming the first shard whose vectors differ in size or storage type from the first shard's."""
    dim, dtype = shards[0][0]['dim'], shards[0][0]['dtype']
    for (meta, _, _, docnos), name in zip(shards, names):
        if meta['dim'] != dim:
            raise ValueError(f'the documents of {name} (from {str(docnos.fwd[0])!r} on) have vectors of size '
                             f'{meta["dim"]}, expected {dim} as the earlier documents')
        if meta['dtype'] != dtype:
            raise ValueError(f'the documents of {name} (from {str(docnos.fwd[0])!r} on) are stored as '
                             f'{meta["dtype"]}, expected {dtype} as the earlier documents')


def _write_meta(folder: Path, names: List[str], metas: List[dict]) -> None:
    """Writes the ``pt_meta.json`` of a sharded index whose shard folders ``names`` have the metadata ``metas``."""
    meta = {'type': ShardedMultiVectorIndex.ARTIFACT_TYPE, 'format': ShardedMultiVectorIndex.ARTIFACT_FORMAT,
            'package_hint': 'pyterrier-multiquery', 'dtype': metas[0]['dtype'], 'dim': metas[0]['dim'],
            'doc_count': sum(m['doc_count'] for m in metas), 'vec_count': sum(m['vec_count'] for m in metas),
            'build_id': uuid.uuid4().hex, 'shards': names, 'shard_build_ids': [m['build_id'] for m in metas]}
    (folder / 'pt_meta.json').write_text(json.dumps(meta))


def _write_without(shard: MultiVectorIndex, removed: set, path: Path) -> None:
    """Writes the documents of ``shard`` but ``removed``, in order and in its storage type, as an index at ``path``."""
    payload = shard.payload()
    present = np.asarray(payload[3].fwd[np.arange(len(shard))], dtype=object)
    keep = np.flatnonzero(~np.isin(present, list(removed)))
    MultiVectorIndex(path, verbose=False).indexer(dtype=payload[0]['dtype'])._write(
        stored_chunks(payload, keep, present))


def _link_or_copy(source: str, target: str) -> str:
    """Hard-links a file, or copies it where the two paths are on different file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return target


def _check_unique_across(lookups: list, names: List[str], chunk: int = 1 << 16) -> None:
    """Raises naming the first docno that two shards hold."""
    for later in range(1, len(lookups)):
        for start in range(0, len(lookups[later]), chunk):
            docnos = lookups[later].fwd[np.arange(start, min(len(lookups[later]), start + chunk))]
            for earlier in range(later):
                found = np.asarray(lookups[earlier].inv[docnos]) >= 0
                if found.any():
                    raise ValueError(f'docno {str(docnos[int(np.argmax(found))])!r} occurs in {names[earlier]} and '
                                     f'{names[later]}; docnos must be unique across the shards')


def _build_in_processes(groups: Iterator[Iterator[Dict]], folder: Path, dtype: str, processes: int) -> List[str]:
    """Writes each group of records into its shard folder, in up to ``processes`` worker processes at once."""
    context = multiprocessing.get_context()
    errors = context.Queue()
    names, running = [], []
    try:
        for group in groups:
            names.append(f'shard-{len(names):03d}')
            while len(running) >= processes:
                _finish(*running.pop(0), errors)
            records = context.Queue(maxsize=8)
            worker = context.Process(target=_write_shard, daemon=True,
                                     args=(folder / names[-1], dtype, records, errors, os.getpid()))
            worker.start()
            running.append((worker, names[-1]))
            for batch in more_itertools.chunked(group, 256):
                _send(records, [_vectors_only(record) for record in batch], worker, names[-1], errors)
            _send(records, None, worker, names[-1], errors)
        while running:
            _finish(*running.pop(0), errors)
    finally:
        for worker, _ in running:
            worker.terminate()
            worker.join()
    return names


def _write_shard(path: Path, dtype: str, records, errors, parent: int) -> None:
    """A worker process: indexes the batches of records that arrive until None; reports an error and exits 1.

    It dies with ``parent``, the process sending the records, whatever it is doing (a worker killed half-way
    leaves only its temporary folder, inside the parent's, which the next build removes). Where the system cannot
    tie the two, it checks every second that it waits for records that ``parent`` is alive, and exits once it is not.
    """
    exit_with_parent(parent)
    def stream():
        while True:
            try:
                batch = records.get(timeout=1)
            except queue.Empty:
                if os.getppid() != parent:
                    raise SystemExit(1) from None
                continue
            if batch is None:
                return
            yield from batch
    try:
        MultiVectorIndex(path, verbose=False).indexer(dtype=dtype).index(stream())
    except Exception as e:
        errors.put(e)
        raise SystemExit(1) from None


def _vectors_only(record: Dict) -> Dict:
    return {key: record[key] for key in ('docno', 'doc_embs', 'doc_vec') if key in record}


def _send(records, item, worker, name: str, errors) -> None:
    while True:
        try:
            records.put(item, timeout=1)
            return
        except queue.Full:
            if not worker.is_alive():
                _finish(worker, name, errors)
                raise RuntimeError(f'the process writing {name} stopped before it read all its documents') from None


def _finish(worker, name: str, errors) -> None:
    """Waits for a worker; raises the error it reported, if it failed."""
    worker.join()
    if worker.exitcode != 0:
        try:
            error = errors.get(timeout=10)
        except queue.Empty:
            error = RuntimeError(f'the process writing {name} exited with code {worker.exitcode}')
        raise error
