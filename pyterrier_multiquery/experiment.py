"""Running experiments: where the data lies, cache folders, and checked :func:`pyterrier.Experiment` runs."""
import hashlib
import os
import re
from pathlib import Path
from typing import Dict, Optional, Sequence

import pandas as pd
import pyterrier as pt
from ir_measures import alpha_nDCG, nDCG

from pyterrier_multiquery.measures import AnswerRecall, MRecall

DEFAULT_MEASURES = [MRecall@5, MRecall@10, MRecall@100, AnswerRecall@10, alpha_nDCG@10, nDCG@10]


def default_data_dir() -> Optional[Path]:
    """The ``shared/data`` folder beside the project checkout (or ``$PYTERRIER_MULTIQUERY_DATA``), if present."""
    candidates = [os.environ.get('PYTERRIER_MULTIQUERY_DATA'),
                  Path(__file__).resolve().parents[2] / 'shared' / 'data',
                  Path.cwd().parent / 'shared' / 'data']
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def cache_dir_for(dataset_spec: str, cache_root: os.PathLike) -> Path:
    """A cache folder for one dataset: its name plus a short hash of where it came from."""
    is_irds = dataset_spec.startswith('irds:')
    origin = dataset_spec if is_irds else str(Path(dataset_spec).resolve())
    name = re.sub(r'[^\w.-]+', '_', dataset_spec[len('irds:'):] if is_irds else Path(origin).name)
    return Path(cache_root) / f'{name}-{hashlib.sha1(origin.encode()).hexdigest()[:8]}'


def validate_topics_qrels(topics: pd.DataFrame, qrels: pd.DataFrame) -> None:
    """Raises a ValueError naming what is missing when topics or qrels lack a needed column."""
    for what, frame, columns in (('topics', topics, ['qid', 'query']), ('qrels', qrels, ['qid', 'docno', 'label'])):
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise ValueError(f'{what} is missing column(s) {missing}; found {list(frame.columns)}')


def run_experiment(systems: Dict[str, pt.Transformer], topics: pd.DataFrame, qrels: pd.DataFrame,
                   eval_metrics: Sequence = DEFAULT_MEASURES, **experiment_args) -> pd.DataFrame:
    """Runs :func:`pyterrier.Experiment` over named systems after checking the topics and qrels.

    Args:
        systems: Systems by name.
        topics: Frame with ``qid`` and ``query``.
        qrels: Frame with ``qid``, ``docno``, ``label`` (and ``iteration`` for answer ids).
        eval_metrics: Measures to report.
        experiment_args: Passed to :func:`pyterrier.Experiment` (``baseline``, ``perquery``, ...).
    """
    validate_topics_qrels(topics, qrels)
    table = pt.Experiment(list(systems.values()), topics, qrels, eval_metrics=list(eval_metrics),
                          names=list(systems), **experiment_args)
    measure_columns = [str(m) for m in eval_metrics]
    if set(measure_columns) <= set(table.columns):  # a summary table: measures in the order asked for
        table = table[['name'] + measure_columns + [c for c in table.columns if c not in measure_columns + ['name']]]
    return table
