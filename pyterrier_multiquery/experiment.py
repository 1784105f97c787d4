"""The main job: build the indexes a dataset needs and compare systems on multi-answer measures."""
import hashlib
import os
import re
from pathlib import Path
from typing import Dict, Optional, Sequence

import pandas as pd
import pyterrier as pt
from ir_measures import alpha_nDCG, nDCG

from pyterrier_multiquery.baselines import MMR, flex_index, minilm, pisa_bm25
from pyterrier_multiquery.measures import AnswerRecall, MRecall

DEFAULT_MEASURES = [MRecall@5, MRecall@10, MRecall@100, AnswerRecall@10, alpha_nDCG@10, nDCG@10]


def default_data_dir() -> Optional[Path]:
    """The ``shared/data`` folder beside the project checkout (or ``$PYTERRIER_MULTIQUERY_DATA``), if present."""
    candidates = [os.environ.get('PYTERRIER_MULTIQUERY_DATA'),
                  Path(__file__).resolve().parents[2] / 'shared' / 'data',
                  Path.cwd().parent / 'shared' / 'data']
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def cache_dir_for(dataset_spec: str, cache_root: os.PathLike) -> Path:
    """A cache folder for one dataset: its name plus a short hash of where it came from."""
    is_irds = dataset_spec.startswith('irds:')
    origin = dataset_spec if is_irds else str(Path(dataset_spec).resolve())
    name = re.sub(r'[^\w.-]+', '_', dataset_spec[len('irds:'):] if is_irds else Path(origin).name)
    return Path(cache_root) / f'{name}-{hashlib.sha1(origin.encode()).hexdigest()[:8]}'


def baseline_systems(dataset, cache_dir: os.PathLike, *, num_results: int = 1000, mmr_lambda: float = 0.5,
                     mmr_depth: int = 500, batch_size: int = 64, verbose: bool = True) -> Dict[str, pt.Transformer]:
    """BM25, MiniLM and MiniLM >> MMR over ``dataset``'s corpus, building their indexes under ``cache_dir`` once.

    Args:
        dataset: A PyTerrier dataset (``get_corpus_iter``).
        cache_dir: Folder for the PISA and FlexIndex indexes.
        num_results: Results per query of each first stage.
        mmr_lambda: MMR's relevance weight.
        mmr_depth: Number of dense results MMR re-ranks.
        batch_size: Encoder batch size.
        verbose: Whether to show progress bars.

    Returns:
        Systems by name, in table order.
    """
    corpus = lambda: dataset.get_corpus_iter(verbose=verbose)  # noqa: E731
    bm25 = pisa_bm25(Path(cache_dir) / 'pisa', corpus, num_results=num_results)
    index, dense = minilm_dense(dataset, cache_dir, num_results=num_results, batch_size=batch_size, verbose=verbose)
    return {
        'BM25': bm25,
        'MiniLM': dense,
        f'MiniLM >> MMR(λ={mmr_lambda})': dense % mmr_depth >> index.vec_loader() >> MMR(mmr_lambda, depth=mmr_depth, verbose=verbose),
    }


def minilm_dense(dataset, cache_dir: os.PathLike, *, num_results: int = 1000, batch_size: int = 64,
                 verbose: bool = True):
    """all-MiniLM-L6-v2 over ``dataset``'s corpus: its FlexIndex (built under ``cache_dir`` once) and retriever.

    Returns:
        ``(index, retriever)``: the FlexIndex and ``query encoder >> index retriever``.
    """
    encoder = minilm(batch_size=batch_size, verbose=verbose)
    index = flex_index(Path(cache_dir) / 'minilm.flex', encoder, lambda: dataset.get_corpus_iter(verbose=verbose))
    return index, encoder.query_encoder() >> index.retriever(num_results=num_results)


