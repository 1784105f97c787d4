"""Evaluation on top of pt.Experiment and ir_measures: checked experiment tables, per-query frames, cross-validation,
paired tests over subsets, reports.

An experiment parses its arguments with :func:`experiment_parser`, runs its systems and hands the runs to
:func:`per_query` (:func:`cross_validate` does both, fold by fold, and pools the test folds' figures) and then to
:func:`compare` (or the systems to :func:`run_experiment`), and :func:`write_report` writes the result as markdown and
JSON (and CSV and a figure).
"""
import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt
from ir_measures import alpha_nDCG, nDCG

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.analysis import low_similarity_subset, paired_bootstrap, target_distances
from pyterrier_multiquery.experiment.parts import StoredParts
from pyterrier_multiquery.measures import AnswerRecall, MRecall

#: The measures of the main job's table and of :func:`run_experiment` by default.
DEFAULT_MEASURES = [MRecall@5, MRecall@10, MRecall@100, AnswerRecall@10, alpha_nDCG@10, nDCG@10]


def experiment_parser(description: str, out: Optional[os.PathLike], *, data: bool = True,
                      cache: bool = True) -> argparse.ArgumentParser:
    """An argument parser with the options experiments share.

    ``--seed``; with ``out``, ``--out`` (the report's path without extension; default ``out``); with ``data``,
    ``--data-root`` (the folder holding the collections; default ``$PYTERRIER_MULTIQUERY_DATA`` or
    ``../shared/data``, as on the command line); with ``cache``, ``--cache-dir`` (indexes and trained models).

    Args:
        description: The experiment's docstring (shown by ``--help``).
        out: Where the report goes by default (None: the experiment writes no report).
        data: Whether the experiment reads collections.
        cache: Whether it keeps indexes or models between runs.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if data:
        parser.add_argument('--data-root', type=Path,
                            default=Path(os.environ.get('PYTERRIER_MULTIQUERY_DATA', '../shared/data')),
                            help='folder holding the collections (default: $PYTERRIER_MULTIQUERY_DATA or %(default)s)')
    if cache:
        parser.add_argument('--cache-dir', type=Path, default=Path.home() / '.cache' / 'pyterrier_multiquery',
                            help='indexes and trained models are kept here (default: %(default)s)')
    if out is not None:
        parser.add_argument('--out', type=Path, default=Path(out),
                            help='report path without extension (default: %(default)s)')
    parser.add_argument('--seed', type=int, default=0)
    return parser


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
    if set(measure_columns) <= set(table.columns):  # a summary table: measures, then their tests, as asked
        tests = [c for m in measure_columns for c in table.columns if c.startswith(f'{m} ')]
        rest = [c for c in table.columns if c not in ['name'] + measure_columns + tests]
        table = table[['name'] + measure_columns + tests + rest]
    return table


def ir_measures_qrels(qrels: pd.DataFrame) -> pd.DataFrame:
    """PyTerrier qrels (``qid``, ``docno``, ``label``) with ir_measures' column names."""
    return qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})


def _ir_measures_frames(run: pd.DataFrame, qrels: pd.DataFrame) -> Tuple[pd.DataFrame, pd.DataFrame]:
    return run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'}), ir_measures_qrels(qrels)


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


def answer_subsets(qrels: pd.DataFrame, doc_vectors) -> Dict[str, pd.Index]:
    """The multi-answer subsets the AMER paper reports: questions with more than one answer, and the low-similarity
    third (the third whose target passages lie furthest apart,
    :func:`~pyterrier_multiquery.analysis.low_similarity_subset`).

    Args:
        qrels: Multi-answer qrels.
        doc_vectors: The target passages' vectors (a docno mapping or lookup, as
            :func:`~pyterrier_multiquery.analysis.target_distances` takes).
    """
    counts = answer_counts(qrels)
    return {'>1 answer': counts.index[counts > 1],
            'low-similarity third': low_similarity_subset(target_distances(qrels, doc_vectors))}


def _answer_strata(counts: pd.Series, members: int) -> np.ndarray:
    """Answer counts as strata of at least ``members`` questions: a rarer count joins the nearest count that has as
    many (the larger of two as near), so rarer, larger counts join the largest; one stratum where none has."""
    frequency = counts.value_counts()
    frequent = np.sort(frequency.index[frequency >= members].to_numpy())[::-1]   # largest first: it wins a tie
    if not len(frequent):
        return np.zeros(len(counts), dtype=int)
    values = counts.to_numpy()
    return frequent[np.argmin(np.abs(values[:, None] - frequent[None, :]), axis=1)]


