"""Lucene indexes through pyserini (Anserini): BM25 over text and impact search over sparse ``toks``.

Anserini runs in Java 21 or newer, which :func:`find_java_home` finds before pyserini starts the JVM.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Union

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building
from pyterrier_multiquery._transformer import DerivedIdentity, NumResultsCutoff

#: The oldest Java that Anserini 1.x (pyserini 1.x) runs on.
MIN_JAVA_VERSION = 21

#: Where JDKs are looked for after ``JAVA_HOME`` (Linux packages, tarballs under /opt, macOS installers).
JAVA_LOCATIONS = ('/usr/lib/jvm/*', '/opt/*jdk*', '/Library/Java/JavaVirtualMachines/*/Contents/Home')

#: Scale of the integer impacts: a weight ``w`` is stored as ``int(w * scale)`` (pyterrier-pisa's toks rule).
DEFAULT_SCALE = 100.


def java_version(home: Union[str, Path]) -> Optional[int]:
    """The major version of the JDK at ``home`` from its ``release`` file (``1.8.0`` is 8), None if it has none."""
    try:
        text = (Path(home) / 'release').read_text(errors='replace')
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def find_java_home(min_version: int = MIN_JAVA_VERSION, locations: Sequence[str] = JAVA_LOCATIONS) -> str:
    """The JDK to run Anserini in: ``JAVA_HOME`` if it is new enough, else the newest one in ``locations``.

    Args:
        min_version: The oldest Java major version accepted.
        locations: Glob patterns of JDK folders (each with a ``release`` file) searched after ``JAVA_HOME``.

    Raises:
        RuntimeError: Naming every JDK found and its version, when none is ``min_version`` or newer.
    """
    versions = {}
    home = os.environ.get('JAVA_HOME')
    if home:
        versions[home] = java_version(home)
        if (versions[home] or 0) >= min_version:
            return home
    for pattern in locations:
        versions.update((path, java_version(path)) for path in sorted(glob.glob(pattern)))
    good = [path for path, version in versions.items() if (version or 0) >= min_version]
    if good:
        return max(good, key=versions.get)
    found = '; '.join(f'{version} at {path}' for path, version in versions.items() if version) or 'no JDK'
    raise RuntimeError(f'pyserini needs Java {min_version} or newer; found {found} (JAVA_HOME, then '
                       f'{", ".join(locations)}); install a JDK {min_version}+ and set JAVA_HOME to it')


def _anserini():
    """pyserini's ``autoclass`` and ``JArrayList``, once its JVM runs in a Java that Anserini supports."""
    jnius = sys.modules.get('jnius')
    if jnius is not None:  # a JVM already runs in this process (pyserini's, or PyTerrier's): it must be new enough
        running = jnius.autoclass('java.lang.System').getProperty('java.specification.version')
        if int(running.split('.')[-1] if running.startswith('1.') else running) < MIN_JAVA_VERSION:
            raise RuntimeError(f'pyserini needs Java {MIN_JAVA_VERSION} or newer, but this process already runs '
                               f'Java {running}: set JAVA_HOME to a JDK {MIN_JAVA_VERSION}+ before Java starts')
    else:
        os.environ['JAVA_HOME'] = find_java_home()
    with requires('pyserini'):
        from pyserini.pyclass import JArrayList, autoclass
    return autoclass, JArrayList


