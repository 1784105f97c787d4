"""AMER on the PyTerrier side: a query encoder writing ``query_embs``."""
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Union

import pandas as pd
import pyterrier as pt

from pyterrier_multiquery.multivector_encoder import Encoded, MultiVectorEncoder

if TYPE_CHECKING:
    from pyterrier_multiquery.amer.model import AMERModel


class AMER(MultiVectorEncoder):
    """Writes AMER's N query vectors of each query as ``query_embs`` (N x d, normalised).

    As a transformer it is its own :meth:`query_encoder`. With
    :meth:`MultiVectorIndex.multiquery_retriever <pyterrier_multiquery.index.MultiVectorIndex.multiquery_retriever>`
    each vector searches a single-vector document index on its own and the lists merge round-robin. AMER has no
    document side: the documents are the single-vector encoder's (see :meth:`doc_encoder`).
    """
    schematic = {'label': 'AMER'}
    settings = ('num_vectors',)

    def __init__(self, model: Union[str, Path, 'AMERModel'], *, num_vectors: Optional[int] = None,
                 batch_size: int = 32, device: Optional[str] = None, verbose: bool = False):
        """
        Args:
            model: A trained :class:`~pyterrier_multiquery.amer.model.AMERModel` or the folder it was saved to.
            num_vectors: N (default: the model's).
            batch_size: Queries per forward pass.
            device: Torch device (default: CUDA when available).
            verbose: Whether to show a progress bar.
        """
        if isinstance(model, (str, Path)):
            from pyterrier_multiquery.amer.model import AMERModel
            model = AMERModel.from_pretrained(model)
        if num_vectors is not None and num_vectors < 1:
            raise ValueError(f'num_vectors must be positive, got {num_vectors}')
        self.model = model
        self.num_vectors = model.num_vectors if num_vectors is None else num_vectors
        super().__init__(batch_size=batch_size, verbose=verbose, device=device)

    @property
    def module(self):
        return self.model

    def encode_query_batch(self, texts: List[str]) -> Encoded:
        return Encoded(list(self.model.encode(texts, self.num_vectors, batch_size=len(texts))))

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Adds ``query_embs`` to a query frame."""
        return self.query_encoder()(inp)

    def doc_encoder(self, verbose=None, batch_size=None, text_field=None) -> pt.Transformer:
        """AMER encodes no documents: its vectors search the index of the single-vector encoder it was trained
        against (all-MiniLM-L6-v2's ``doc_vec`` through pyterrier_dr in this package), so that encoder's
        ``doc_encoder()`` indexes them."""
        raise NotImplementedError(
            'AMER encodes queries only: index the documents with the single-vector encoder its vectors were trained '
            "against (e.g. pyterrier_dr's doc_encoder(), doc_vec) and search them with "
            'MultiVectorIndex.multiquery_retriever')
