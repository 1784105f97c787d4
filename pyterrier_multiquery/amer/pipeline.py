"""AMER on the PyTerrier side: a query encoder writing ``query_embs``."""
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

import numpy as np
import pandas as pd
import pyterrier as pt

if TYPE_CHECKING:
    from pyterrier_multiquery.amer.model import AMER


class AMERQueryEncoder(pt.Transformer):
    """Writes AMER's N query vectors of each query as ``query_embs`` (N x d, normalised).

    With :meth:`MultiVectorIndex.multiquery_retriever <pyterrier_multiquery.index.MultiVectorIndex.multiquery_retriever>`
    each vector searches a single-vector document index on its own and the lists merge round-robin.
    """
    schematic = {'label': 'AMER'}

    def __init__(self, model: Union[str, Path, 'AMER'], *, num_vectors: Optional[int] = None,
                 batch_size: int = 32, device: Optional[str] = None, verbose: bool = False):
        """
        Args:
            model: A trained :class:`~pyterrier_multiquery.amer.model.AMER` or the folder it was saved to.
            num_vectors: N (default: the model's).
            batch_size: Queries per forward pass.
            device: Torch device (default: CUDA when available).
            verbose: Whether to show a progress bar.
        """
        from pyterrier_multiquery._device import resolve_device
        if isinstance(model, (str, Path)):
            from pyterrier_multiquery.amer.model import AMER
            model = AMER.from_pretrained(model)
        self.model = model.to(resolve_device(device)).eval()
        self.num_vectors = num_vectors
        self.batch_size = batch_size
        self.device = device
        self.verbose = verbose

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Adds ``query_embs`` to a query frame."""
        pt.validate.query_frame(inp, extra_columns=['query'])
        queries = inp['query'].tolist()
        batches = range(0, len(queries), self.batch_size)
        if self.verbose:
            batches = pt.tqdm(batches, desc=repr(self), unit='batch')
        embs = [self.model.encode(queries[b:b + self.batch_size], self.num_vectors, batch_size=self.batch_size)
                for b in batches]
        embs = np.concatenate(embs) if embs else np.zeros((0, 1, self.model.doc_dim), dtype=np.float32)
        return inp.assign(query_embs=list(embs))

    def __repr__(self):
        return f'AMERQueryEncoder(num_vectors={self.num_vectors or self.model.num_vectors!r})'

    def __eq__(self, other):
        return isinstance(other, AMERQueryEncoder) and other.model is self.model and other.num_vectors == self.num_vectors

    def __hash__(self):
        return hash((AMERQueryEncoder, id(self.model), self.num_vectors))
