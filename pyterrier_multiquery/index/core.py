"""On-disk storage of the MultiVectorIndex: a variable number of vectors per document, memory-mapped."""
import collections
import hashlib
import itertools
import json
import math
import os
import re
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple, TypeVar, Union

import more_itertools
import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from pyterrier_multiquery._files import building, exclusive_lock, file_sha256
from pyterrier_multiquery._transformer import DerivedIdentity, check_positive
from pyterrier_multiquery.index.errors import CorruptIndexError, IndexReplacedError
from pyterrier_multiquery.index.searches import Searches

_DTYPES = {'float32': ('vecs.f4', np.float32), 'float16': ('vecs.f2', np.float16)}
_CHECKED_AT_OPEN = ('offsets.i8', 'docnos.npids')  # the vectors are checked by verify(): it reads the whole corpus
T = TypeVar('T')


class SearchableIndex(Searches, DerivedIdentity):
    """The factory of searches over an index whose ``payload()`` gives ``(meta, vectors, offsets, docnos)`` and whose
    ``shards()`` gives the MultiVectorIndexes holding its documents, as pyterrier_dr's FlexIndex: the searches of
    :class:`~.searches.Searches` (``retriever()``, ``scorer()``, ...), ``docnos()`` and ``get_corpus_iter()``. Two
    indexes of one class at one path are equal."""

    def __len__(self):
        return self.payload()[0]['doc_count']

    def built(self) -> bool:
        """Whether a finished index is at ``path``."""
        return (self.path / 'pt_meta.json').exists()

    def docnos(self):
        """The docno lookup of the documents in index order: ``docnos().fwd[i]`` is the docno of document ``i``,
        ``docnos().inv[docno]`` its position (an :class:`npids.Lookup`)."""
        return self.payload()[3]

    def get_corpus_iter(self, *, verbose: bool = True) -> Iterator[Dict]:
        """Yields every document as ``{'docno', 'doc_embs'}`` (float32, read one document at a time), in index
        order: what the indexer was given, so another index can be built from this one.

        Args:
            verbose: Whether to show a progress bar.
        """
        _, vectors, offsets, docnos = self.payload()
        documents = range(len(offsets) - 1)
        if verbose:
            documents = pt.tqdm(documents, desc=f'{self!r} corpus', unit='doc')
        for i in documents:
            yield {'docno': docnos.fwd[i], 'doc_embs': np.asarray(vectors[offsets[i]:offsets[i + 1]], dtype=np.float32)}

    def searchers(self):
        """The shards' searchers in this process (:class:`~.shardwise.LocalShards`), kept while the index is
        unchanged: every retriever searches through them."""
        from pyterrier_multiquery.index.shardwise import LocalShards
        meta = self.payload()[0]
        if getattr(self, '_searchers', None) is None or self._searchers.meta is not meta:
            self._searchers = LocalShards(self)
        return self._searchers

    def ray(self, num_actors: Optional[int] = None, *, address: Optional[str] = None, **kwargs):
        """This index searched by Ray actors, each holding some of its shards (arguments as
        :class:`~.distributed.RayIndex`; needs the ``ray`` extra). See docs/distributed.md."""
        from pyterrier_multiquery.index.distributed import RayIndex
        return RayIndex(self, num_actors=num_actors, address=address, **kwargs)

    def verify(self) -> None:
        """Checks every file of the index against its checksum, reading all of them: the vectors and the FAISS
        files too, which opening the index does not read.

        Raises:
            FileNotFoundError: If no finished index is at ``path``, or a file is missing.
            CorruptIndexError: Naming the first file that changed since it was written.
        """
        from pyterrier_multiquery.index.ann import check_ann_file
        for shard in self.shards():
            meta = shard.payload()[0]
            vectors = _DTYPES[meta['dtype']][0]
            check_sha256(shard.path / vectors, meta['sha256'][vectors], 'the index was built')
            for ann in sorted(shard.path.glob('ann.*.faiss')):
                check_ann_file(ann, meta['build_id'])

    def bytes_per_vector(self) -> int:
        """Bytes that one stored vector takes on disk."""
        meta = self.payload()[0]
        return meta['dim'] * np.dtype(_DTYPES[meta['dtype']][1]).itemsize