def cross_validation_folds(qrels: pd.DataFrame, folds: int = 5, *,
                           seed: int = 0) -> Iterator[Tuple[List[str], List[str]]]:
    """``(train_qids, test_qids)`` of each fold, split by question and stratified by the number of answers.

    Only queries with a relevant passage take part.
    """
    with requires('experiments'):
        from sklearn.model_selection import StratifiedKFold
    counts = answer_counts(qrels)
    qids = counts.index.astype(str).tolist()
    strata = _answer_strata(counts, folds)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(qids, strata):
        yield [qids[i] for i in train], [qids[i] for i in test]


class CrossValidation(NamedTuple):
    """Each system's per-query figures on the test folds, pooled (a :func:`per_query` frame with each question's
    ``fold``), what each fold's training recorded (in fold order), and the seconds each system took on the test folds
    (all folds)."""
    scores: pd.DataFrame
    records: List[dict]
    seconds: Dict[str, float]


#: The kinds of frame each fold of :func:`cross_validate` stores: its per-query figures, then its record.
FOLD_KINDS = ('folds_perquery', 'folds')


def cross_validate(topics: pd.DataFrame, qrels: pd.DataFrame,
                   fold_systems: Callable[[int, pd.DataFrame, pd.DataFrame], Tuple[Mapping[str, pt.Transformer], dict]],
                   measures: Sequence, *, folds: int = 5, seed: int = 0, parts: Optional[StoredParts] = None,
                   key: Optional[Mapping[str, str]] = None, verbose: bool = True) -> CrossValidation:
    """Runs the systems built on each fold's training questions on that fold's test questions, and pools their
    per-query figures.

    Folds come from :func:`cross_validation_folds`: split by question, stratified by the number of answers.

    Args:
        topics: Every question (``qid``, ``query``).
        qrels: Multi-answer qrels.
        fold_systems: ``fold_systems(fold, train_topics, train_qrels)`` returns the fold's systems by name, trained
            or tuned on the training part only, and a record of what its training chose (JSON-serialisable).
        measures: ir_measures measures.
        folds: Number of folds.
        seed: Seed of the split.
        parts: Where each finished fold is stored (:class:`~.parts.StoredParts` with the kinds :data:`FOLD_KINDS`),
            so that a stopped run goes on at the first fold not stored (default: kept in memory).
        key: Columns naming this cross-validation among those stored in ``parts`` (for example its collection).
        verbose: Whether to show progress over the folds.
    """
    validate_topics_qrels(topics, qrels)
    parts = StoredParts(None, FOLD_KINDS) if parts is None else parts
    key = dict(key or {})
    splits = list(cross_validation_folds(qrels, folds, seed=seed))
    for fold, (train_qids, test_qids) in enumerate(pt.tqdm(splits, desc='folds', unit='fold', disable=not verbose)):
        if parts.done('folds', **key, fold=fold):
            continue
        built, record = fold_systems(fold, _select(topics, train_qids), _select(qrels, train_qids))
        test_topics, runs, seconds = _select(topics, test_qids), {}, {}
        for name, system in built.items():
            start = time.perf_counter()
            runs[name] = system(test_topics)
            seconds[name] = time.perf_counter() - start
        parts.add(folds_perquery=per_query(runs, _select(qrels, test_qids), measures).assign(**key, fold=fold),
                  folds=pd.DataFrame([{**key, 'fold': fold, 'record': json.dumps(record),
                                       'seconds': json.dumps(seconds)}]))
    stored = parts.rows('folds', **key).sort_values('fold')
    scores = parts.rows('folds_perquery', **key).drop(columns=list(key))
    order = {column: {value: i for i, value in enumerate(dict.fromkeys(values))} for column, values in
             (('system', scores['system']), ('measure', [str(m) for m in measures]), ('qid', qrels['qid'].astype(str)))}
    scores = scores.sort_values(['system', 'measure', 'qid'], key=lambda column: column.map(order[column.name]),
                                kind='stable', ignore_index=True)   # the order per_query gives the pooled runs
    seconds = {}
    for fold_seconds in stored['seconds']:
        for name, value in json.loads(fold_seconds).items():
            seconds[name] = seconds.get(name, 0.) + value
    return CrossValidation(scores, [json.loads(record) for record in stored['record']], seconds)


