"""Checks of MaxSim scores that are not finite: a damaged document is named, else the query whose vectors overflow."""
import numpy as np

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.index.errors import CorruptIndexError

with requires('dense'):
    import torch


class ScoreCheck:
    """Raises where a score is not finite: naming the document when its stored vectors are not (a damaged index),
    else the query, whose vectors overflow float32 against the document's."""

    def __init__(self, qids: list, payload, path):
        """
        Args:
            qids: The qids of the queries, in the order of the score rows' queries.
            payload: ``payload()`` of the index (or shard) whose documents are scored.
            path: Its folder, for messages.
        """
        self.qids = qids
        self.payload = payload
        self.path = path

    def __call__(self, scores, docids: np.ndarray, first_query: int) -> None:
        """Checks ``(queries, documents)`` scores of the queries from ``first_query`` on.

        Args:
            scores: The scores (a tensor or an array).
            docids: The documents of the columns, or of each score (an array of the scores' shape).
            first_query: The position in ``qids`` of the first row's query.
        """
        finite = torch.isfinite(scores) if isinstance(scores, torch.Tensor) else np.isfinite(scores)
        if bool(finite.all()):
            return
        finite = finite.cpu().numpy() if isinstance(finite, torch.Tensor) else finite
        row, column = (int(i) for i in np.argwhere(~finite)[0])
        docid = int(docids[row, column] if np.ndim(docids) == 2 else docids[column])
        self.stored_vectors([docid])
        docno = str(self.payload[3].fwd[docid])
        raise ValueError(f'query {self.qids[first_query + row]!r}: its MaxSim score against document {docno!r} is '
                         f'{float(scores[row, column])} (float32 overflows): the query\'s or the document\'s vectors '
                         f'are too large (scale its query_embs down; index.verify() checks the stored vectors)')

    def stored_vectors(self, docids) -> None:
        """Raises :class:`CorruptIndexError` naming the first of the documents whose stored vectors are not all
        finite (a damaged index)."""
        _, vectors, offsets, docnos = self.payload
        for docid in docids:
            if not np.isfinite(np.asarray(vectors[offsets[docid]:offsets[docid + 1]], dtype=np.float32)).all():
                raise CorruptIndexError(f'document {str(docnos.fwd[int(docid)])!r} has non-finite values (NaN or '
                                        f'inf) in its stored vectors: the index at {str(self.path)!r} is damaged; '
                                        'rebuild it')