class MultiVectorIndex(SearchableIndex, pta.Artifact, pt.Indexer):
    """A multi-vector dense index: each document keeps its own rows of vectors (one or more).

    Files: ``pt_meta.json``; ``vecs.f4`` (or ``vecs.f2``), all vectors one after another; ``offsets.i8``, where the
    vectors of document ``i`` are rows ``offsets[i]:offsets[i+1]``; ``docnos.npids``. Vectors are memory-mapped,
    so neither indexing nor retrieval holds the corpus in memory.
    """
    ARTIFACT_TYPE = 'multi_vector_index'
    ARTIFACT_FORMAT = 'mvi'

    def __init__(self, path: Union[str, Path], *, verbose: bool = True):
        """
        Args:
            path: The index folder.
            verbose: Whether to show progress bars.
        """
        super().__init__(path)
        self.path = Path(path)
        self.verbose = verbose
        self._payload = None
        self._meta_bytes = None

    def payload(self):
        """Loads and checks the index files, again whenever ``pt_meta.json`` shows the index was rebuilt.

        Returns:
            ``(meta, vectors, offsets, docnos)``: the metadata dict, the memory-mapped ``(vec_count, dim)`` vectors,
            the ``doc_count + 1`` offsets and the docno :class:`npids.Lookup`.

        Raises:
            FileNotFoundError: If no finished index is at ``path``.
            CorruptIndexError: If a file is truncated or disagrees with the metadata.
        """
        raw = _meta_bytes(self.path)  # checked where it differs from the bytes of the open build (open_whole)
        if self._payload is None or raw != self._meta_bytes:
            self._payload, self._meta_bytes = open_whole(self.path, MultiVectorIndex,
                                                         lambda meta: _load(self.path, meta))
        return self._payload

    def shards(self) -> List['MultiVectorIndex']:
        """The indexes whose documents this one holds, in order: itself (a :class:`ShardedMultiVectorIndex` has
        several)."""
        return [self]

    def index(self, inp: Iterable[Dict]) -> 'MultiVectorIndex':
        """Indexes ``{'docno', 'doc_embs'}`` records (``doc_vec`` is taken as one row) into a new index at ``path``."""
        return self.indexer().index(inp)

    def add_documents(self, inp: Iterable[Dict]) -> 'MultiVectorIndex':
        """Adds documents (records as :meth:`index` takes) after the index's own.

        The index is written again, its documents in order and then the new ones, exactly as a fresh build of all of
        them would be (so rankings equal a fresh build's), beside the old one, and put in its place when complete: a
        search running meanwhile gets the whole index before or after (it retries once on the new build), and a
        process killed during the update leaves the index as it was. Each update writes every vector once, so the
        index stays compact with no separate compaction (its FAISS stage is made again on first use, and its
        calibration by ``calibrate()``: a new build has none); the sharded index adds a shard instead.

        Raises:
            ValueError: If a new docno is in the index already or occurs twice among the new ones, or a record is
                malformed (as :meth:`index`); the index is then left as it was.
        """
        return self.indexer(overwrite=True).update(added=inp)

    def remove_documents(self, docnos: Iterable[str]) -> 'MultiVectorIndex':
        """Removes documents by docno, as :meth:`add_documents` adds them (a whole new build put in place).

        Raises:
            KeyError: If a docno is not in the index (the index is then left as it was).
            ValueError: If every document would go (an index holds at least one).
        """
        return self.indexer(overwrite=True).update(removed=docnos)

    def indexer(self, *, dtype: str = 'float32', overwrite: bool = False) -> 'MultiVectorIndexer':
        """An indexer for this index.

        Args:
            dtype: Storage type of the vectors, ``float32`` or ``float16``.
            overwrite: Whether to replace an existing MultiVectorIndex (only once the new one is complete); a
                folder that is not one is never replaced.
        """
        return MultiVectorIndexer(self, dtype=dtype, overwrite=overwrite)

    def __repr__(self):
        return f'MultiVectorIndex({str(self.path)!r})'