def _select(frame: pd.DataFrame, qids: Iterable[str]) -> pd.DataFrame:
    """The rows of ``frame`` whose ``qid`` is in ``qids``."""
    return frame[frame['qid'].isin(set(qids))].reset_index(drop=True)


def split_by_question(qrels: pd.DataFrame, train_fraction: float = 0.6, *,
                      seed: int = 0) -> Tuple[List[str], List[str]]:
    """``(train_qids, test_qids)``: a fixed split by question, stratified by the number of answers.

    Only queries with a relevant passage take part. The main job splits RAMDocs and MuSiQue this way (60 % of the
    questions for training, seed 0).
    """
    with requires('experiments'):
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


def dataset_split(dataset, variant: Optional[str] = None, *, train_fraction: float = 0.6, seed: int = 0,
                  whole: bool = False) -> Split:
    """The training and test parts of a dataset.

    A BEIR directory with a ``train`` qrels file trains on it and tests on ``variant`` (default ``test``); RAMDocs,
    MuSiQue and HotpotQA, which ship one set of questions, get the fixed :func:`split_by_question` (of the questions
    with an answer in the qrels), or with ``whole`` (the models train on other collections) none: all of those
    questions are test questions; any other dataset has no training part (``train_topics`` is None) and tests on all
    of its queries.
    """
    from pyterrier_multiquery.loaders import BeirDataset, HotpotQADataset, MusiqueDataset, RamDocsDataset
    if isinstance(dataset, (RamDocsDataset, MusiqueDataset, HotpotQADataset)):
        topics, qrels = dataset.get_topics(), dataset.get_qrels()
        if whole:
            answered = topics[topics['qid'].isin(set(qrels['qid']))].reset_index(drop=True)
            return Split(None, None, answered, qrels, f'no question trained on: all {len(answered)} questions with '
                                                      'answers are test questions')
        train, test = split_by_question(qrels, train_fraction, seed=seed)
        return Split(_select(topics, train), _select(qrels, train), _select(topics, test), _select(qrels, test),
                     f'fixed split by question: {len(train)} training / {len(test)} test questions '
                     f'({train_fraction:.0%} for training, stratified by number of answers, seed {seed})')
    topics, qrels = dataset.get_topics(variant), dataset.get_qrels(variant)
    if isinstance(dataset, BeirDataset) and (dataset.path / 'qrels' / 'train.tsv').exists() and variant != 'train':
        train_topics, train_qrels = dataset.get_topics('train'), dataset.get_qrels('train')
        return Split(train_topics, train_qrels, topics, qrels,
                     f'BEIR splits: {len(train_topics)} train / {len(topics)} '
                     f'{variant or dataset.default_variant} queries')
    return Split(None, None, topics, qrels, f'no training split: all {len(topics)} queries are test queries')


def training_questions(dataset) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """The topics and qrels a model trains on when ``dataset`` is given for training: its training part
    (:func:`dataset_split`), or all of it when it has none; for a
    :class:`~pyterrier_multiquery.loaders.CombinedDataset`, each member's, with the member's prefix."""
    from pyterrier_multiquery.loaders import CombinedDataset
    if isinstance(dataset, CombinedDataset):
        parts = [training_questions(member) for member in dataset.members.values()]
        return tuple(pd.concat([CombinedDataset.prefixed(part[i], name) for name, part in zip(dataset.members, parts)],
                               ignore_index=True) for i in (0, 1))
    split = dataset_split(dataset)
    if split.train_topics is None:
        return split.test_topics, split.test_qrels
    return split.train_topics, split.train_qrels


def judged_sample(topics: pd.DataFrame, qrels: pd.DataFrame, size: int, *,
                  seed: int = 0) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """A fixed random sample of ``size`` queries that have judgements, in sample order, and their qrels."""
    sample = topics[topics['qid'].isin(set(qrels['qid']))].sample(size, random_state=seed)
    return sample, qrels[qrels['qid'].isin(set(sample['qid']))]


def document_sample(documents: pd.DataFrame, size: int, *, seed: int = 0) -> pd.DataFrame:
    """A fixed random sample of ``size`` documents, in docno order."""
    return documents.sample(size, random_state=seed).sort_values('docno').reset_index(drop=True)


