"""The base of the encoders that emit several vectors per text (DiffRetriever, DiffEmbed, PromptReps, AMER).

It has the shape of pyterrier_dr's ``BiEncoder``: :meth:`~MultiVectorEncoder.query_encoder` and
:meth:`~MultiVectorEncoder.doc_encoder` give transformers, :meth:`~MultiVectorEncoder.encode_queries` and
:meth:`~MultiVectorEncoder.encode_docs` batch the texts, and ``batch_size``, ``text_field``, ``verbose`` and
``device`` are kept in one place. It does not subclass ``BiEncoder``: that class's contract is one vector per text
(``query_vec``/``doc_vec``, ``(n, d)`` arrays, a ``query_vec . doc_vec`` scorer), and a multi-vector encoder in its
place would be taken for a single-vector one by code that trusts ``isinstance``. torch loads only when texts are
encoded.
"""
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import more_itertools
import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._device import resolve_device
from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._transformer import DerivedIdentity


class Encoded(NamedTuple):
    """The representations of a list of texts."""
    embs: List[np.ndarray]
    """One ``(k, d)`` float32 array per text, one row per vector."""
    toks: Optional[List[Dict[str, float]]] = None
    """Sparse ``{term: weight}`` per text, from encoders whose ``sparse`` is true; None from the others."""


