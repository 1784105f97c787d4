"""Evaluation on top of pt.Experiment and ir_measures: checked experiment tables, per-query frames, cross-validation folds, paired tests over subsets, reports.

An experiment runs its systems (per fold, if it cross-validates), concatenates each system's runs, and hands them
to :func:`per_query` and :func:`compare`; :func:`write_report` writes the result as markdown and JSON.
"""
import json
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt
from ir_measures import alpha_nDCG, nDCG

from pyterrier_multiquery.analysis import paired_bootstrap
from pyterrier_multiquery.measures import AnswerRecall, MRecall

#: The measures of the main job's table and of :func:`run_experiment` by default.
DEFAULT_MEASURES = [MRecall@5, MRecall@10, MRecall@100, AnswerRecall@10, alpha_nDCG@10, nDCG@10]



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


def _ir_measures_frames(run: pd.DataFrame, qrels: pd.DataFrame) -> Tuple[pd.DataFrame, pd.DataFrame]:
    qrels = qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})
    run = run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'})
    return run, qrels


def per_query(runs: Mapping[str, pd.DataFrame], qrels: pd.DataFrame, measures: Sequence) -> pd.DataFrame:
    """Per-query values of each run: a frame with ``system``, ``qid``, ``measure`` and ``value``.

    Every query in ``qrels`` gets a value for every measure and system (0 where a run retrieved nothing for it),
    so that paired tests compare the same queries.

    Args:
        runs: Result frames (``qid``, ``docno``, ``score``) by system name.
        qrels: Frame with ``qid``, ``docno``, ``label`` (and ``iteration`` for answer ids).
        measures: ir_measures measures.
    """
    from ir_measures import iter_calc
    frames = []
    qids = pd.Index(qrels['qid'].astype(str).unique(), name='qid')
    for name, run in runs.items():
        run, judged = _ir_measures_frames(run, qrels)
        values = pd.DataFrame([(str(m.measure), m.query_id, m.value) for m in iter_calc(list(measures), judged, run)],
                              columns=['measure', 'qid', 'value'])
        wide = values.pivot(index='qid', columns='measure', values='value').reindex(qids).fillna(0.)
        wide = wide.reindex(columns=[str(m) for m in measures], fill_value=0.)
        long = wide.reset_index().melt(id_vars='qid', var_name='measure', value_name='value')
        frames.append(long.assign(system=name))
    columns = ['system', 'qid', 'measure', 'value']
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def compare(scores: pd.DataFrame, baseline: str, subsets: Optional[Mapping[str, Iterable[str]]] = None, *,
            seed: int = 0) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Means by system and subset, and a paired bootstrap of each system against ``baseline``.

    Args:
        scores: A :func:`per_query` frame.
        baseline: The system every other one is tested against.
        subsets: Named sets of qids (``'all'`` is added: every query).
        seed: Seed of the bootstrap.

    Returns:
        ``(means, tests)``: ``means`` has one row per system and columns ``'<measure> (<subset>)'``; ``tests`` has
        one row per system, measure and subset with the mean difference, its confidence interval and ``p_value``.
    """
    if baseline not in set(scores['system']):
        raise ValueError(f'baseline {baseline!r} is not among the systems {sorted(set(scores["system"]))}')
    subsets = {'all': scores['qid'].unique(), **(subsets or {})}
    systems = list(dict.fromkeys(scores['system']))
    measures = list(dict.fromkeys(scores['measure']))
    wide = scores.pivot_table(index=['system', 'measure'], columns='qid', values='value')
    means, tests = [], []
    for system in systems:
        row = {'system': system}
        for subset, qids in subsets.items():
            qids = [q for q in dict.fromkeys(qids) if q in wide.columns]
            for measure in measures:
                values = wide.loc[(system, measure), qids]
                row[f'{measure} ({subset})'] = float(values.mean())
                if system != baseline:
                    tests.append({'system': system, 'baseline': baseline, 'measure': measure, 'questions': subset,
                                  **paired_bootstrap(values, wide.loc[(baseline, measure), qids], seed=seed)})
        means.append(row)
    return pd.DataFrame(means), pd.DataFrame(tests)


def answer_counts(qrels: pd.DataFrame) -> pd.Series:
    """Number of distinct answers per qid, as the multi-answer measures count them."""
    from pyterrier_multiquery.measures import answer_ids
    relevant = qrels[qrels['label'] > 0]
    return answer_ids(relevant).groupby(relevant['qid']).nunique().rename('answers')


def _answer_strata(counts: pd.Series, members: int) -> np.ndarray:
    """Answer counts as strata of at least ``members`` questions: rarer, larger counts join the largest such one."""
    frequent = counts.value_counts()
    return counts.clip(upper=frequent[frequent >= members].index.max()).to_numpy()


def cross_validation_folds(qrels: pd.DataFrame, folds: int = 5, *, seed: int = 0) -> Iterator[Tuple[List[str], List[str]]]:
    """``(train_qids, test_qids)`` of each fold, split by question and stratified by the number of answers.

    Only queries with a relevant passage take part.
    """
    from sklearn.model_selection import StratifiedKFold
    counts = answer_counts(qrels)
    qids = counts.index.astype(str).tolist()
    strata = _answer_strata(counts, folds)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(qids, strata):
        yield [qids[i] for i in train], [qids[i] for i in test]


def split_by_question(qrels: pd.DataFrame, train_fraction: float = 0.6, *, seed: int = 0) -> Tuple[List[str], List[str]]:
    """``(train_qids, test_qids)``: a fixed split by question, stratified by the number of answers.

    Only queries with a relevant passage take part. The main job splits RAMDocs and MuSiQue this way (60 % of the
    questions for training, seed 0).
    """
    from sklearn.model_selection import train_test_split
    counts = answer_counts(qrels)
    train, test = train_test_split(counts.index.astype(str).tolist(), train_size=train_fraction, random_state=seed,
                                   stratify=_answer_strata(counts, 2))
    return train, test


class Split(NamedTuple):
    """Topics and qrels of a training part (None where there is none) and of a test part."""
    train_topics: Optional[pd.DataFrame]
    train_qrels: Optional[pd.DataFrame]
    test_topics: pd.DataFrame
    test_qrels: pd.DataFrame
    description: str


def dataset_split(dataset, variant: Optional[str] = None, *, train_fraction: float = 0.6, seed: int = 0) -> Split:
    """The training and test parts of a dataset.

    A BEIR directory with a ``train`` qrels file trains on it and tests on ``variant`` (default ``test``); RAMDocs
    and MuSiQue, which ship one set of questions, get the fixed :func:`split_by_question`; any other dataset has
    no training part (``train_topics`` is None) and tests on all of its queries.
    """
    from pyterrier_multiquery.loaders import BeirDataset, MusiqueDataset, RamDocsDataset
    if isinstance(dataset, (RamDocsDataset, MusiqueDataset)):
        topics, qrels = dataset.get_topics(), dataset.get_qrels()
        train, test = split_by_question(qrels, train_fraction, seed=seed)
        pick = lambda frame, qids: frame[frame['qid'].isin(set(qids))].reset_index(drop=True)  # noqa: E731
        return Split(pick(topics, train), pick(qrels, train), pick(topics, test), pick(qrels, test),
                     f'fixed split by question: {len(train)} training / {len(test)} test questions '
                     f'({train_fraction:.0%} for training, stratified by number of answers, seed {seed})')
    topics, qrels = dataset.get_topics(variant), dataset.get_qrels(variant)
    if isinstance(dataset, BeirDataset) and (dataset.path / 'qrels' / 'train.tsv').exists() and variant != 'train':
        train_topics, train_qrels = dataset.get_topics('train'), dataset.get_qrels('train')
        return Split(train_topics, train_qrels, topics, qrels,
                     f'BEIR splits: {len(train_topics)} train / {len(topics)} {variant or dataset.default_variant} queries')
    return Split(None, None, topics, qrels, f'no training split: all {len(topics)} queries are test queries')


def write_report(path: Path, title: str, description: str, tables: Mapping[str, pd.DataFrame], *,
                 extra: Optional[Dict] = None, figure=None) -> None:
    """Writes ``path`` with ``.md`` (title, description, one section a table) and ``.json`` (tables as records).

    Args:
        path: The report's path without extension.
        title: The markdown heading.
        description: Text under the heading: what was run and how.
        tables: Tables by section heading; the first table comes right after the description.
        extra: More JSON content (settings, timings, training curves).
        figure: A matplotlib figure, saved as ``.png`` beside the report.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f'# {title}', '', description, '']
    for heading, table in tables.items():
        lines += [f'## {heading}', '', table.to_markdown(index=False, floatfmt='.4f'), '']
    path.with_suffix('.md').write_text('\n'.join(lines))
    content = {'title': title, 'description': description,
               'tables': {heading: table.to_dict('records') for heading, table in tables.items()}, **(extra or {})}
    path.with_suffix('.json').write_text(json.dumps(content, indent=2, default=_json_default))
    if figure is not None:
        figure.savefig(path.with_suffix('.png'), dpi=120, bbox_inches='tight')


def _json_default(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