def corpus_subset(documents: pd.DataFrame, qrels: pd.DataFrame, size: int, *, seed: int = 0) -> pd.DataFrame:
    """Every document judged in ``qrels`` plus random others, ``size`` in all (or just the judged ones), by docno.

    Searching such a subset instead of the whole corpus keeps an experiment within a CPU's budget; it is easier than
    the whole corpus (fewer distractors), so its figures compare systems with each other, not with published ones.
    """
    judged = documents['docno'].isin(set(qrels['docno']))
    others = documents[~judged].sample(max(0, size - int(judged.sum())), random_state=seed)
    return pd.concat([documents[judged], others]).sort_values('docno').reset_index(drop=True)


def write_report(path: Path, title: str, description: str, tables: Mapping[str, pd.DataFrame], *,
                 extra: Optional[Dict] = None, figure=None, csv: bool = False, floatfmt: str = '.4f') -> None:
    """Writes ``path`` with ``.md`` (title, description, one section a table) and ``.json`` (tables as records).

    Args:
        path: The report's path without extension.
        title: The markdown heading.
        description: Text under the heading: what was run and how.
        tables: Tables by section heading; the first table comes right after the description.
        extra: More JSON content (settings, timings, training curves).
        figure: A matplotlib figure, saved as ``.png`` beside the report.
        csv: Whether the first table is also written as ``.csv`` (at full precision).
        floatfmt: How the markdown tables format fractional numbers (integer columns print as integers).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f'# {title}', '', description, '']
    for heading, table in tables.items():
        integers = {column: object for column in table.select_dtypes('integer').columns}   # kept whole: tabulate
        lines += [f'## {heading}', '', table.astype(integers).to_markdown(index=False, floatfmt=floatfmt), '']
    path.with_suffix('.md').write_text('\n'.join(lines))
    content = {'title': title, 'description': description,
               'tables': {heading: table.to_dict('records') for heading, table in tables.items()}, **(extra or {})}
    path.with_suffix('.json').write_text(json.dumps(content, indent=2, default=_json_default))
    if csv:
        next(iter(tables.values())).to_csv(path.with_suffix('.csv'), index=False)
    if figure is not None:
        figure.savefig(path.with_suffix('.png'), dpi=120, bbox_inches='tight')


def line_figure(frame: pd.DataFrame, x: str, y: str, *, line, panel: Optional[str] = None,
                ylabel: Optional[str] = None, size: Tuple[float, float] = (4.5, 3.2)):
    """A matplotlib figure of ``y`` against ``x``: one line per value of ``line``, one panel per value of ``panel``.

    Args:
        frame: Long-format data.
        x: Column on the x axis.
        y: Column on the y axis.
        line: Column (or list of columns) whose values are the lines. With several columns the first one's
            value picks a line's colour and names it once in the legend (one line per value of the others: folds,
            say).
        panel: Column whose values are the panels, side by side (one panel when None).
        ylabel: The y axis label (default ``y``).
        size: Width and height of one panel, in inches.
    """
    with requires('experiments'):
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    keys = [line] if isinstance(line, str) else list(line)
    colours = {value: f'C{i % 10}' for i, value in enumerate(dict.fromkeys(frame[keys[0]]))}
    panels = list(dict.fromkeys(frame[panel])) if panel else [None]
    integer_x = pd.api.types.is_integer_dtype(frame[x])
    fig, axes = plt.subplots(1, len(panels), figsize=(size[0] * len(panels), size[1]), squeeze=False)
    for ax, name in zip(axes[0], panels):
        part = frame if panel is None else frame[frame[panel] == name]
        named = set()
        for (value, *_), group in part.groupby(keys, sort=False):
            ax.plot(group[x], group[y], marker='.', color=colours[value], label=None if value in named else value,
                    **({'linewidth': 0.8, 'alpha': 0.7} if len(keys) > 1 else {}))
            named.add(value)
        ax.set_title('' if name is None else str(name), fontsize=10)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel or y)
        if integer_x:  # M, epochs: no ticks between whole values
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(keys) > 1:   # beside the last panel: its many lines leave no corner free
        axes[0][-1].legend(fontsize=7, title=f'one line per {", ".join(keys[1:])}', title_fontsize=7,
                           loc='upper left', bbox_to_anchor=(1.02, 1))
    else:
        axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _json_default(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
