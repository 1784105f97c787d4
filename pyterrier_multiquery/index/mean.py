"""The mean-pooling ablation: one mean vector per document and per query, searched by inner product."""
import json
import shutil

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building, exclusive_lock
from pyterrier_multiquery._transformer import DerivedIdentity, NumResultsCutoff, check_positive, validate_frame
from pyterrier_multiquery._vectors import normalise
from pyterrier_multiquery.index.errors import CorruptIndexError, retried_if_replaced


class MeanRetriever(DerivedIdentity, NumResultsCutoff, pt.Transformer):
    """Retrieves by the inner product of the query's mean vector and each document's mean vector.

    The document means are written once to a pyterrier_dr FlexIndex inside the index folder (``mean.flex``, or
    ``mean-normalised.flex``; a sharded index has one in each shard's folder), and searched exhaustively (as MaxSim
    of one vector against one), ties broken by the documents' order in the index.
    """
    schematic = {'label': 'Mean'}

    def __init__(self, index, *, num_results: int = 1000, normalise: bool = False, verbose: bool = False):
        """
        Args:
            index: The :class:`MultiVectorIndex` whose documents are pooled.
            num_results: Documents returned per query.
            normalise: Whether to scale both means to unit length (cosine of the means).
            verbose: Whether to show progress bars.
        """
        check_positive(num_results=num_results)
        self.index = index
        self.num_results = num_results
        self.normalise = normalise
        self.verbose = verbose

    def flex_index(self):
        """The FlexIndex of document means, built the first time it is needed (inside the index's folder, which a
        rebuild replaces whole, so it is never older than the vectors it pools)."""
        with requires('dense'):
            from pyterrier_dr import FlexIndex
        path = self.index.path / ('mean-normalised.flex' if self.normalise else 'mean.flex')
        with exclusive_lock(path):
            if not path.exists():
                with building(path) as tmp:
                    self._write_flex(tmp, FlexIndex)
        return FlexIndex(str(path), verbose=self.verbose)

    def _write_flex(self, folder, flex_class) -> None:
        """Writes the FlexIndex files: the means as float32 rows (``vecs.f4``), the index's own docnos file (the
        same docnos in the same order) and ``pt_meta.json``. FlexIndex's indexer is not used: the npids builder it
        writes docnos with fails on a single docno and on some accented ones (see ``core._docno_builder``)."""
        folder.mkdir()
        count, dim = 0, None
        with open(folder / 'vecs.f4', 'wb') as vecs:
            for document in self.index.get_corpus_iter(verbose=self.verbose):
                mean = self._pool(document['doc_embs'])
                if not np.isfinite(mean).all():
                    raise CorruptIndexError(f'document {str(document["docno"])!r} has non-finite values (NaN or inf) '
                                            f'in its stored vectors: the index at {str(self.index.path)!r} is '
                                            'damaged; rebuild it')
                vecs.write(mean.tobytes())
                count, dim = count + 1, len(mean)
        shutil.copyfile(self.index.path / 'docnos.npids', folder / 'docnos.npids')
        (folder / 'pt_meta.json').write_text(json.dumps({'type': flex_class.ARTIFACT_TYPE,
                                                          'format': flex_class.ARTIFACT_FORMAT,
                                                          'vec_size': dim, 'doc_count': count}))

    def _pool(self, embs) -> np.ndarray:
        mean = np.asarray(embs, dtype=np.float64).mean(axis=0, keepdims=True)  # a float32 sum could overflow
        return (normalise(mean) if self.normalise else mean)[0].astype(np.float32)  # a zero mean stays zero

    @retried_if_replaced
    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Retrieves for each query row (``qid``, ``query_embs``); each shard searches its own FlexIndex."""
        from pyterrier_multiquery.index.maxsim import check_unique_qids, merge_top, query_matrices, result_frame
        validate_frame(self, inp, 'query', ['query_embs'])
        check_unique_qids(inp)
        shards = self.index.searchers()
        results = []
        if len(inp):
            query_vecs = np.stack([self._pool(embs) for embs in query_matrices(inp, shards.meta['dim'])])
            per_shard = shards.map('mean', query_vecs, num_results=self.num_results, normalise=self.normalise,
                                   verbose=self.verbose)
            results = [merge_top(parts, self.num_results) for parts in zip(*per_shard)]
        out = result_frame(inp, results, shards.docnos)
        overflowed = ~np.isfinite(out['score'].to_numpy())
        if overflowed.any():
            row = out.iloc[int(np.argmax(overflowed))]
            raise ValueError(f'query {row["qid"]!r}: its score against the mean of document {row["docno"]!r} is '
                             f'{row["score"]} (float32 overflows): scale its query_embs down')
        return out

