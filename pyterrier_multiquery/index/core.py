"""On-disk storage of the MultiVectorIndex: a variable number of vectors per document, memory-mapped."""
import json
from pathlib import Path
from typing import Dict, Iterable, Union

import more_itertools
import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from pyterrier_multiquery._files import building

_DTYPES = {'float32': ('vecs.f4', np.float32), 'float16': ('vecs.f2', np.float16)}


class CorruptIndexError(ValueError):
    """Raised when the files of a MultiVectorIndex do not agree with each other or with ``pt_meta.json``."""


class MultiVectorIndex(pta.Artifact, pt.Indexer):
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

    def built(self) -> bool:
        """Whether a finished index is at ``path``."""
        return (self.path / 'pt_meta.json').exists()

    def payload(self):
        """Loads (once) and checks the index files.

        Returns:
            ``(meta, vectors, offsets, docnos)``: the metadata dict, the memory-mapped ``(vec_count, dim)`` vectors,
            the ``doc_count + 1`` offsets and the docno :class:`npids.Lookup`.

        Raises:
            FileNotFoundError: If no finished index is at ``path``.
            CorruptIndexError: If a file is truncated or disagrees with the metadata.
        """
        if self._payload is None:
            self._payload = _load(self.path)
        return self._payload

    def __len__(self):
        return self.payload()[0]['doc_count']

    def index(self, inp: Iterable[Dict]) -> 'MultiVectorIndex':
        """Indexes ``{'docno', 'doc_embs'}`` records (``doc_vec`` is taken as one row) into a new index at ``path``."""
        return self.indexer().index(inp)

    def indexer(self, *, dtype: str = 'float32', overwrite: bool = False) -> 'MultiVectorIndexer':
        """An indexer for this index.

        Args:
            dtype: Storage type of the vectors, ``float32`` or ``float16``.
            overwrite: Whether to replace an existing index (only once the new one is complete).
        """
        return MultiVectorIndexer(self, dtype=dtype, overwrite=overwrite)

    def maxsim_retriever(self, *, exact: bool = True, **kwargs) -> pt.Transformer:
        """MaxSim retrieval, exact or over ANN candidates (arguments as :class:`~.maxsim.MaxSimRetriever`)."""
        from pyterrier_multiquery.index.maxsim import MaxSimRetriever
        return MaxSimRetriever(self, exact=exact, **kwargs)

    def maxsim_scorer(self, **kwargs) -> pt.Transformer:
        """Exact MaxSim re-scoring of a result frame (arguments as :class:`~.maxsim.MaxSimScorer`)."""
        from pyterrier_multiquery.index.maxsim import MaxSimScorer
        return MaxSimScorer(self, **kwargs)

    def mean_retriever(self, **kwargs) -> pt.Transformer:
        """Retrieval by mean vectors (arguments as :class:`~.mean.MeanRetriever`)."""
        from pyterrier_multiquery.index.mean import MeanRetriever
        return MeanRetriever(self, **kwargs)

    def multiquery_retriever(self, merge: str = 'round_robin', **kwargs) -> pt.Transformer:
        """Each query vector searches on its own; lists merged (arguments as :class:`~.multiquery.MultiQueryRetriever`)."""
        from pyterrier_multiquery.index.multiquery import MultiQueryRetriever
        return MultiQueryRetriever(self, merge=merge, **kwargs)

    def bytes_per_vector(self) -> int:
        """Bytes that one stored vector takes on disk."""
        meta = self.payload()[0]
        return meta['dim'] * np.dtype(_DTYPES[meta['dtype']][1]).itemsize

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
        """Indexes the records and returns the finished index."""
        from npids import Lookup
        path = self.index_ref.path
        if path.exists() and not self.overwrite:
            raise FileExistsError(f'an index already exists at {str(path)!r}; use indexer(overwrite=True) to replace it')
        if isinstance(inp, pd.DataFrame):
            inp = inp.to_dict(orient='records')
        inp = more_itertools.peekable(inp)
        if not inp:
            raise ValueError('nothing to index: the input had no documents')
        if self.index_ref.verbose:
            inp = pt.tqdm(inp, desc='indexing', unit='doc')
        file_name, dtype = _DTYPES[self.dtype]
        dim, offsets = None, [0]
        with building(path) as tmp:
            tmp.mkdir()
            with open(tmp / file_name, 'wb') as vecs, Lookup.builder(tmp / 'docnos.npids') as docnos:
                for record in inp:
                    embs = _record_embs(record)
                    if dim is None:
                        dim = embs.shape[1]
                    elif embs.shape[1] != dim:
                        raise ValueError(f'document {record["docno"]!r} has vectors of size {embs.shape[1]}, '
                                         f'expected {dim} as the earlier documents')
                    vecs.write(embs.astype(dtype).tobytes())
                    docnos.add(record['docno'])
                    offsets.append(offsets[-1] + embs.shape[0])
            np.asarray(offsets, dtype=np.int64).tofile(tmp / 'offsets.i8')
            meta = {'type': MultiVectorIndex.ARTIFACT_TYPE, 'format': MultiVectorIndex.ARTIFACT_FORMAT,
                    'package_hint': 'pyterrier-multiquery', 'dtype': self.dtype, 'dim': dim,
                    'doc_count': len(offsets) - 1, 'vec_count': offsets[-1]}
            (tmp / 'pt_meta.json').write_text(json.dumps(meta))
        self.index_ref._payload = None
        return self.index_ref

    def __repr__(self):
        return f'{self.index_ref!r}.indexer(dtype={self.dtype!r}, overwrite={self.overwrite!r})'