class LuceneIndex(DerivedIdentity, pta.Artifact, pt.Indexer):
    """A Lucene index built by Anserini: of document ``text`` (searched with BM25) or of sparse ``toks`` weights
    (integer impacts, searched with ``query_toks``).

    Files: Lucene's, ``stopwords.txt`` (text indexes) and ``pt_meta.json`` (what was indexed, the impact scale).
    """
    ARTIFACT_TYPE = 'sparse_index'
    ARTIFACT_FORMAT = 'lucene'

    def __init__(self, path: Union[str, Path]):
        """
        Args:
            path: The index folder.
        """
        super().__init__(path)
        self.path = Path(path)

    def built(self) -> bool:
        """Whether a finished index is at ``path``."""
        return (self.path / 'pt_meta.json').exists()

    def meta(self) -> Dict:
        """The index's ``pt_meta.json``.

        Raises:
            FileNotFoundError: If no finished Lucene index is at ``path``.
        """
        if not self.built():
            raise FileNotFoundError(f'no finished Lucene index at {str(self.path)!r} (pt_meta.json is missing)')
        return json.loads((self.path / 'pt_meta.json').read_text())

    def index(self, inp: Iterable[Dict]) -> 'LuceneIndex':
        """Indexes ``{'docno', 'text'}`` records (see :meth:`indexer`)."""
        return self.indexer().index(inp)

    def indexer(self, *, stopwords: Union[str, Sequence[str]] = 'terrier', overwrite: bool = False,
                threads: int = 1, verbose: bool = False) -> 'LuceneIndexer':
        """An indexer of ``{'docno', 'text'}`` records (Anserini's JsonCollection, Porter stemmer).

        Args:
            stopwords: ``'terrier'`` (Terrier's list, as pyterrier-pisa's BM25), ``'lucene'`` (Anserini's default)
                or a list of words; queries are stopped with the same list.
            overwrite: Whether to replace an existing index (only once the new one is complete).
            threads: Anserini's indexing threads.
            verbose: Whether to show progress and Anserini's log.
        """
        return LuceneIndexer(self, 'text', stopwords=stopwords, overwrite=overwrite, threads=threads,
                             verbose=verbose)

    def toks_indexer(self, *, scale: float = DEFAULT_SCALE, overwrite: bool = False, threads: int = 1,
                     verbose: bool = False) -> 'LuceneIndexer':
        """An indexer of ``{'docno', 'toks'}`` records as integer impacts ``int(weight * scale)`` (Anserini's
        JsonVectorCollection, ``-impact -pretokenized``; terms are taken as they are).

        Args:
            scale: Multiplies the weights before truncation to integers (pyterrier-pisa's ``toks_indexer`` rule).
            overwrite: Whether to replace an existing index (only once the new one is complete).
            threads: Anserini's indexing threads.
            verbose: Whether to show progress and Anserini's log.
        """
        return LuceneIndexer(self, 'toks', scale=scale, overwrite=overwrite, threads=threads, verbose=verbose)

    def bm25(self, *, k1: float = 0.9, b: float = 0.4, num_results: int = 1000, threads: int = 1,
             verbose: bool = False) -> 'LuceneRetriever':
        """BM25 retrieval of ``query`` text over a text index (Anserini's defaults ``k1=0.9``, ``b=0.4``)."""
        return LuceneRetriever(self, 'bm25', k1=k1, b=b, num_results=num_results, threads=threads, verbose=verbose)

    def impact(self, *, num_results: int = 1000, threads: int = 1, verbose: bool = False) -> 'LuceneRetriever':
        """Impact retrieval of ``query_toks`` over a toks index: the score is the dot product of the integer
        impacts and the query weights, quantised as ``round(weight * scale)``."""
        return LuceneRetriever(self, 'impact', num_results=num_results, threads=threads, verbose=verbose)

    def __repr__(self):
        return f'LuceneIndex({str(self.path)!r})'