class MultiVectorIndexer(pt.Indexer):
    """Writes a MultiVectorIndex from a stream of records, into a temporary folder renamed when complete."""

    def __init__(self, index: MultiVectorIndex, *, dtype: str = 'float32', overwrite: bool = False):
        if dtype not in _DTYPES:
            raise ValueError(f'dtype must be one of {list(_DTYPES)}, got {dtype!r}')
        self.index_ref = index
        self.dtype = dtype
        self.overwrite = overwrite

    def index_inputs(self):
        return [['docno', 'doc_embs'], ['docno', 'doc_vec']]

    def index(self, inp: Iterable[Dict]) -> MultiVectorIndex:
        """Indexes the records and returns the finished index.

        Raises:
            FileExistsError: If ``path`` holds an index and ``overwrite`` is False, or holds anything else that is
                not an empty folder (``overwrite`` only ever replaces a MultiVectorIndex).
            ValueError: If a record is malformed: a docno that is not a non-empty string or occurs twice, vectors
                that are not a non-empty 2-D array of finite numbers of the same size as the other documents'.
            KeyError: If a record has no ``docno``, or neither ``doc_embs`` nor ``doc_vec``.
        """
        with exclusive_lock(self.index_ref.path):  # a concurrent build of the same path waits, then is refused
            return self._index(inp)

    def _index(self, inp: Iterable[Dict]) -> MultiVectorIndex:
        if isinstance(inp, pd.DataFrame):
            inp = inp.to_dict(orient='records')
        total = len(inp) if hasattr(inp, '__len__') else None
        inp = more_itertools.peekable(inp)
        if not inp:
            raise ValueError('nothing to index: the input had no documents')
        if self.index_ref.verbose:
            inp = pt.tqdm(inp, desc='indexing', unit='doc', total=total)
        dtype = _DTYPES[self.dtype][1]
        return self._write(([docno], _stored_document(_record_embs(record, docno), docno, dtype), None)
                           for record in inp for docno in [_record_docno(record)])

    def index_arrays(self, docnos, vectors: np.ndarray, lengths, *, chunk_docs: int = 1 << 16) -> MultiVectorIndex:
        """Indexes documents given as arrays, in bulk: a chunk of documents at a time, with no record per document.

        Args:
            docnos: The documents' docnos (strings), in order.
            vectors: ``(vectors, dim)`` all documents' vectors one after another (a memory map is read a chunk at a
                time).
            lengths: Each document's number of vectors (positive, summing to ``len(vectors)``).
            chunk_docs: Documents checked and written together.

        Raises:
            ValueError: As :meth:`index`, and if the lengths do not add up to the vectors.
        """
        check_positive(chunk_docs=chunk_docs)
        docnos, lengths = np.asarray(docnos, dtype=object), np.asarray(lengths, dtype=np.int64)
        vectors = np.asarray(vectors)  # a view of a memory map, not a copy: nothing is read here
        if vectors.ndim != 2 or len(docnos) != len(lengths) or len(lengths) == 0 or (lengths < 1).any() or \
                lengths.sum() != len(vectors):
            raise ValueError(f'index_arrays needs as many docnos as lengths (got {len(docnos)} and {len(lengths)}), '
                             f'each length positive, adding up to the rows of a 2-D vectors array (got '
                             f'{int(lengths.sum())} and shape {vectors.shape})')
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        with exclusive_lock(self.index_ref.path):
            starts = range(0, len(docnos), chunk_docs)
            if self.index_ref.verbose:
                starts = pt.tqdm(starts, desc='indexing', unit='chunk')
            return self._write((docnos[a:a + chunk_docs],
                                _checked_block(vectors[offsets[a]:offsets[min(a + chunk_docs, len(docnos))]],
                                               docnos[a:a + chunk_docs], lengths[a:a + chunk_docs],
                                               _DTYPES[self.dtype][1]),
                                lengths[a:a + chunk_docs]) for a in starts)

    def update(self, *, added: Iterable[Dict] = (), removed: Iterable[str] = ()) -> MultiVectorIndex:
        """Writes the index again without the ``removed`` docnos and with the ``added`` records after its own
        documents, in its own storage type, and puts it in place when complete (see
        :meth:`MultiVectorIndex.add_documents`)."""
        with exclusive_lock(self.index_ref.path):
            payload = self.index_ref.payload()
            meta, docnos = payload[0], payload[3]
            present = np.asarray(docnos.fwd[np.arange(meta['doc_count'])], dtype=object)
            removed = docno_set(removed)
            unknown = sorted(removed - set(present))
            if unknown:
                raise KeyError(f'docno {unknown[0]!r} is not in the index at {str(self.index_ref.path)!r} '
                               f'({len(unknown)} unknown docnos); nothing was removed')
            keep = np.flatnonzero(~np.isin(present, list(removed)))
            added = more_itertools.peekable(added.to_dict(orient='records') if isinstance(added, pd.DataFrame)
                                            else added)
            if not len(keep) and not added:
                raise ValueError(f'removing every document of the index at {str(self.index_ref.path)!r}: an index '
                                 'holds at least one')
            self.dtype = meta['dtype']
            kept = set(present[keep])

            def new_chunks():
                for record in added:
                    docno = _record_docno(record)
                    if docno in kept:
                        raise ValueError(f'docno {docno!r} is in the index at {str(self.index_ref.path)!r} already: '
                                         'remove it first (remove_documents) to replace it; nothing was added')
                    yield [docno], _stored_document(_record_embs(record, docno), docno, _DTYPES[self.dtype][1]), None

            return self._write(itertools.chain(stored_chunks(payload, keep, present), new_chunks()))

    def _write(self, chunks) -> MultiVectorIndex:
        """Writes ``(docnos, vectors, lengths)`` chunks (lengths None: one document) to a new index, renamed into
        place when complete."""
        path = self.index_ref.path
        _check_target(path, self.overwrite)
        file_name = _DTYPES[self.dtype][0]
        dim, offsets, max_square = None, [0], 0.0
        vectors_sha256 = hashlib.sha256()
        with building(path) as tmp:
            tmp.mkdir()
            with open(tmp / file_name, 'wb') as vecs, _docno_builder(tmp / 'docnos.npids') as docno_file, \
                    _hashed_writes(vecs, vectors_sha256) as write:
                for docnos, (embs, square), lengths in chunks:
                    if dim is None:
                        dim = embs.shape[1]
                    elif embs.shape[1] != dim:
                        raise ValueError(f'document {docnos[0]!r} has vectors of size {embs.shape[1]}, expected {dim} '
                                         'as the earlier documents')
                    max_square = max(max_square, square)
                    write(memoryview(np.ascontiguousarray(embs)).cast('B'))
                    if lengths is None:  # one document, its docno checked
                        docno_file.add(docnos[0])
                        offsets.append(offsets[-1] + len(embs))
                    else:
                        for docno in docnos:
                            docno_file.add(_record_docno({'docno': docno}))
                        offsets.extend((offsets[-1] + np.cumsum(lengths)).tolist())
            offsets = np.asarray(offsets, dtype=np.int64)
            _check_unique(tmp / 'docnos.npids', len(offsets) - 1)
            offsets.tofile(tmp / 'offsets.i8')
            meta = {'type': MultiVectorIndex.ARTIFACT_TYPE, 'format': MultiVectorIndex.ARTIFACT_FORMAT,
                    'package_hint': 'pyterrier-multiquery', 'dtype': self.dtype, 'dim': dim,
                    'doc_count': len(offsets) - 1, 'vec_count': int(offsets[-1]), 'max_norm': math.sqrt(max_square),
                    'build_id': uuid.uuid4().hex,
                    'sha256': {file_name: vectors_sha256.hexdigest(),
                               **{name: file_sha256(tmp / name) for name in _CHECKED_AT_OPEN}}}
            (tmp / 'pt_meta.json').write_text(json.dumps(meta))
        self.index_ref._payload = None
        return self.index_ref

    def __repr__(self):
        return f'{self.index_ref!r}.indexer(dtype={self.dtype!r}, overwrite={self.overwrite!r})'


