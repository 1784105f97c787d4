"""QAEncoder (Wang et al., 2025): document vectors replaced by the mean vector of queries generated for them.

The paper's conical distribution hypothesis: the queries a document answers lie on a cone around it, so the
mean of their vectors is closer to any one of them than the document vector is. Fingerprints keep documents
apart: QAE_emb interpolates with the document vector, QAE_txt encodes the document text with generated
queries appended, QAE_hyb does both.
"""
import zlib
from typing import Iterable, List, Sequence

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._transformer import DerivedIdentity
from pyterrier_multiquery._vectors import normalise
from pyterrier_multiquery.generation.query_transformers import query_lists

METHODS = ('base', 'emb', 'txt', 'hyb', 'naive')


def query_mean(query_vectors: np.ndarray) -> np.ndarray:
    """QAE_base: the normalised mean of the normalised query vectors (one document's, rows)."""
    return normalise(normalise(query_vectors).mean(axis=0))


def interpolate(query_vector: np.ndarray, fingerprint: np.ndarray, alpha: float) -> np.ndarray:
    """QAE_emb and QAE_hyb: ``norm(alpha * query_vector + (1 - alpha) * fingerprint)``."""
    return normalise(alpha * query_vector + (1 - alpha) * fingerprint)


def text_fingerprint(text: str, queries: Sequence[str], beta: float, rng: np.random.Generator) -> str:
    """QAE_txt's input: the document followed by its generated queries in a random order, appended until the
    appended part is at least ``beta`` times the document's length (in characters) or every query is used."""
    appended = ''
    for j in rng.permutation(len(queries)):
        appended += ' ' + queries[j]
        if len(appended) >= beta * len(text):
            break
    return text + appended


class QAEncoder(DerivedIdentity, pt.Transformer):
    """Encodes documents (``docno``, ``text``, ``querygen``) with a pyterrier_dr bi-encoder, the QAEncoder way.

    Generated queries are encoded with the bi-encoder's query side, documents (and documents with queries
    appended) with its document side; every vector is L2-normalised, as in the paper's code. Methods:

    - ``'base'``: ``doc_vec = e_q``, the normalised mean of the query vectors.
    - ``'emb'``: ``doc_vec = norm(alpha * e_q + (1 - alpha) * e_d)``, with ``e_d`` the document vector.
    - ``'txt'``: ``doc_vec = e_t``, the vector of the document text with generated queries appended
      (:func:`text_fingerprint`, ``beta``).
    - ``'hyb'``: ``doc_vec = norm(alpha * e_q + (1 - alpha) * e_t)``.
    - ``'naive'`` (QA_naive): ``doc_embs`` holds every query vector, one row each (for a
      :class:`~pyterrier_multiquery.MultiVectorIndex`, scored by MaxSim); ``include_document`` adds ``e_d``.
    """
    schematic = {'label': 'QAEncoder'}

    def __init__(self, encoder: pt.Transformer, method: str = 'emb', *, alpha: float = 0.5, beta: float = 1.5,
                 include_document: bool = False, seed: int = 0, verbose: bool = False):
        """
        Args:
            encoder: A pyterrier_dr bi-encoder (``encode_queries`` and ``encode_docs``).
            method: One of ``'base'``, ``'emb'``, ``'txt'``, ``'hyb'``, ``'naive'``.
            alpha: Weight of the query mean against the fingerprint (``'emb'``, ``'hyb'``).
            beta: Length of the appended queries relative to the document (``'txt'``, ``'hyb'``).
            include_document: Whether ``'naive'`` also stores the document vector.
            seed: Seeds the query orders of ``'txt'``/``'hyb'`` (combined with each docno, so a document's
                vector does not depend on its batch).
            verbose: Whether to show progress.
        """
        if method not in METHODS:
            raise ValueError(f'unknown QAEncoder method {method!r}; expected one of {METHODS}')
        if not 0 <= alpha <= 1:
            raise ValueError(f'alpha must lie in [0, 1], got {alpha}')
        if beta < 0:
            raise ValueError(f'beta must be non-negative, got {beta}')
        self.encoder = encoder
        self.method = method
        self.alpha = alpha
        self.beta = beta
        self.include_document = include_document
        self.seed = seed
        self.verbose = verbose

    @property
    def output_column(self) -> str:
        return 'doc_embs' if self.method == 'naive' else 'doc_vec'

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.columns(inp, includes=['docno', 'text', 'querygen'])
        out = inp.copy()
        if len(inp) == 0:
            out[self.output_column] = pd.Series(dtype=object)
            return out
        queries = query_lists(inp['docno'], inp['querygen'])
        empty = [docno for docno, q in zip(inp['docno'], queries) if len(q) == 0]
        if empty:
            raise ValueError(f'QAEncoder needs at least one generated query per document; '
                             f'none for docno(s) {empty[:5]}')
        if self.method == 'naive':
            rows = self.query_vectors(queries)
            if self.include_document:
                doc_vectors = normalise(self.encoder.encode_docs(list(inp['text'])))
                rows = [np.vstack([d[None], q]) for d, q in zip(doc_vectors, rows)]
            out['doc_embs'] = [r.astype(np.float32) for r in rows]
            return out
        if self.method == 'txt':
            vectors = self.text_vectors(inp['docno'], inp['text'], queries)
        else:
            means = np.stack([query_mean(q) for q in self.query_vectors(queries)])
            if self.method == 'base':
                vectors = means
            elif self.method == 'emb':
                vectors = interpolate(means, normalise(self.encoder.encode_docs(list(inp['text']))), self.alpha)
            else:
                vectors = interpolate(means, self.text_vectors(inp['docno'], inp['text'], queries), self.alpha)
        out['doc_vec'] = list(vectors.astype(np.float32))
        return out

    def query_vectors(self, queries: List[List[str]]) -> List[np.ndarray]:
        """The normalised vectors of each document's generated queries (one array per document)."""
        vectors = normalise(self.encoder.encode_queries(sum(queries, [])))
        return np.split(vectors, np.cumsum([len(q) for q in queries])[:-1])

    def text_vectors(self, docnos: Iterable[str], texts: Iterable[str], queries: List[List[str]]) -> np.ndarray:
        """QAE_txt's vectors: the normalised vector of each document's :func:`text_fingerprint`."""
        rngs = (np.random.default_rng([self.seed, zlib.crc32(str(docno).encode())]) for docno in docnos)
        inputs = [text_fingerprint(text, q, self.beta, rng) for rng, text, q in zip(rngs, texts, queries)]
        return normalise(self.encoder.encode_docs(inputs))