def jpr_system(model_path: os.PathLike, dataset, cache_dir: os.PathLike, *, num_candidates: int = 20, k: int = 10,
               decode: str = 'tree', beta: float = 1.0, batch_size: int = 64, verbose: bool = True) -> pt.Transformer:
    """MiniLM's top ``num_candidates`` with their text, reranked by a trained JPR model into ``k`` passages.

    Args:
        model_path: A folder written by ``JPRModel.save_pretrained``.
        dataset: A PyTerrier dataset with a corpus and a ``text_loader``.
        cache_dir: Folder of the MiniLM index (shared with :func:`baseline_systems`).
        num_candidates: |B|, the first-stage passages JPR chooses from.
        k: Passages JPR chooses.
        decode: ``'tree'``, ``'seq'`` or ``'independent'``.
        beta: TreeDecode's length-penalty exponent.
        batch_size: MiniLM's batch size.
        verbose: Whether to show progress bars.
    """
    from pyterrier_multiquery.jpr import JPR
    _, dense = minilm_dense(dataset, cache_dir, num_results=num_candidates, batch_size=batch_size, verbose=verbose)
    return dense >> pt.text.get_text(dataset, 'text') >> JPR(model_path, k=k, num_candidates=num_candidates,
                                                              decode=decode, beta=beta, verbose=verbose)


def minilm_multivector_index(dataset, cache_dir: os.PathLike, *, batch_size: int = 64, verbose: bool = True):
    """A MultiVectorIndex holding one all-MiniLM-L6-v2 vector per document (the frozen index AMER searches).

    Built once under ``cache_dir`` from the MiniLM FlexIndex's vectors.
    """
    from pyterrier_multiquery.index import MultiVectorIndex
    flex, _ = minilm_dense(dataset, cache_dir, batch_size=batch_size, verbose=verbose)
    index = MultiVectorIndex(Path(cache_dir) / 'minilm.mvi', verbose=verbose)
    if not index.built():
        docnos, vectors, _ = flex.payload()
        index.index({'docno': docno, 'doc_vec': vector} for docno, vector in zip(docnos.fwd, vectors))
    return index


def amer_system(model_path: os.PathLike, dataset, cache_dir: os.PathLike, *, num_results: int = 1000,
                batch_size: int = 64, verbose: bool = True) -> pt.Transformer:
    """A trained AMER's query vectors, each searching the frozen MiniLM index, merged round-robin.

    Args:
        model_path: A folder written by ``AMER.save_pretrained`` (trained against all-MiniLM-L6-v2 vectors).
        dataset: A PyTerrier dataset with a corpus.
        cache_dir: Folder of the MiniLM indexes (shared with :func:`baseline_systems`).
        num_results: Results per query after merging.
        batch_size: MiniLM's batch size when the index is built.
        verbose: Whether to show progress bars.
    """
    from pyterrier_multiquery.amer import AMERQueryEncoder
    index = minilm_multivector_index(dataset, cache_dir, batch_size=batch_size, verbose=verbose)
    return AMERQueryEncoder(model_path, verbose=verbose) >> index.multiquery_retriever(num_results=num_results)


def validate_topics_qrels(topics: pd.DataFrame, qrels: pd.DataFrame) -> None:
    """Raises a ValueError naming what is missing when topics or qrels lack a needed column."""
    for what, frame, columns in (('topics', topics, ['qid', 'query']), ('qrels', qrels, ['qid', 'docno', 'label'])):
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise ValueError(f'{what} is missing column(s) {missing}; found {list(frame.columns)}')


def run_experiment(systems: Dict[str, pt.Transformer], topics: pd.DataFrame, qrels: pd.DataFrame,
                   eval_metrics: Sequence = DEFAULT_MEASURES, **experiment_args) -> pd.DataFrame:
    """Runs :func:`pyterrier.Experiment` over named systems after checking the topics and qrels.

    Args:
        systems: Systems by name.
        topics: Frame with ``qid`` and ``query``.
        qrels: Frame with ``qid``, ``docno``, ``label`` (and ``iteration`` for answer ids).
        eval_metrics: Measures to report.
        experiment_args: Passed to :func:`pyterrier.Experiment` (``baseline``, ``perquery``, ...).
    """
    validate_topics_qrels(topics, qrels)
    table = pt.Experiment(list(systems.values()), topics, qrels, eval_metrics=list(eval_metrics),
                          names=list(systems), **experiment_args)
    measure_columns = [str(m) for m in eval_metrics]
    if set(measure_columns) <= set(table.columns):  # a summary table: measures in the order asked for
        table = table[['name'] + measure_columns + [c for c in table.columns if c not in measure_columns + ['name']]]
    return table
