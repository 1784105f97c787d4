"""DiffRetriever's retrieval pipelines over a corpus: the documents encoded once into a dense and a sparse index, and
each search mode (dense MaxSim, mean vectors, sparse, their hybrids) as ``query_encoder() >> retriever``."""
import functools
import os
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Sequence

import more_itertools
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import build_once, encoder_digest
from pyterrier_multiquery.diffretriever.fusion import HybridRetriever
from pyterrier_multiquery.diffretriever.sparse import sparse_index

#: The search modes of :func:`retrieval_pipelines`.
MODES = ('dense', 'mean', 'sparse', 'hybrid', 'mean hybrid')


def retrieval_pipelines(encoder, corpus: Callable[[], pd.DataFrame], path: os.PathLike, *,
                        modes: Sequence[str] = ('dense',), num_results: int = 1000) -> Dict[str, pt.Transformer]:
    """``encoder``'s query encoder >> a retriever over the documents it encodes, for each of ``modes``.

    The documents are encoded once, when an index a mode needs is not there yet: ``doc_embs`` into a
    MultiVectorIndex at ``<path>.mvi`` and, for the sparse modes, ``toks`` into a PISA index at ``<path>.pisa``. Each
    index is keyed by the documents and by the document side of the encoder (its settings and weights), so an index
    made from another corpus or model is never served (:class:`~pyterrier_multiquery._files.StaleBuildError`);
    query-only settings (``k_query``) share it.

    Args:
        encoder: A multi-vector encoder (``query_encoder()`` and ``doc_encoder()``: DiffRetriever, DiffEmbed, ...).
        corpus: Returns the documents (``docno``, ``text``) as a frame; called when an index is built or checked.
        path: Where the indexes are kept, without extension.
        modes: Any of ``'dense'`` (MaxSim), ``'mean'`` (the mean of each side's vectors, cosine), ``'sparse'``,
            ``'hybrid'`` (MaxSim and sparse, 0.5/0.5 of min-max-normalised scores) and ``'mean hybrid'`` (mean and
            sparse).
        num_results: Results per query.

    Returns:
        The pipeline of each of ``modes``, by mode.
    """
    from pyterrier_multiquery.index import MultiVectorIndex
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise ValueError(f'mode must be one of {MODES}, got {unknown}')
    path = Path(path)
    documents = functools.lru_cache(maxsize=None)(lambda: pd.DataFrame(corpus()))
    encoded = functools.lru_cache(maxsize=None)(lambda: encoder.doc_encoder()(documents()))  # once for both
    settings = {'encoder': encoder_digest(encoder, name=encoder.doc_repr())}  # query-only settings do not count

    def records(column: str) -> List[Dict]:
        return encoded()[['docno', column]].to_dict(orient='records')

    def built(suffix: str, write: Callable[[str], None]) -> Path:
        def build(tmp: str, docs: Iterable[Dict]) -> None:
            more_itertools.consume(docs)  # hashed: the documents whose encodings are written
            write(tmp)
        return build_once(path.with_name(path.name + suffix), build, lambda: documents().to_dict(orient='records'),
                          settings=settings)

    dense_path = built('.mvi', lambda tmp: MultiVectorIndex(tmp, verbose=False).index(records('doc_embs')))
    dense_index = MultiVectorIndex(dense_path, verbose=False)
    first = {'dense': dense_index.retriever(num_results=num_results)}
    if any(mode in ('mean', 'mean hybrid') for mode in modes):
        first['mean'] = dense_index.mean_retriever(num_results=num_results, normalise=True)
    if any(mode in ('sparse', 'hybrid', 'mean hybrid') for mode in modes):
        pisa_path = built('.pisa', lambda tmp: sparse_index(tmp, records('toks')))
        with requires('pisa'):
            from pyterrier_pisa import PisaIndex
        first['sparse'] = PisaIndex(str(pisa_path), stemmer='none').quantized(num_results=num_results)
        first['hybrid'] = HybridRetriever(first['dense'], first['sparse'], num_results=num_results)
        if 'mean' in first:
            first['mean hybrid'] = HybridRetriever(first['mean'], first['sparse'], num_results=num_results)
    return {mode: encoder.query_encoder() >> first[mode] for mode in modes}