def document_rows(offsets: np.ndarray, docids: np.ndarray) -> np.ndarray:
    """The rows of the stored vectors of the documents ``docids``, one document after another."""
    lengths = offsets[docids + 1] - offsets[docids]
    return np.repeat(offsets[docids] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))


def stored_chunks(payload, docids: np.ndarray, docnos: np.ndarray, chunk_docs: int = 1 << 16):
    """The documents ``docids`` of an index's ``payload``, with their ``docnos``, as the chunks
    :meth:`MultiVectorIndexer._write` writes, in the index's storage type, a chunk of documents at a time."""
    meta, vectors, offsets, _ = payload
    offsets = np.asarray(offsets)
    for a in range(0, len(docids), chunk_docs):
        ids = docids[a:a + chunk_docs]
        lengths = offsets[ids + 1] - offsets[ids]
        yield docnos[ids], _checked_block(vectors[document_rows(offsets, ids)], docnos[ids], lengths,
                                          _DTYPES[meta['dtype']][1]), lengths


def _check_target(path: Path, overwrite: bool, artifact: type = None) -> None:
    """Raises unless an index may be written at ``path``: nothing there, an empty folder, or (with ``overwrite``)
    an index of the class ``artifact`` (default: MultiVectorIndex)."""
    artifact = artifact or MultiVectorIndex
    if not os.path.lexists(path) or (path.is_dir() and not any(path.iterdir())):
        return
    if not path.is_dir():
        raise FileExistsError(f'{str(path)!r} is a file, not an index folder; choose another path for the index')
    try:
        _read_meta(path, artifact)
    except FileNotFoundError:
        raise FileExistsError(f'{str(path)!r} is a folder that is not a {artifact.__name__} (it has no '
                              'pt_meta.json); choose another path: overwrite=True only replaces an index') from None
    except CorruptIndexError as e:
        raise FileExistsError(f'{str(path)!r} is not a readable {artifact.__name__} ({e}); overwrite=True only '
                              'replaces an index: remove the folder yourself if it can go') from None
    if not overwrite:
        raise FileExistsError(f'an index already exists at {str(path)!r}; use indexer(overwrite=True) to replace it')


