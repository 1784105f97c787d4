"""Multi-answer evaluation measures: ``MRecall@k`` and ``AnswerRecall@k``.

The relevance unit is an *answer*: qrels carry one row per (query, passage, answer), with the answer id
in the ``iteration`` column (the convention ndeval uses for subtopics, so the same qrels also feed
``alpha_nDCG@k``). An answer is covered when any passage supporting it (``relevance >= rel``) is in the
top k. The answer ids ``'0'`` and ``'Q0'`` are TREC's placeholders (and what ir_measures fills in when a
qrels frame has no ``iteration`` column): such rows fall back to one answer per relevant document.
Answer ids in multi-answer qrels therefore start from 1.

A query that appears in the qrels but has no relevant passage counts as 0 for both measures (no answer
can be covered), as ir_measures' ``R@k`` does; a query absent from the qrels is not evaluated.

Ranking follows trec_eval: score descending, ties broken by docno descending; a docno retrieved twice for
a query takes one place, at its highest score.

Importing this module also keeps ir_measures' ndeval provider from printing "All queries have only 1 subtopic!"
where the warning does not apply (see :func:`subtopics_given_or_moot`).
"""
import contextlib
import functools
import numbers
import sys
from typing import Iterator, Tuple

import pandas as pd
from ir_measures import measures
from ir_measures.util import Metric

_PLACEHOLDER_ANSWERS = ('0', 'Q0')


def answer_ids(support: pd.DataFrame, doc_column: str = 'docno') -> pd.Series:
    """The answer each (relevant) qrels row supports: its ``iteration``, or, where there is no answer id (no
    ``iteration`` column, or a TREC placeholder), the document itself, marked so it never equals an answer id."""
    documents = '\0doc:' + support[doc_column].astype(str)
    if 'iteration' not in support.columns:
        return documents
    answer = support['iteration'].astype(str)
    return answer.where(~answer.isin(_PLACEHOLDER_ANSWERS), documents)


def answer_coverage(qrels, run, cutoff: int, rel: int = 1) -> Iterator[Tuple[str, int, int]]:
    """Counts the answers that the top ``cutoff`` of a run covers.

    Args:
        qrels: ir_measures-style frame with ``query_id``, ``doc_id``, ``relevance`` and (optionally) ``iteration``.
        run: ir_measures-style frame with ``query_id``, ``doc_id`` and ``score``.
        cutoff: Number of top-ranked passages per query that count.
        rel: Minimum relevance for a passage to support its answer.

    Yields:
        ``(query_id, covered, total)`` for every query in the qrels: the number of distinct answers covered in
        the top ``cutoff`` and the number of answers with at least one supporting passage.
    """
    _require_columns(qrels, ('query_id', 'doc_id', 'relevance'), 'qrels')
    _require_columns(run, ('query_id', 'doc_id', 'score'), 'run')
    qids = qrels['query_id'].astype(str).unique()
    support = qrels[qrels['relevance'] >= rel]
    support = support.assign(query_id=support['query_id'].astype(str), doc_id=support['doc_id'].astype(str))
    support = support[['query_id', 'doc_id']].assign(answer=answer_ids(support, 'doc_id').values)
    totals = support.groupby('query_id')['answer'].nunique()

    top = run[['query_id', 'doc_id', 'score']].astype({'query_id': str, 'doc_id': str})
    top = top.sort_values(['query_id', 'score', 'doc_id'], ascending=[True, False, False], kind='stable')
    top = top.drop_duplicates(['query_id', 'doc_id']).groupby('query_id').head(cutoff)
    covered = top.merge(support, on=['query_id', 'doc_id']).groupby('query_id')['answer'].nunique()

    for qid in qids:
        yield qid, int(covered.get(qid, 0)), int(totals.get(qid, 0))


def _require_columns(frame, columns, what):
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f'{what} is missing column(s) {missing} needed for multi-answer measures; '
                         f'found {list(frame.columns)}')