def grid_search(encoder: pt.Transformer, documents: pd.DataFrame, topics: pd.DataFrame, qrels: pd.DataFrame, *,
                method: str, alphas: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
                betas: Sequence[float] = (0.5, 1.0, 1.5, 2.0), measure=None, seed: int = 0,
                num_results: int = 1000) -> pd.DataFrame:
    """Scores QAEncoder settings on a dev set by exhaustive dense retrieval over ``documents``.

    Args:
        encoder: The pyterrier_dr bi-encoder.
        documents: Frame with ``docno``, ``text`` and ``querygen`` (the whole collection searched).
        topics: Dev queries (``qid``, ``query``).
        qrels: Dev judgements.
        method: ``'emb'`` (searches ``alphas``), ``'txt'`` (``betas``) or ``'hyb'`` (both).
        alphas: Candidate alphas.
        betas: Candidate betas.
        measure: The ir_measures measure to maximise (default nDCG@10).
        seed: QAE_txt's seed.
        num_results: Results per query.

    Returns:
        One row per setting (``alpha``, ``beta``, the measure), best first.
    """
    import ir_measures
    if method not in ('emb', 'txt', 'hyb'):
        raise ValueError(f"grid_search searches 'emb', 'txt' or 'hyb', not {method!r}")
    pt.validate.columns(documents, includes=['docno', 'text', 'querygen'])
    measure = measure or ir_measures.nDCG @ 10
    query_vectors = normalise(encoder.encode_queries(list(topics['query'])))
    queries = query_lists(documents['docno'], documents['querygen'])
    qae = QAEncoder(encoder, method, seed=seed)
    if method == 'emb':
        fingerprints = {None: normalise(encoder.encode_docs(list(documents['text'])))}
    else:
        fingerprints = {beta: QAEncoder(encoder, 'txt', beta=beta, seed=seed).text_vectors(
                            documents['docno'], documents['text'], queries)
                        for beta in pt.tqdm(betas, desc='QAE_txt fingerprints', unit='beta')}
    means = np.stack([query_mean(q) for q in qae.query_vectors(queries)]) if method != 'txt' else None
    rows = []
    for beta, fingerprint in fingerprints.items():
        for alpha in ([None] if method == 'txt' else alphas):
            doc_vectors = fingerprint if alpha is None else interpolate(means, fingerprint, alpha)
            run = _dense_run(topics['qid'], query_vectors, documents['docno'], doc_vectors, num_results)
            value = ir_measures.calc_aggregate([measure], qrels, run)[measure]
            rows.append({'alpha': alpha, 'beta': beta, str(measure): value})
    return pd.DataFrame(rows).sort_values(str(measure), ascending=False, kind='stable').reset_index(drop=True)


def _dense_run(qids: Iterable[str], query_vectors: np.ndarray, docnos: Iterable[str], doc_vectors: np.ndarray,
               num_results: int) -> pd.DataFrame:
    scores = query_vectors @ doc_vectors.T
    docnos = np.asarray(list(docnos))
    k = min(num_results, scores.shape[1])
    frames = []
    for qid, row in zip(qids, scores):
        top = np.argsort(-row, kind='stable')[:k]
        frames.append(pd.DataFrame({'query_id': str(qid), 'doc_id': docnos[top], 'score': row[top]}))
    return pd.concat(frames, ignore_index=True)
