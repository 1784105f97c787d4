"""CDP's training pairs: one (generated query, document) pair per query generated for each document."""
from typing import Optional

import pandas as pd
import pyterrier as pt

from pyterrier_multiquery.generation.query_transformers import query_lists


def synthetic_pairs(documents: pd.DataFrame, num_queries: Optional[int] = None) -> pd.DataFrame:
    """One training question per generated query of each document, its document the one relevant passage.

    The frame is both the topics and, with ``label=1``, the qrels of
    :class:`~pyterrier_multiquery.training.bi_encoder.BiEncoderTrainer` (``hard_negatives=0``: in-batch negatives)::

        pairs = synthetic_pairs(documents, 3)
        BiEncoderTrainer(checkpoint, dict(zip(pairs['docno'], pairs['text'])), hard_negatives=0).fit(
            pairs, pairs.assign(label=1))

    Args:
        documents: Frame with ``docno``, ``text`` and ``querygen`` (a list of queries per document).
        num_queries: Use only each document's first this many queries (M); all when None.

    Returns:
        Frame with ``qid`` (``docno#i`` for its i-th query), ``query``, ``docno`` and ``text``.
    """
    pt.validate.columns(documents, includes=['docno', 'text', 'querygen'])
    queries = query_lists(documents['docno'], documents['querygen'])
    pairs = documents[['docno', 'text']].assign(query=[q[:num_queries] for q in queries])
    pairs = pairs.explode('query').dropna(subset=['query']).reset_index(drop=True)
    pairs['qid'] = pairs['docno'].astype(str) + '#' + pairs.groupby('docno').cumcount().astype(str)
    return pairs[['qid', 'query', 'docno', 'text']]
