"""The composition layer: every pipeline of the package assembled from its parts, in one place.

Factories take what they build on (a dataset, a cache folder, a trained model) explicitly; the main job,
experiments, notebooks and tests call them rather than assembling pipelines themselves.
"""
import os
from pathlib import Path
from typing import Dict

import pyterrier as pt

from pyterrier_multiquery.baselines import MMR, flex_index, minilm, pisa_bm25


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