def docno_set(docnos: Iterable[str]) -> set:
    """The docnos to remove, as strings; a single string is refused (its characters would be taken for docnos)."""
    if isinstance(docnos, (str, bytes)):
        raise TypeError(f'docnos must be a list of docnos, got the single string {docnos!r}: pass [{docnos!r}]')
    return {str(d) for d in docnos}


#: Blocks of at least this many bytes are written and hashed in the background (:func:`_hashed_writes`); a
#: document's few vectors are written at once, a thread's hand-over costing more than their write.
BACKGROUND_BYTES = 1 << 20


@contextmanager
def _hashed_writes(file, sha256) -> Iterator[Callable[[memoryview], None]]:
    """Yields the function that appends a block of bytes to ``file`` and to the ``sha256`` digest, in order.

    A large block (:data:`BACKGROUND_BYTES`) is written and hashed by a background thread while the caller prepares
    the next one: both release the GIL, so a bulk build's disk and hashing time overlaps its conversions and docnos.
    At most two blocks wait at once; a block may be written after its append returns, so the caller must not change
    it (it appends arrays of its own). A failed write raises at a later append or where the ``with`` block ends, which
    waits for every write."""
    def write(data: memoryview) -> None:
        file.write(data)
        sha256.update(data)

    pending = collections.deque()

    def append(data: memoryview) -> None:
        if len(data) < BACKGROUND_BYTES and not pending:
            write(data)
            return
        pending.append(pool.submit(write, data))
        while len(pending) > 2 or (pending and pending[0].done()):
            pending.popleft().result()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix='index-writer') as pool:
        yield append
        while pending:
            pending.popleft().result()


@contextmanager
def _docno_builder(path: Path):
    """npids' Lookup builder, with its fixed-bytes codec kept from storing ids of zero bytes.

    npids 0.1.3 strips the prefix shared by a block's ids; a block of one id (a one-document index, or the last
    document when it opens a new block) becomes all prefix, and reading the zero-width records back divides by
    zero. It also cuts the prefix inside a multi-byte character ('é' and 'è' share one byte), which it cannot
    decode. The codec here keeps at least the last byte of each id out of the prefix and ends the prefix on a
    whole character; the file format is unchanged. Its ``intsequence`` codec is left out: where a run of ids such
    as ``d0`` ... ``d499`` is followed by a block of one other id (``d99999``: a document added later), the inverse
    lookup it leads to misses that id; the ``intsequencepad`` and stored-integer codecs still pack numeric ids.
    """
    from npids import Lookup
    from npids.codecs import FwdFixedBytes

    class WholeCharacterFixedBytes(FwdFixedBytes):
        def seed(self, id):
            super().seed(id)
            self.prefix = self.prefix[:self.length - 1]
            while self.prefix and not _decodes(self.prefix):
                self.prefix = self.prefix[:-1]
            return True

    with Lookup.builder(path) as builder:
        builder.formats[FwdFixedBytes.NAME] = WholeCharacterFixedBytes()
        del builder.formats['intsequence'], builder.formats['intsequencepad']
        builder.seeded_formats = builder.formats.copy()
        yield builder