class _MultiAnswerMeasure(measures.Measure):
    SUPPORTED_PARAMS = {
        'cutoff': measures.ParamInfo(dtype=int, required=True, desc='ranking cutoff threshold'),
        'rel': measures.ParamInfo(dtype=int, default=1, desc='minimum relevance for a passage to support its answer'),
    }
    RUN_INPUTS = ['query_id', 'doc_id', 'score']
    QREL_INPUTS = ['query_id', 'doc_id', 'relevance', 'iteration']

    def __init__(self, **params):
        cutoff = params.get('cutoff')
        if cutoff is not None and (isinstance(cutoff, bool) or not isinstance(cutoff, numbers.Integral) or cutoff < 1):
            raise ValueError(f'{self.NAME}@k needs a whole number k >= 1 (the top k passages that count), '
                             f'got {cutoff!r}')
        super().__init__(**params)

    def runtime_impl(self, qrels, run):
        """Computes the measure per query (called by ir_measures' runtime provider)."""
        cutoff = self['cutoff']
        for qid, covered, total in answer_coverage(qrels, run, cutoff, self['rel']):
            yield Metric(qid, self, self._value(covered, total, cutoff))


class _MRecall(_MultiAnswerMeasure):
    """MRecall@k: 1 if the top k covers all m answers (m <= k) or at least k answers (m > k), else 0."""
    __name__ = 'MRecall'
    NAME = __name__
    PRETTY_NAME = 'Multi-answer recall at k'
    SHORT_DESC = 'Whether the top k covers min(k, m) of the m answers of a query.'

    @staticmethod
    def _value(covered, total, cutoff):
        return float(total > 0 and covered >= min(total, cutoff))


class _AnswerRecall(_MultiAnswerMeasure):
    """AnswerRecall@k: the fraction of a query's answers covered by the top k."""
    __name__ = 'AnswerRecall'
    NAME = __name__
    PRETTY_NAME = 'Answer recall at k'
    SHORT_DESC = 'The fraction of the answers of a query covered by the top k.'

    @staticmethod
    def _value(covered, total, cutoff):
        return covered / total if total else 0.


_SINGLE_SUBTOPIC_WARNING = 'WARNING: All queries have only 1 subtopic!'


def subtopics_given_or_moot(qrels) -> bool:
    """Whether ndeval's "All queries have only 1 subtopic!" warning does not apply to these qrels.

    The warning guards against diversity qrels passed without their subtopics. It does not apply when the qrels
    frame carries an ``iteration`` column (the subtopics, here answer ids, were given: the collection has one
    answer per query), nor when no query has more than one relevant passage (subtopics cannot change a measure).
    Qrels that are not a frame are left to the warning.
    """
    if not isinstance(qrels, pd.DataFrame):
        return False
    if 'iteration' in qrels.columns:
        return True
    relevant = qrels[qrels['relevance'] > 0] if 'relevance' in qrels.columns else qrels
    return 'query_id' in qrels.columns and not relevant['query_id'].duplicated().any()


class _WithoutLine:
    """A stderr that drops writes starting with ``prefix``."""

    def __init__(self, stream, prefix: str):
        self.stream = stream
        self.prefix = prefix

    def write(self, text):
        return len(text) if text.startswith(self.prefix) else self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _silence_single_subtopic_warning_where_moot() -> None:
    """Wraps ir_measures' pyndeval provider so it prints its one-subtopic warning only where it applies."""
    from ir_measures.providers.pyndeval_provider import PyNdEvalProvider
    evaluator = PyNdEvalProvider._evaluator
    if getattr(evaluator, '_pyterrier_multiquery', False):
        return

    @functools.wraps(evaluator)
    def _evaluator(self, measures, qrels):
        if not subtopics_given_or_moot(qrels):
            return evaluator(self, measures, qrels)
        with contextlib.redirect_stderr(_WithoutLine(sys.stderr, _SINGLE_SUBTOPIC_WARNING)):
            return evaluator(self, measures, qrels)

    _evaluator._pyterrier_multiquery = True
    PyNdEvalProvider._evaluator = _evaluator


MRecall = _MRecall()
AnswerRecall = _AnswerRecall()
measures.register(MRecall)
measures.register(AnswerRecall)
_silence_single_subtopic_warning_where_moot()

__all__ = ['MRecall', 'AnswerRecall', 'answer_coverage']
