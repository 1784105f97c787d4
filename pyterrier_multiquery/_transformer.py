"""``__repr__``, ``__eq__``, ``__hash__`` and ``fuse_rank_cutoff`` derived from a transformer's constructor
arguments, as PyTerrier reads them (:func:`pyterrier.inspect.transformer_attributes`), instead of written per class."""
import os
from typing import Optional, Tuple

import pyterrier as pt
import pyterrier_alpha as pta

#: Constructor arguments that change how a transformer shows its work, never what it returns.
PRESENTATION = ('verbose',)


def attribute_key(transformer) -> Tuple:
    """The constructor arguments of ``transformer`` (but :data:`PRESENTATION`) as a hashable tuple; paths compare
    as strings, lists and dicts by content, other values as they are (models by identity)."""
    return tuple((attribute.name, _hashable(attribute.value))
                 for attribute in pt.inspect.transformer_attributes(transformer)
                 if attribute.name not in PRESENTATION)


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


class DerivedIdentity:
    """``__repr__`` (pyterrier_alpha's ``transformer_repr``), ``__eq__`` and ``__hash__`` from the constructor
    arguments: two instances of one class built with the same arguments are equal."""
    __repr__ = pta.transformer_repr

    def __eq__(self, other):
        return type(other) is type(self) and attribute_key(self) == attribute_key(other)

    def __hash__(self):
        return hash((type(self), attribute_key(self)))


def check_positive(**settings) -> None:
    """Raises naming the first of the ``settings`` (``name=value``) that is given (not None) and below 1."""
    for name, value in settings.items():
        if value is not None and value < 1:
            raise ValueError(f'{name} must be positive, got {value}')


class NumResultsCutoff:
    """``fuse_rank_cutoff`` of a transformer whose ``num_results`` caps the documents it returns per query:
    ``transformer % k`` with ``k`` below ``num_results`` (or where ``num_results`` is None, no cap) becomes the
    transformer rebuilt with ``num_results=k`` (:func:`pyterrier.inspect.transformer_apply_attributes`)."""

    def fuse_rank_cutoff(self, k: int) -> Optional[pt.Transformer]:
        if self.num_results is not None and k >= self.num_results:
            return None
        return pt.inspect.transformer_apply_attributes(self, num_results=k)


#: What to do where a transformer needs a vector column and the frame holds another (needed, found): the fix.
COLUMN_FIXES = {
    ('query_embs', 'query_vec'): 'query_vec holds one vector a query (a single-vector encoder\'s output) and this '
                                 'transformer reads query_embs, a 2-D array a query: encode with a multi-vector '
                                 'encoder, or search a single-vector index (flex_index) instead',
    ('query_embs', 'query'): 'the queries are not encoded yet: put a query encoder before it '
                             '(encoder.query_encoder() >> ...)',
}


def validate_frame(transformer, inp, kind: str, columns: list) -> None:
    """``pt.validate.query_frame`` (``kind='query'``) or ``result_frame`` of ``inp`` with the ``columns`` the
    transformer reads, whose error names the transformer, the missing columns and, where a known column stands in
    for one (:data:`COLUMN_FIXES`), the fix; or, for a query frame, the result frame's columns it should not have."""
    validate = pt.validate.query_frame if kind == 'query' else pt.validate.result_frame
    try:
        validate(inp, extra_columns=columns)
    except pt.validate.InputValidationError as e:
        needed = ['qid', *(['docno'] if kind == 'result' else []), *columns]
        missing = [c for c in needed if c not in inp.columns]
        if not missing:  # a query frame with a result frame's column
            unexpected = sorted({c for mode in e.modes for c in mode.extra_columns})
            raise pt.validate.InputValidationError(
                f'{transformer!r} takes a query frame (one row a query), but its input has the column(s) '
                f'{unexpected} of a result frame: drop them, or keep one row a query', e.modes) from None
        fixes = [fix for (need, found), fix in COLUMN_FIXES.items() if need in missing and found in inp.columns]
        raise pt.validate.InputValidationError(
            f'{transformer!r} needs the column(s) {missing} in its input, which has {list(inp.columns)}'
            + ''.join(f'; {fix}' for fix in fixes[:1]), e.modes) from None