def _record_embs(record: Dict) -> np.ndarray:
    if 'doc_embs' in record:
        embs = np.asarray(record['doc_embs'], dtype=np.float32)
    elif 'doc_vec' in record:
        embs = np.asarray(record['doc_vec'], dtype=np.float32).reshape(1, -1)
    else:
        raise KeyError(f'document {record.get("docno")!r} has neither doc_embs nor doc_vec; found {sorted(record)}')
    if embs.ndim != 2 or embs.shape[0] == 0 or embs.shape[1] == 0:
        raise ValueError(f'document {record.get("docno")!r}: doc_embs must be a non-empty 2-D array, got shape {embs.shape}')
    return embs


def _load(path: Path):
    from npids import Lookup
    meta_file = path / 'pt_meta.json'
    if not meta_file.exists():
        raise FileNotFoundError(f'no finished MultiVectorIndex at {str(path)!r} (pt_meta.json is missing)')
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as e:
        raise CorruptIndexError(f'{str(meta_file)!r} is not valid JSON: {e}') from None
    if (meta.get('type'), meta.get('format')) != (MultiVectorIndex.ARTIFACT_TYPE, MultiVectorIndex.ARTIFACT_FORMAT):
        raise CorruptIndexError(f'{str(path)!r} holds a {meta.get("type")}/{meta.get("format")} artifact, not a MultiVectorIndex')
    file_name, dtype = _DTYPES[meta['dtype']]
    expected = {file_name: meta['vec_count'] * meta['dim'] * np.dtype(dtype).itemsize,
                'offsets.i8': (meta['doc_count'] + 1) * 8}
    for name, size in expected.items():
        actual = (path / name).stat().st_size if (path / name).exists() else None
        if actual != size:
            raise CorruptIndexError(f'{str(path / name)!r} has {actual} bytes, expected {size} from pt_meta.json')
    offsets = np.fromfile(path / 'offsets.i8', dtype=np.int64)
    if offsets[0] != 0 or offsets[-1] != meta['vec_count'] or np.any(np.diff(offsets) <= 0):
        raise CorruptIndexError(f'{str(path / "offsets.i8")!r} is not an increasing sequence from 0 to {meta["vec_count"]}')
    vectors = np.memmap(path / file_name, mode='r', dtype=dtype, shape=(meta['vec_count'], meta['dim']))
    try:
        docnos = Lookup(path / 'docnos.npids')
        count = len(docnos)
    except Exception as e:  # npids raises assorted errors on a damaged file
        raise CorruptIndexError(f'{str(path / "docnos.npids")!r} cannot be read: {e}') from e
    if count != meta['doc_count']:
        raise CorruptIndexError(f'{str(path / "docnos.npids")!r} has {count} docnos, expected {meta["doc_count"]}')
    return meta, vectors, offsets, docnos
