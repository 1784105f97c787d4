"""Dense, sparse and hybrid DiffRetriever pipelines over a MultiVectorIndex and a pyterrier-pisa index."""
import hashlib
from pathlib import Path
from typing import Optional

import pyterrier as pt

from pyterrier_multiquery.diffretriever.fusion import HybridRetriever


def sparse_index(path, encoded_docs, *, overwrite: bool = False):
    """A pyterrier-pisa index (no stemming) of the ``toks`` weights of documents that went through a doc encoder."""
    from pyterrier_pisa import PisaIndex
    index = PisaIndex(str(path), stemmer='none', overwrite=overwrite)
    if not index.built():
        index.toks_indexer().index(encoded_docs)
    return index


def diffretriever_system(model_path, dataset, cache_dir, *, mode: str = 'hybrid', k_query: Optional[int] = None,
                         k_doc: Optional[int] = None,
                         num_results: int = 1000, **encoder_args) -> pt.Transformer:
    """The DiffRetriever pipeline for the main job: encodes ``dataset``'s corpus once into ``cache_dir`` (per model path and K_doc)
    (MultiVectorIndex of ``doc_embs`` and PISA index of ``toks``) and returns query encoder >> retriever.
    K defaults to the checkpoint's saved budgets (4 and 4 for a plain backbone).

    ``mode`` is ``dense`` (MaxSim), ``mean`` (mean-pooled vectors), ``sparse`` or ``hybrid`` (0.5/0.5).
    """
    from pyterrier_multiquery.diffretriever.encoder import DiffRetriever
    from pyterrier_multiquery.index import MultiVectorIndex
    if mode not in ('dense', 'mean', 'sparse', 'hybrid'):
        raise ValueError(f"mode must be 'dense', 'mean', 'sparse' or 'hybrid', got {mode!r}")
    encoder = DiffRetriever.from_pretrained(str(model_path), k_query=k_query, k_doc=k_doc, **encoder_args)
    cache = Path(cache_dir)
    name = f'diffretriever-{hashlib.sha1(str(Path(model_path).resolve()).encode()).hexdigest()[:10]}-k{encoder.k_doc}'
    dense_index = MultiVectorIndex(cache / f'{name}.mvi', verbose=False)
    pisa_path = cache / f'{name}.pisa'
    if not dense_index.built() or not pisa_path.exists():
        docs = encoder.doc_encoder()(pd_frame(dataset))
        if not dense_index.built():
            dense_index.indexer().index(docs[['docno', 'doc_embs']].to_dict(orient='records'))
        sparse_index(pisa_path, docs[['docno', 'toks']].to_dict(orient='records'))
    dense = dense_index.maxsim_retriever(num_results=num_results) if mode != 'mean' else \
        dense_index.mean_retriever(num_results=num_results, normalise=True)
    sparse = sparse_index(pisa_path, []).quantized(num_results=num_results)
    first = {'dense': dense, 'mean': dense, 'sparse': sparse,
             'hybrid': HybridRetriever(dense, sparse, num_results=num_results)}[mode]
    return encoder.query_encoder() >> first


def pd_frame(dataset):
    """The corpus of a PyTerrier dataset as a frame of ``docno`` and ``text`` (title and text joined)."""
    import pandas as pd
    rows = [{'docno': d['docno'], 'text': (d.get('title', '') + ' ' + d['text']).strip()}
            for d in dataset.get_corpus_iter(verbose=False)]
    return pd.DataFrame(rows)