def _decodes(prefix: bytes) -> bool:
    try:
        prefix.decode()
    except UnicodeDecodeError:
        return False
    return True


def _record_docno(record: Dict) -> str:
    if 'docno' not in record:
        raise KeyError(f'a document has no docno; found {sorted(record)}')
    docno = record['docno']
    if not isinstance(docno, str) or not docno or '\0' in docno:
        raise ValueError(f'docno {docno!r} ({type(docno).__name__}) is not a non-empty string without NUL characters; '
                         'docnos are strings in PyTerrier: convert them with str()')
    return docno


def _record_embs(record: Dict, docno: str) -> np.ndarray:
    column = 'doc_embs' if 'doc_embs' in record else 'doc_vec'
    if column not in record:
        raise KeyError(f'document {docno!r} has neither doc_embs nor doc_vec; found {sorted(record)}')
    try:
        embs = np.asarray(record[column], dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ValueError(f'document {docno!r}: {column} is not an array of numbers ({e})') from None
    if column == 'doc_vec':
        embs = embs.reshape(1, -1)
    if embs.ndim != 2 or embs.shape[0] == 0 or embs.shape[1] == 0:
        raise ValueError(f'document {docno!r}: doc_embs must be a non-empty 2-D array, got shape {embs.shape}')
    return embs


def _stored_document(embs: np.ndarray, docno: str, dtype) -> Tuple[np.ndarray, float]:
    """A document's vectors converted to the storage ``dtype`` and their largest squared norm (as
    :func:`_checked_block`, for a few vectors: fewer NumPy calls)."""
    stored = _converted(embs, dtype)
    if stored is embs:  # the caller's array, which its generator may refill while this one waits to be written
        stored = embs.copy()
    if not np.isfinite(stored).all():
        raise _non_finite(docno, dtype)
    wide = stored.astype(np.float64)
    return stored, float((wide * wide).sum(axis=1).max())


def _non_finite(docno: str, dtype) -> ValueError:
    beyond = ', or beyond float16' if dtype == np.float16 else ''
    return ValueError(f'document {docno!r} has non-finite values (NaN or inf{beyond}) in its vectors; '
                      'remove or repair it before indexing')


def _checked_block(embs: np.ndarray, docnos, lengths: np.ndarray, dtype) -> Tuple[np.ndarray, float]:
    """Documents' vectors (``lengths`` rows each) converted to the storage ``dtype`` (:func:`_converted`), and the
    largest squared norm of the converted rows, in float64; raises naming the first document with a value that is
    not finite (or, in float16, out of range)."""
    embs = np.asarray(embs)
    stored = _converted(embs, dtype)
    narrow = stored if dtype == np.float32 else _converted(embs, np.float32)
    with np.errstate(over='ignore', invalid='ignore'):
        squares = np.einsum('ij,ij->i', narrow, narrow)  # within gamma_dim of the exact sums (positive terms)
    suspect = ~np.isfinite(squares)
    if dtype == np.float16:
        suspect |= squares >= 65504.0 ** 2  # a value beyond float16's range
    finite = np.ones(len(stored), dtype=bool)
    finite[suspect] = np.isfinite(stored[suspect]).all(axis=1)
    if not finite.all():
        raise _non_finite(docnos[int(np.searchsorted(np.cumsum(lengths), np.argmin(finite), side='right'))], dtype)
    # the rows whose stored norm may be the largest: float16 moves each value by up to 2^-11 of itself, unless the
    # squares are of the stored values (given in float16, whose products float32 holds exactly)
    rounded = dtype == np.float16 and embs.dtype != dtype
    slack = 4 * embs.shape[1] * 2.0 ** -24 + (2.0 ** -9 if rounded else 0.0)
    top = squares.max()
    candidates = np.flatnonzero(squares >= top * (1 - slack) / (1 + slack)) if np.isfinite(top) else \
        np.arange(len(stored))
    return stored, _largest_square(stored, candidates)


def _converted(embs: np.ndarray, dtype) -> np.ndarray:
    """``embs`` in ``dtype``: as it is where it is in ``dtype`` already; a large block converted by torch where it is
    installed (many times as fast as NumPy to and from float16; on a document's few vectors, slower to call)."""
    if embs.dtype == dtype:
        return embs
    if embs.size >= 1 << 16:
        try:
            import torch
        except ModuleNotFoundError:
            pass
        else:
            with warnings.catch_warnings():  # a read-only memory map: torch reads it to convert, never writes
                warnings.filterwarnings('ignore', message='The given NumPy array is not writable')
                source = torch.from_numpy(np.ascontiguousarray(embs))
            return source.to(getattr(torch, np.dtype(dtype).name)).numpy()
    with np.errstate(over='ignore'):  # values beyond float16 become inf, reported by the caller
        return embs.astype(dtype)


def _largest_square(stored: np.ndarray, rows: np.ndarray, step: int = 1024) -> float:
    """The largest squared norm of the rows ``rows`` of ``stored``, summed in float64, ``step`` rows at a time:
    unit-normalised vectors make every row of a block a candidate, and a float64 copy of the whole block took
    three times as long (its memory, not its arithmetic)."""
    largest = 0.0
    for start in range(0, len(rows), step):
        wide = stored[rows[start:start + step]].astype(np.float64)
        largest = max(largest, float((wide * wide).sum(axis=1).max()))
    return largest


def _check_unique(path: Path, count: int, chunk: int = 1 << 16) -> None:
    """Raises naming the first docno that occurs twice (each docno must look up its own position)."""
    from npids import Lookup
    with Lookup(path) as lookup:
        for start in range(0, count, chunk):
            ids = np.arange(start, min(count, start + chunk))
            found = np.asarray(lookup.inv[lookup.fwd[ids]])
            if (found != ids).any():
                first = int(np.argmax(found != ids))
                raise ValueError(f'docno {str(lookup.fwd[int(ids[first])])!r} occurs more than once (documents '
                                 f'{min(found[first], ids[first])} and {max(found[first], ids[first])}); '
                                 'docnos must be unique')


def check_sha256(file: Path, expected: str, since: str) -> None:
    """Raises naming ``file`` unless its SHA-256 is ``expected``.

    Args:
        file: The file.
        expected: Its SHA-256 when written, as hex.
        since: When it was written, for the message (``the index was built``).
    """
    if not file.is_file():
        raise FileNotFoundError(f'{str(file)!r} is missing: the index is incomplete; rebuild it')
    if file_sha256(file) != expected:
        raise CorruptIndexError(f'{str(file)!r}: its SHA-256 differs from the one in pt_meta.json: the file changed '
                                f'since {since}; rebuild it')


def _read_meta(path: Path, artifact: type = None) -> Tuple[dict, bytes]:
    """``pt_meta.json`` of an index of the class ``artifact`` (default: MultiVectorIndex), checked, and its raw bytes
    (which change with every build)."""
    artifact = artifact or MultiVectorIndex
    meta_file = path / 'pt_meta.json'
    raw = _meta_bytes(path, artifact)
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptIndexError(f'{str(meta_file)!r} is not valid JSON: {e}') from None
    if not isinstance(meta, dict):
        raise CorruptIndexError(f'{str(meta_file)!r} holds a JSON {type(meta).__name__}, not an object')
    if (meta.get('type'), meta.get('format')) != (artifact.ARTIFACT_TYPE, artifact.ARTIFACT_FORMAT):
        raise CorruptIndexError(f'{str(meta_file)!r} names a {meta.get("type")}/{meta.get("format")} artifact, '
                                f'not a {artifact.__name__}')
    if meta.get('dtype') not in _DTYPES:
        raise CorruptIndexError(f'{str(meta_file)!r} names dtype {meta.get("dtype")!r}; '
                                f'expected one of {list(_DTYPES)}')
    for key in ('dim', 'doc_count', 'vec_count'):
        if type(meta.get(key)) is not int or meta[key] < 1:
            raise CorruptIndexError(f'{str(meta_file)!r}: {key} must be a positive integer, got {meta.get(key)!r}')
    if 'max_norm' in meta and (type(meta['max_norm']) not in (int, float) or not math.isfinite(meta['max_norm'])
                               or meta['max_norm'] < 0):
        raise CorruptIndexError(f'{str(meta_file)!r}: max_norm must be a non-negative number, '
                                f'got {meta["max_norm"]!r}')
    if artifact is MultiVectorIndex:
        files = sorted([_DTYPES[meta['dtype']][0], *_CHECKED_AT_OPEN])
        checksums = meta.get('sha256')
        if not isinstance(checksums, dict) or sorted(checksums) != files or \
                not all(isinstance(v, str) and re.fullmatch('[0-9a-f]{64}', v) for v in checksums.values()):
            raise CorruptIndexError(f'{str(meta_file)!r}: sha256 must map {files} to their SHA-256 (an index built '
                                    f'before indexes had checksums has none: rebuild it), got {checksums!r}')
    if not isinstance(meta.get('build_id'), str):
        raise CorruptIndexError(f'{str(meta_file)!r}: build_id must be a string, got {meta.get("build_id")!r}')
    return meta, raw


def _meta_bytes(path: Path, artifact: type = None) -> bytes:
    """The raw bytes of the ``pt_meta.json`` of an index of the class ``artifact`` (default: MultiVectorIndex),
    unchecked (:func:`_read_meta` checks them)."""
    meta_file = path / 'pt_meta.json'
    if not meta_file.is_file():
        raise FileNotFoundError(f'no finished {(artifact or MultiVectorIndex).__name__} at {str(path)!r} '
                                '(pt_meta.json is missing)')
    return meta_file.read_bytes()


_OPEN_ATTEMPTS = 5


def open_whole(path: Path, artifact: type, load: Callable[[dict], T]) -> Tuple[T, bytes]:
    """Opens the index at ``path`` with ``load(meta)`` so that every file it opened belongs to one build.

    A concurrent overwrite swaps the whole folder between two of ``load``'s reads: the metadata is read again once
    ``load`` has opened everything, and the open repeated on the new build while it changed.

    Returns:
        What ``load`` returned, and the raw ``pt_meta.json`` of its build.

    Raises:
        CorruptIndexError: If the index was replaced at every attempt, or as ``load`` (for an index that did not
            change meanwhile).
    """
    meta, raw = _read_meta(path, artifact)
    for _ in range(_OPEN_ATTEMPTS):
        try:
            loaded = load(meta)
        except (CorruptIndexError, FileNotFoundError):
            meta_now, raw_now = _read_meta(path, artifact)
            if raw_now == raw:
                raise
        else:
            meta_now, raw_now = _read_meta(path, artifact)
            if raw_now == raw:
                return loaded, raw
        meta, raw = meta_now, raw_now
    raise IndexReplacedError(f'{str(path)!r} was replaced by another build at each of {_OPEN_ATTEMPTS} attempts to '
                            'open it; open it again once the builds are done')


def _load(path: Path, meta: dict):
    from npids import Lookup
    file_name, dtype = _DTYPES[meta['dtype']]
    expected = {file_name: meta['vec_count'] * meta['dim'] * np.dtype(dtype).itemsize,
                'offsets.i8': (meta['doc_count'] + 1) * 8}
    for name, size in expected.items():
        actual = (path / name).stat().st_size if (path / name).is_file() else None
        if actual != size:
            raise CorruptIndexError(f'{str(path / name)!r} has {actual} bytes, expected {size} from pt_meta.json')
    for name in _CHECKED_AT_OPEN:
        check_sha256(path / name, meta['sha256'][name], 'the index was built')
    offsets = np.fromfile(path / 'offsets.i8', dtype=np.int64)
    if offsets[0] != 0 or offsets[-1] != meta['vec_count'] or np.any(np.diff(offsets) <= 0):
        raise CorruptIndexError(f'{str(path / "offsets.i8")!r} is not an increasing sequence '
                                f'from 0 to {meta["vec_count"]}')
    vectors = np.memmap(path / file_name, mode='r', dtype=dtype, shape=(meta['vec_count'], meta['dim']))
    try:
        docnos = Lookup(path / 'docnos.npids')
        count = len(docnos)
    except Exception as e:  # npids raises assorted errors on a damaged file
        raise CorruptIndexError(f'{str(path / "docnos.npids")!r} cannot be read: {e}') from e
    if count != meta['doc_count']:
        raise CorruptIndexError(f'{str(path / "docnos.npids")!r} has {count} docnos, expected {meta["doc_count"]}')
    return meta, vectors, offsets, docnos