class LuceneIndexer(pt.Indexer):
    """Writes a Lucene index with Anserini's ``pyserini.index.lucene`` command, from a JSON collection written into
    a temporary folder that is renamed to the index path when complete."""

    def __init__(self, index: LuceneIndex, field: str, *, stopwords: Union[str, Sequence[str]] = 'terrier',
                 scale: float = DEFAULT_SCALE, overwrite: bool = False, threads: int = 1, verbose: bool = False):
        if isinstance(stopwords, str) and stopwords not in ('terrier', 'lucene'):
            raise ValueError(f"stopwords must be 'terrier', 'lucene' or a list of words, got {stopwords!r}")
        if not scale > 0:
            raise ValueError(f'scale must be positive, got {scale!r}')
        self.index_ref = index
        self.field = field
        self.stopwords = stopwords if isinstance(stopwords, str) else list(stopwords)
        self.scale = float(scale)
        self.overwrite = overwrite
        self.threads = threads
        self.verbose = verbose

    def index_inputs(self):
        return [['docno', self.field]]

    def index(self, inp: Iterable[Dict]) -> LuceneIndex:
        """Indexes the records and returns the finished index.

        Raises:
            FileExistsError: If ``path`` exists and is not a Lucene index to ``overwrite``.
            ValueError: If a record lacks ``docno`` or the indexed field, or has an empty docno.
            RuntimeError: If Anserini fails (with the end of its log).
        """
        path = self.index_ref.path
        if os.path.lexists(path) and not (self.overwrite and self.index_ref.built()):
            raise FileExistsError(f'{str(path)!r} exists; use overwrite=True to replace a Lucene index there')
        if isinstance(inp, pd.DataFrame):
            inp = inp.to_dict(orient='records')
        if self.verbose:
            inp = pt.tqdm(inp, desc='indexing', unit='doc')
        with building(path) as tmp:
            collection = tmp / 'collection'
            collection.mkdir(parents=True)
            count = 0
            with open(collection / 'docs.jsonl', 'w') as out:
                for doc in inp:
                    out.write(json.dumps(self._record(doc)) + '\n')
                    count += 1
            if count == 0:
                raise ValueError('nothing to index: the input had no documents')
            meta = {'type': LuceneIndex.ARTIFACT_TYPE, 'format': LuceneIndex.ARTIFACT_FORMAT,
                    'package_hint': 'pyterrier-multiquery', 'contents': self.field, 'doc_count': count,
                    'build_id': uuid.uuid4().hex}
            if self.field == 'toks':
                meta['scale'] = self.scale
            elif self.stopwords != 'lucene':  # the searcher stops queries with the same file
                (tmp / 'stopwords.txt').write_text(''.join(f'{word}\n' for word in self._stopword_list()))
            self._run_anserini(collection, tmp / 'lucene', tmp / 'stopwords.txt')
            shutil.rmtree(collection)
            for name in os.listdir(tmp / 'lucene'):
                os.replace(tmp / 'lucene' / name, tmp / name)
            os.rmdir(tmp / 'lucene')
            (tmp / 'pt_meta.json').write_text(json.dumps(meta))
        return self.index_ref

    def _record(self, doc: Dict) -> Dict:
        docno = doc.get('docno')
        if not isinstance(docno, str) or not docno or self.field not in doc:
            raise ValueError(f'each record needs a non-empty string docno and {self.field!r}, got keys '
                             f'{sorted(doc)} (docno {docno!r})')
        if self.field == 'text':
            return {'id': docno, 'contents': doc['text']}
        impacts = {str(term): int(weight * self.scale) for term, weight in doc['toks'].items()}
        return {'id': docno, 'vector': {term: impact for term, impact in impacts.items() if impact > 0}}

    def _stopword_list(self):
        if self.stopwords == 'terrier':
            with requires('pisa'):  # Terrier's list, as pyterrier-pisa's BM25 stops queries
                from pyterrier_pisa.stopwords import _STOPWORDS
            return _STOPWORDS['terrier']
        return self.stopwords

    def _run_anserini(self, collection: Path, index: Path, stopwords: Path) -> None:
        with requires('pyserini'):
            import pyserini  # noqa: F401  (the command below runs its module)
        args = [sys.executable, '-m', 'pyserini.index.lucene', '-input', str(collection), '-index', str(index),
                '-threads', str(self.threads)]
        if self.field == 'toks':
            args += ['-collection', 'JsonVectorCollection', '-impact', '-pretokenized']
        else:
            args += ['-collection', 'JsonCollection']
            if stopwords.exists():
                args += ['-stopwords', str(stopwords)]
        if not self.verbose:
            args.append('-quiet')
        env = {**os.environ, 'JAVA_HOME': find_java_home()}
        done = subprocess.run(args, env=env, stdout=None if self.verbose else subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        # the command exits with 0 after argument errors too: a finished index has a segments file
        if done.returncode != 0 or not list(index.glob('segments_*')):
            raise RuntimeError(f'Anserini did not build the index (exit status {done.returncode}): '
                               f'{(done.stdout or "")[-2000:]}')

    def __repr__(self):
        return f'{self.index_ref!r}.{"toks_indexer" if self.field == "toks" else "indexer"}()'


class LuceneRetriever(DerivedIdentity, NumResultsCutoff, pt.Transformer):
    """Anserini's search of a :class:`LuceneIndex`: BM25 of ``query`` text, or impact search of ``query_toks``."""

    def __init__(self, index: Union[LuceneIndex, str, Path], model: str = 'bm25', *, k1: float = 0.9,
                 b: float = 0.4, num_results: int = 1000, threads: int = 1, verbose: bool = False):
        """
        Args:
            index: The index (or its folder): a text index for ``'bm25'``, a toks index for ``'impact'``.
            model: ``'bm25'`` or ``'impact'``.
            k1: BM25's term-frequency saturation.
            b: BM25's length normalisation.
            num_results: Documents returned per query.
            threads: Queries searched at once.
            verbose: Whether to show a progress bar.

        Raises:
            FileNotFoundError: If no finished Lucene index is at the path.
            ValueError: If ``model`` does not suit what the index holds.
        """
        self.index = index if isinstance(index, LuceneIndex) else LuceneIndex(index)
        contents = self.index.meta()['contents']
        if model not in ('bm25', 'impact') or (model == 'impact') != (contents == 'toks'):
            raise ValueError(f"model must be 'bm25' for a text index or 'impact' for a toks index; "
                             f"{str(self.index.path)!r} holds {contents!r}, got {model!r}")
        self.model = model
        self.k1 = k1
        self.b = b
        self.num_results = num_results
        self.threads = threads
        self.verbose = verbose
        self._searcher = None

    @property
    def schematic(self):
        return {'label': 'Lucene BM25' if self.model == 'bm25' else 'Lucene impact'}

    def _search(self):
        autoclass, array_list = _anserini()
        if self._searcher is None:
            if self.model == 'bm25':
                searcher = autoclass('io.anserini.search.SimpleSearcher')(str(self.index.path))
                stopwords = self.index.path / 'stopwords.txt'
                if stopwords.exists():
                    analyzer = autoclass('io.anserini.analysis.DefaultEnglishAnalyzer')
                    searcher.set_analyzer(analyzer.fromArguments('porter', False, str(stopwords)))
                searcher.set_bm25(float(self.k1), float(self.b))
            else:
                searcher = autoclass('io.anserini.search.SimpleImpactSearcher')(str(self.index.path))
            self._searcher = searcher
        return self._searcher, autoclass, array_list

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Retrieves for each query row (``qid`` and ``query``, or ``query_toks`` for impact search)."""
        column = 'query' if self.model == 'bm25' else 'query_toks'
        pt.validate.query_frame(inp, extra_columns=[column])
        inp = inp.reset_index(drop=True)
        if len(inp) == 0:
            return inp.assign(docno=pd.Series(dtype=str), score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        searcher, autoclass, array_list = self._search()
        scale = self.index.meta().get('scale')
        queries, keys = array_list(), array_list()
        for i, query in enumerate(inp[column]):
            queries.add(str(query) if self.model == 'bm25' else _impact_query(query, scale, autoclass))
            keys.add(str(i))
        hits = searcher.batch_search(queries, keys, int(self.num_results), int(self.threads))
        rows, docnos, scores, ranks = [], [], [], []
        results = range(len(inp))
        if self.verbose:
            results = pt.tqdm(results, desc=repr(self), unit='query')
        for i in results:
            for rank, hit in enumerate(hits.get(str(i)) or []):
                rows.append(i)
                docnos.append(hit.docid)
                scores.append(hit.score)
                ranks.append(rank)
        return inp.iloc[rows].reset_index(drop=True).assign(docno=docnos, score=scores, rank=ranks)


def _impact_query(toks: Dict[str, float], scale: float, autoclass):
    """A Java map of the query's integer weights ``round(weight * scale)``, the positive ones."""
    if not isinstance(toks, dict):
        raise TypeError(f'query_toks must be a dict of term weights, got {type(toks).__name__}')
    query, integer = autoclass('java.util.HashMap')(), autoclass('java.lang.Integer')
    for term, weight in toks.items():
        impact = round(weight * scale)
        if impact > 0:
            query.put(str(term), integer(impact))
    return query