class MultiVectorEncoder(pt.Transformer):
    """An encoder that represents a text by several vectors (``query_embs``/``doc_embs``, and the sparse
    ``query_toks``/``toks`` when ``sparse``).

    Like pyterrier_dr's ``BiEncoder``, it is a transformer factory (:meth:`query_encoder`, :meth:`doc_encoder`) and a
    transformer that picks the side from the columns of its input. A subclass sets its model before calling
    ``__init__`` (which moves it to ``device``), returns it from :attr:`module`, encodes one batch in
    :meth:`encode_query_batch` and :meth:`encode_doc_batch`, and names the settings that tell two instances apart
    in ``settings`` (they appear in the repr).
    """
    #: Whether the encoder also gives sparse weights (``query_toks``/``toks``).
    sparse: bool = False
    #: Attributes, besides the model, that define the encoder (shown by ``repr``, compared by ``==``).
    settings: Tuple[str, ...] = ()
    #: Those of ``settings`` that change only how queries are encoded (left out of :meth:`doc_repr`).
    query_settings: Tuple[str, ...] = ()

    def __init__(self, *, batch_size: int = 16, text_field: str = 'text', verbose: bool = False,
                 device: Optional[str] = None):
        """
        Args:
            batch_size: Texts per forward pass.
            text_field: The column holding the document text.
            verbose: Whether to show progress bars.
            device: Torch device (default: CUDA when available, else the CPU).
        """
        if batch_size < 1:
            raise ValueError(f'batch_size must be at least 1, got {batch_size}')
        self.batch_size = batch_size
        self.text_field = text_field
        self.verbose = verbose
        self.device = resolve_device(device)
        self.module.to(self.device).eval()

    @property
    def module(self):
        """The torch module that encodes (its identity is part of equality: its weights can change)."""
        raise NotImplementedError(f'{type(self).__name__} must say which torch module it encodes with')

    def encode_query_batch(self, texts: List[str]) -> Encoded:
        """The representations of one batch of queries (called under ``torch.no_grad``)."""
        raise NotImplementedError(f'{type(self).__name__} does not encode queries')

    def encode_doc_batch(self, texts: List[str]) -> Encoded:
        """The representations of one batch of documents (called under ``torch.no_grad``)."""
        raise NotImplementedError(f'{type(self).__name__} does not encode documents')

    def encode_queries(self, texts: Iterable[str], batch_size: Optional[int] = None) -> Encoded:
        """Encodes query texts, ``batch_size`` (default: ``self.batch_size``) at a time."""
        return self._batched(texts, batch_size, self.encode_query_batch)

    def encode_docs(self, texts: Iterable[str], batch_size: Optional[int] = None) -> Encoded:
        """Encodes document texts, ``batch_size`` (default: ``self.batch_size``) at a time."""
        return self._batched(texts, batch_size, self.encode_doc_batch)

    def _batched(self, texts: Iterable[str], batch_size: Optional[int],
                 encode_batch: Callable[[List[str]], Encoded]) -> Encoded:
        with requires('dense'):
            import torch
        embs, toks = [], []
        with torch.no_grad():
            # chunked reads lazily, so that a pt.tqdm around ``texts`` counts the texts as they are encoded
            for batch in more_itertools.chunked(texts, batch_size or self.batch_size):
                out = encode_batch(batch)
                embs.extend(out.embs)
                if self.sparse:
                    toks.extend(out.toks)
        return Encoded(embs, toks if self.sparse else None)

    def query_encoder(self, verbose: Optional[bool] = None, batch_size: Optional[int] = None) -> pt.Transformer:
        """A transformer adding ``query_embs`` (and ``query_toks`` when ``sparse``) to a frame of queries."""
        return MultiVectorQueryEncoder(self, verbose=verbose, batch_size=batch_size)

    def doc_encoder(self, verbose: Optional[bool] = None, batch_size: Optional[int] = None,
                    text_field: Optional[str] = None) -> pt.Transformer:
        """A transformer adding ``doc_embs`` (and ``toks`` when ``sparse``) to a frame of documents."""
        return MultiVectorDocEncoder(self, verbose=verbose, batch_size=batch_size, text_field=text_field)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Encodes the queries of a query frame or the texts of a document frame."""
        with pt.validate.any(inp) as v:
            v.query_frame(extra_columns=['query'], mode='query_encoder')
            v.document_frame(extra_columns=[self.text_field], mode='doc_encoder')
            v.columns(includes=['query'], mode='query_encoder')
            v.columns(includes=[self.text_field], mode='doc_encoder')
        if v.mode == 'query_encoder':
            return self.query_encoder()(inp)
        return self.doc_encoder()(inp)

    def _key(self):
        return (type(self), id(self.module), self.batch_size, self.text_field, self.device,  # verbose: PRESENTATION
                tuple(getattr(self, name) for name in self.settings))

    def __eq__(self, other):
        if not isinstance(other, MultiVectorEncoder):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return self._repr(self.settings)

    def doc_repr(self) -> str:
        """The repr without the query-only settings: equal for two encoders that encode documents alike (given
        equal weights), so that an index of documents can key by it."""
        return self._repr([name for name in self.settings if name not in self.query_settings])

    def _repr(self, names) -> str:
        args = [type(self.module).__name__] + [f'{name}={getattr(self, name)!r}' for name in names]
        return f'{type(self).__name__}({", ".join(args)})'


def _assign(inp: pd.DataFrame, columns: Dict[str, list]) -> pd.DataFrame:
    """``inp`` with the given columns of per-row objects (arrays, dicts), of object dtype also when empty."""
    return inp.assign(**{name: pd.Series(values, index=inp.index, dtype=object) for name, values in columns.items()})


def _texts(inp: pd.DataFrame, column: str, id_column: str) -> pd.Series:
    """``inp[column]``, after checking that every row holds a string (a missing text would otherwise be encoded
    as another row's, or fail deep in the tokenizer)."""
    texts = inp[column]
    bad = ~texts.map(lambda text: isinstance(text, str))
    if bad.any():
        ids = inp.loc[bad, id_column].tolist()
        raise ValueError(f'{column!r} is missing or not a string for {id_column} {ids[:5]}'
                         f'{f" and {len(ids) - 5} more" if len(ids) > 5 else ""}')
    return texts


def _label(encoder: MultiVectorEncoder, side: str) -> str:
    return f"{getattr(encoder, 'schematic', {}).get('label', type(encoder).__name__)} {side}"


class MultiVectorQueryEncoder(DerivedIdentity, pt.Transformer):
    """The query side of a :class:`MultiVectorEncoder`: adds ``query_embs`` (and ``query_toks``); each distinct
    query is encoded once."""

    def __init__(self, encoder: MultiVectorEncoder, verbose: Optional[bool] = None, batch_size: Optional[int] = None):
        self.encoder = encoder
        self.verbose = verbose if verbose is not None else encoder.verbose
        self.batch_size = batch_size if batch_size is not None else encoder.batch_size
        self.schematic = {'label': _label(encoder, 'query')}

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        with pt.validate.any(inp) as v:
            v.query_frame(extra_columns=['query'])
            v.columns(includes=['query'])
        codes, queries = pd.factorize(_texts(inp, 'query', 'qid'))
        texts = pt.tqdm(queries, desc=repr(self), unit='query') if self.verbose else queries
        encoded = self.encoder.encode_queries(texts, batch_size=self.batch_size)
        columns = {'query_embs': [encoded.embs[c] for c in codes]}
        if self.encoder.sparse:
            columns['query_toks'] = [encoded.toks[c] for c in codes]
        return _assign(inp, columns)

    def __repr__(self):
        return f'{self.encoder!r}.query_encoder()'

    def subtransformers(self):
        return {}  # the encoder is the factory, not a stage of this transformer


class MultiVectorDocEncoder(DerivedIdentity, pt.Transformer):
    """The document side of a :class:`MultiVectorEncoder`: adds ``doc_embs`` (and ``toks``)."""

    def __init__(self, encoder: MultiVectorEncoder, verbose: Optional[bool] = None, batch_size: Optional[int] = None,
                 text_field: Optional[str] = None):
        self.encoder = encoder
        self.verbose = verbose if verbose is not None else encoder.verbose
        self.batch_size = batch_size if batch_size is not None else encoder.batch_size
        self.text_field = text_field if text_field is not None else encoder.text_field
        self.schematic = {'label': _label(encoder, 'doc')}

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        with pt.validate.any(inp) as v:
            v.document_frame(extra_columns=[self.text_field])
            v.columns(includes=[self.text_field])
        texts = _texts(inp, self.text_field, 'docno')
        if self.verbose:
            texts = pt.tqdm(texts, desc=repr(self), unit='doc')
        encoded = self.encoder.encode_docs(texts, batch_size=self.batch_size)
        columns = {'doc_embs': encoded.embs}
        if self.encoder.sparse:
            columns['toks'] = encoded.toks
        return _assign(inp, columns)

    def fuse_rank_cutoff(self, k: int) -> pt.Transformer:
        """``doc_encoder % k`` encodes only the top ``k``."""
        return pt.RankCutoff(k) >> self

    def __repr__(self):
        return f'{self.encoder!r}.doc_encoder()'

    def subtransformers(self):
        return {}  # the encoder is the factory, not a stage of this transformer
