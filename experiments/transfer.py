"""Trained methods on collections they never saw: train on RAMDocs, on MuSiQue and on both, test everywhere.

    python experiments/transfer.py [--targets hotpotqa ramdocs musique scifact] [--folds 5] [--skip-in-domain]

Collections (from the shared data folder): RAMDocs (500 questions, one to three answers), MuSiQue (100 questions, each
supporting paragraph its own answer), HotpotQA-500 (500 distractor questions, each supporting paragraph its own answer;
the shared copy keeps 422 questions with an answer in their contexts, and those are scored; never used for training or
choosing anything) and SciFact's queries with two or more relevant documents (train and test qrels together: 100
queries, each relevant document its own answer; never used for training or tuning). First stage: all-MiniLM-L6-v2.
Trained systems: MiniLM-FT (MiniLM fine-tuned contrastively on the training questions, the fair single-vector baseline,
on all the training questions), and over each of MiniLM and MiniLM-FT the main job's three refiners: AMER (lists merged
round-robin), JPR (top 20 reranked) and their stack (AMER's top 20 reranked by JPR), each trained over the first stage
it refines. Every model trains on a schedule fixed in advance (the trainers' epochs); AMER and JPR on 80 % of the
training questions, the other 20 % choosing each one's departure weight from the first stage by the one-standard-error
rule (:func:`~pyterrier_multiquery.training.departure.choose_departure`). No weight, epoch or setting is chosen on a
test fold or a transfer target. Each refiner over MiniLM is also shown at departure 1 (``as trained, λ=1``); the weights
chosen are listed per model (per fold in domain). ``+ back-off``
(:class:`~pyterrier_multiquery.training.backoff.BackOff`, on every refiner) gives a question unlike the model's
training questions the refiner's first stage's ranking instead (MiniLM's, or MiniLM-FT's): unlike, where its MiniLM
cosine similarity to its nearest training question is below the 5 % quantile of the training questions' own
similarities to their nearest other training question (a quantile fixed in advance, from the training questions
alone). A question goes whole to one system or the other, so its scores are the refiner's or its first stage's,
composed per question from the stored scores.

Out of domain: a model trained on all of a collection's questions, tested on every collection it never saw. In domain:
5-fold cross-validation by question (train on four folds, test on the fifth). Each system is compared with the first
stage and with MiniLM-FT on the same queries: mean difference, 95 % paired-bootstrap interval, p-value. The floor, for
each refiner against its own first stage (MiniLM or MiniLM-FT): on every collection a model never saw, MRecall@10 not
significantly below the first stage's (paired test, p < 0.05), and on those of about 500 questions (RAMDocs,
HotpotQA-500) also the lower end of the 95 % interval of the difference above -0.02. Writes
``experiments/results/transfer.{md,json,csv,png}``; the per-query scores and chosen weights of every finished part are
stored as it goes (``transfer_perquery.csv``, ``transfer_choices.csv``, and which test questions are familiar,
``transfer_familiar.csv``), so a stopped run goes on where it stopped (``--restart`` forgets them; ``--report-only``
reports what is stored).
"""
import copy
import time
from pathlib import Path

import pandas as pd

from pyterrier_multiquery.baselines import minilm
from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.experiment.cache import Cache, script_fingerprint
from pyterrier_multiquery.experiment.evaluation import (
    compare,
    cross_validation_folds,
    experiment_parser,
    per_query,
    write_report,
)
from pyterrier_multiquery.experiment.main import FINE_TUNED, REFINED
from pyterrier_multiquery.experiment.parts import StoredParts
from pyterrier_multiquery.loaders import CombinedDataset, load_dataset
from pyterrier_multiquery.measures import MRecall
from pyterrier_multiquery.training.backoff import DEFAULT_QUANTILE, Familiarity

RESULTS = Path(__file__).parent / 'results'
MEASURES = [MRecall @ 5, MRecall @ 10]
#: How every model trains: a fixed schedule, a fifth of the training questions held out for the departure weight.
TRAINING = {'dev_fraction': 0.2, 'choose_epoch': False, 'departure': 'one_se'}
SOURCES = {'MuSiQue': ('musique',), 'RAMDocs': ('ramdocs',), 'RAMDocs+MuSiQue': ('ramdocs', 'musique')}
TARGETS = {'hotpotqa': 'HotpotQA-500', 'ramdocs': 'RAMDocs', 'musique': 'MuSiQue', 'scifact': 'SciFact (2+ relevant)'}
#: The lowest end of the 95 % interval of a refiner's ΔMRecall@10 against its own first stage allowed on the
#: collections of :data:`LARGE`.
FLOOR = -0.02
#: The collections large enough (about 500 questions) for the interval's part of the floor.
LARGE = ('RAMDocs', 'HotpotQA-500')
#: The arguments that shape a part's figures: a run goes on only with those of the parts stored.
SETTINGS = ('seed', 'folds', 'threads')
#: What a part stores: its per-query scores, the weights its training chose (last: the part is done), and which of its
#: test questions are familiar (stored on its own).
KINDS = ('perquery', 'choices', 'familiar')
#: Each refiner, shown also with the back-off, and the first stage its back-off gives a question to: its own.
BACKED_OFF = {name: first_stage for first_stage, names in REFINED.items() for name in names}


def multi_relevant(dataset, variants=('train', 'test'), minimum: int = 2):
    """The queries of ``variants`` with at least ``minimum`` relevant documents, each relevant document an answer."""
    topics = pd.concat([dataset.get_topics(v) for v in variants]).drop_duplicates('qid')
    qrels = pd.concat([dataset.get_qrels(v) for v in variants])
    qrels = qrels[qrels['label'] > 0].drop_duplicates(['qid', 'docno'])
    qrels = qrels[qrels.groupby('qid')['docno'].transform('size') >= minimum].copy()
    qrels['iteration'] = qrels.groupby('qid').cumcount().add(1).astype(str)
    return topics[topics['qid'].isin(set(qrels['qid']))].reset_index(drop=True), qrels.reset_index(drop=True)


class Collection:
    """A test collection: its dataset, its first stage and the questions it is scored on."""

    def __init__(self, dataset, cache: Cache, topics=None, qrels=None):
        self.dataset = dataset
        self.first_stage = systems.DenseFirstStage(dataset, cache, verbose=False)
        self.topics = dataset.get_topics() if topics is None else topics
        self.qrels = dataset.get_qrels() if qrels is None else qrels


def trained_systems(collection: Collection, train: Collection, topics, qrels, args) -> tuple:
    """MiniLM and MiniLM-FT, and AMER, JPR and their stack over each of them, trained on ``topics``/``qrels`` of
    ``train``, on ``collection``.

    Returns:
        ``(systems, chosen)``: the systems by name (the main job's names, the same whatever the training chose, so
        that folds pool; the refiners over MiniLM also as trained, at departure 1) and each refiner's departure
        weight chosen on training data.
    """
    from pyterrier_multiquery.amer import AMERModel
    from pyterrier_multiquery.jpr import JPRModel
    settings = dict(seed=args.seed, threads=args.threads)
    fine_tuned = systems.train_single_vector(train.first_stage, topics, qrels, **settings)

    def over_fine_tuned(stage):
        return systems.DenseFirstStage(stage.dataset, stage.cache, model=fine_tuned, verbose=False)

    stages = {'MiniLM': collection.first_stage, FINE_TUNED: over_fine_tuned(collection.first_stage)}
    train_stages = {'MiniLM': train.first_stage,
                    FINE_TUNED: stages[FINE_TUNED] if train is collection else over_fine_tuned(train.first_stage)}
    built = {name: stage.retriever() for name, stage in stages.items()}
    chosen = {}
    states = collection.first_stage.cache_dir / 'jpr_candidate_states'   # keyed by the texts and the encoder
    for first_stage, stage in stages.items():
        amer_name, jpr_name, stacked_name = REFINED[first_stage]
        train_stage = train_stages[first_stage]
        amer = AMERModel.from_pretrained(systems.train_amer(train_stage, topics, qrels, merge='round_robin',
                                                            **TRAINING, **settings))
        jpr = JPRModel.from_pretrained(systems.train_jpr(train_stage, train.dataset, topics, qrels, **TRAINING,
                                                         **settings))

        def amer_over(model, stage=stage):
            return systems.amer_system(stage, model)

        def reranked(model, stage=stage, candidates=None):
            candidates = stage.retriever() if candidates is None else candidates
            return systems.jpr_system(candidates, collection.dataset, model, seed=args.seed, state_cache=states,
                                      verbose=False)

        for name, model, system in ((amer_name, amer, amer_over), (jpr_name, jpr, reranked)):
            chosen[name] = model.departure
            built[name] = system(model)
            if first_stage == 'MiniLM':
                as_trained = copy.deepcopy(model)
                as_trained.departure = 1.
                built[f'{name} (as trained, λ=1)'] = system(as_trained)
        built[stacked_name] = reranked(jpr, candidates=built[amer_name])
    return built, chosen


def tests_against(scores: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Mean difference, interval and p-value of every system against ``baseline``, one row per system and measure."""
    _, tests = compare(scores, baseline)
    return tests[['system', 'measure', 'mean_diff', 'ci_low', 'ci_high', 'p_value']]


def table_rows(scores: pd.DataFrame, source: str, target: str, in_domain: bool) -> pd.DataFrame:
    """The report's rows for one (training source, test collection) pair: each system against MiniLM and MiniLM-FT
    (mean difference, 95 % interval, p), and each refiner's floor against its own first stage."""
    means = scores.groupby(['system', 'measure'])['value'].mean().unstack()
    tests = {baseline: tests_against(scores, baseline).set_index(['system', 'measure'])
             for baseline in ('MiniLM', FINE_TUNED)}
    rows = []
    for system in dict.fromkeys(scores['system']):
        row = {'trained on': source, 'tested on': target, 'in domain': in_domain, 'system': system}
        for measure in (str(m) for m in MEASURES):
            row[measure] = means.loc[system, measure]
        for baseline, against in tests.items():
            for measure in (str(m) for m in MEASURES):
                if system not in ('MiniLM', baseline):
                    test = against.loc[(system, measure)]
                    row[f'{measure} Δ vs {baseline}'] = test['mean_diff']
                    row[f'{measure} 95% CI vs {baseline}'] = f'[{test["ci_low"]:+.3f}, {test["ci_high"]:+.3f}]'
                    row[f'{measure} p vs {baseline}'] = test['p_value']
        if not in_domain and system not in ('MiniLM', FINE_TUNED):   # the floor is the refiners', against their own
            own = FINE_TUNED if system.startswith(REFINED[FINE_TUNED]) else 'MiniLM'   # first stage
            test = tests[own].loc[(system, 'MRecall@10')]
            below = test['mean_diff'] < 0 and test['p_value'] < 0.05
            row['floor against'] = own
            row['floor held'] = 'no' if below or (target in LARGE and test['ci_low'] <= FLOOR) else 'yes'
        rows.append(row)
    return pd.DataFrame(rows)


def floor_table(table: pd.DataFrame) -> pd.DataFrame:
    """Each refiner on each collection its model never saw, against its own first stage: the floor's figures."""
    refiners = table[table['floor held'].notna()]
    rows = []
    for _, row in refiners.iterrows():
        own = row['floor against']
        rows.append({'trained on': row['trained on'], 'tested on': row['tested on'], 'system': row['system'],
                     'first stage': own, 'MRecall@5': row['MRecall@5'], 'MRecall@10': row['MRecall@10'],
                     **{f'{measure} {what}': row[f'{measure} {what} vs {own}'] for measure in map(str, MEASURES)
                        for what in ('Δ', '95% CI', 'p')},
                     'floor held': row['floor held']})
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame):
    """ΔMRecall@10 against MiniLM with its interval, one panel per test collection."""
    import matplotlib.pyplot as plt
    targets = list(dict.fromkeys(table['tested on']))
    # a label's height per row of the tallest panel, so that its labels do not overlap
    height = max(4.2, 1.4 + 0.14 * table['tested on'].value_counts().max())
    fig, axes = plt.subplots(1, len(targets), figsize=(6.4 * len(targets), height), squeeze=False)
    for ax, target in zip(axes[0], targets):
        part = table[(table['tested on'] == target) & (table['system'] != 'MiniLM')].reset_index(drop=True)
        interval = part['MRecall@10 95% CI vs MiniLM'].str.strip('[]').str.split(', ')
        low, high = interval.str[0].astype(float), interval.str[1].astype(float)
        delta = part['MRecall@10 Δ vs MiniLM']
        colours = ['tab:blue' if d else 'tab:orange' for d in part['in domain']]
        ax.errorbar(delta, range(len(part)), xerr=[delta - low, high - delta], fmt='none', ecolor='grey')
        ax.scatter(delta, range(len(part)), c=colours, zorder=3)
        ax.set_yticks(range(len(part)), [f'{s} ← {t}' for s, t in zip(part['system'], part['trained on'])],
                      fontsize=7)
        ax.axvline(0, color='black', lw=.8)
        ax.axvline(FLOOR, color='red', lw=.8, ls='--')
        ax.set_title(f'tested on {target}', fontsize=10)
        ax.set_xlabel('ΔMRecall@10 vs MiniLM (95% CI)')
    fig.suptitle('Trained methods against their first stage (blue: in domain, 5-fold CV; orange: never seen)',
                 fontsize=10)
    fig.tight_layout(w_pad=2)
    return fig


def run_part(parts: StoredParts, source: str, target: str, fold: int, collection: Collection, train: Collection,
             train_qids, test_qids, args) -> None:
    """Trains on ``train_qids`` of ``train``, scores ``test_qids`` of ``collection`` and stores the part."""
    if parts.done('choices', **part_key(source, target, fold)):   # its weights are stored after its scores
        return
    built, chosen = trained_systems(collection, train, questions(train.dataset.get_topics(), train_qids),
                                    questions(train.dataset.get_qrels(), train_qids), args)
    runs = {name: system(questions(collection.topics, test_qids)) for name, system in built.items()}
    scores = per_query(runs, questions(collection.qrels, test_qids), MEASURES)
    parts.add(perquery=scores.assign(**part_key(source, target, fold)),
              choices=pd.DataFrame([{**part_key(source, target, fold), **chosen}]))
    print(f'{source} -> {target}' + (f', fold {fold}' if fold >= 0 else '') + ': '
          + ', '.join(f'{name} λ={weight:g}' for name, weight in chosen.items()), flush=True)


def familiar_part(parts: StoredParts, source: str, target: str, fold: int, collection: Collection, train: Collection,
                  train_qids, test_qids, encoder) -> None:
    """Stores which of the part's test questions are familiar to its training questions (:class:`Familiarity`)."""
    if parts.done('familiar', **part_key(source, target, fold)):
        return
    known = questions(train.dataset.get_topics(), train_qids)['query'].tolist()
    familiarity = Familiarity(encoder.encode_queries(known), DEFAULT_QUANTILE)
    topics = questions(collection.topics, test_qids)
    similarity = familiarity.similarity(encoder.encode_queries(topics['query'].tolist()))
    parts.add(familiar=pd.DataFrame({**part_key(source, target, fold), 'qid': topics['qid'],
                                     'similarity': similarity, 'threshold': familiarity.threshold,
                                     'familiar': similarity >= familiarity.threshold}))


def backed_off(scores: pd.DataFrame, familiar: pd.DataFrame) -> pd.DataFrame:
    """``scores`` with each refiner's ``+ back-off`` rows: the refiner's scores of the familiar questions, its first
    stage's of the others (MiniLM's, or MiniLM-FT's for the refiners over it; a question goes whole to one system)."""
    keys = ['trained on', 'tested on', 'fold', 'qid']
    flags = scores[keys].merge(familiar[keys + ['familiar']], on=keys, how='left')['familiar']
    if flags.isna().any():
        missing = scores.loc[flags.isna().to_numpy(), keys[:3]].drop_duplicates().to_dict('records')
        raise ValueError(f'no familiar questions stored for the parts {missing}')
    flagged = scores.assign(familiar=flags.astype(bool).to_numpy())
    present = set(scores['system'])
    added = [pd.concat([flagged[(flagged['system'] == name) & flagged['familiar']],
                        flagged[(flagged['system'] == first_stage) & ~flagged['familiar']]]).assign(
        system=f'{name} + back-off') for name, first_stage in BACKED_OFF.items() if name in present]
    return pd.concat([scores] + [frame.drop(columns='familiar') for frame in added], ignore_index=True)


def part_key(source: str, target: str, fold: int) -> dict:
    """The columns naming a part among the stored ones."""
    return {'trained on': source, 'tested on': target, 'fold': fold}


def questions(frame: pd.DataFrame, qids) -> pd.DataFrame:
    """The rows of ``frame`` (topics or qrels) whose ``qid`` is in ``qids`` (all rows for None)."""
    return frame if qids is None else frame[frame['qid'].isin(set(qids))].reset_index(drop=True)


def report(parts: StoredParts, args, seconds: float) -> None:
    """The report of every stored part: the table, the chosen weights and the figure."""
    scores, tables = backed_off(parts.frames['perquery'], parts.frames['familiar']), []
    made = parts.settings or {'folds': args.folds}   # parts stored before their settings were: folds as asked
    for (source, target), pair in scores.groupby(['trained on', 'tested on'], sort=False):
        in_domain = source == target
        folds = pair['fold'].nunique()
        label = f'{source} ({made["folds"]}-fold CV' + ('' if folds == made['folds'] else f', {folds} folds done') + ')'
        tables.append(table_rows(pair, label if in_domain else source, target, in_domain))
    table = pd.concat(tables, ignore_index=True)
    write_report(args.out, 'Trained methods on collections they never saw', __doc__.split('\n\n', 2)[2],
                 {'MRecall against the first stage and the fine-tuned single vector': table,
                  f'The floor: each refiner against its own first stage on collections its model never saw (p < 0.05 '
                  f'below it fails; on {" and ".join(LARGE)} so does a 95 % interval reaching {FLOOR})':
                      floor_table(table),
                  'Departure weights chosen on training data (λ: 0 = first stage, 1 = as trained; fold -1: all of '
                  'the source)': parts.frames['choices'],
                  'Test questions like the training questions (the back-off keeps the refiner on these)':
                      familiar_shares(parts.frames['familiar'])},
                 extra={'seconds': seconds, 'training': TRAINING, 'settings': parts.settings},
                 figure=figure(table), csv=True)
    print(table.to_string(), flush=True)


def familiar_shares(familiar: pd.DataFrame) -> pd.DataFrame:
    """Per part: the threshold, the test questions and the share of them that are familiar."""
    return familiar.groupby(['trained on', 'tested on', 'fold'], sort=False).agg(
        threshold=('threshold', 'first'), questions=('qid', 'size'), familiar=('familiar', 'mean')).reset_index()


def main():
    parser = experiment_parser(__doc__.splitlines()[0], RESULTS / 'transfer')
    parser.add_argument('--folds', type=int, default=5, help='in-domain cross-validation folds (default: 5)')
    parser.add_argument('--skip-in-domain', action='store_true', help='only the collections a model never saw')
    parser.add_argument('--targets', nargs='+', choices=list(TARGETS), default=list(TARGETS),
                        help='the test collections, in the order their parts run (default: %(default)s)')
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads (default: %(default)s, the count the published runs were made with)')
    parser.add_argument('--restart', action='store_true', help='forget the parts stored by an earlier run')
    parser.add_argument('--report-only', action='store_true', help='write the report of the stored parts only')
    args = parser.parse_args()
    from pyterrier_multiquery.experiment.determinism import make_deterministic
    make_deterministic(args.seed, args.threads)
    start = time.perf_counter()
    settings = None if args.report_only else {**{k: getattr(args, k) for k in SETTINGS},
                                              'code': script_fingerprint(__file__)}
    parts = StoredParts(args.out, KINDS, settings, restart=args.restart)
    if not args.report_only:
        cache = Cache(args.cache_dir)
        encoder = minilm(batch_size=64)
        loaded = {name: load_dataset(args.data_root / name) for name in TARGETS}
        collections = {'ramdocs': Collection(loaded['ramdocs'], cache),
                       'musique': Collection(loaded['musique'], cache),
                       'hotpotqa': Collection(loaded['hotpotqa'], cache),
                       'scifact': Collection(loaded['scifact'], cache, *multi_relevant(loaded['scifact']))}
        trains = {source: collections[members[0]] if len(members) == 1 else Collection(
            CombinedDataset([loaded[m] for m in members]), cache) for source, members in SOURCES.items()}
        for key in args.targets:   # models trained on every question of the source, HotpotQA-500's parts first
            for source, members in SOURCES.items():
                if key not in members:
                    collection, train = collections[key], trains[source]
                    run_part(parts, source, TARGETS[key], -1, collection, train, None, None, args)
                    familiar_part(parts, source, TARGETS[key], -1, collection, train, None, None, encoder)
        if not args.skip_in_domain:
            for key in [key for key in ('musique', 'ramdocs') if key in args.targets]:
                collection, source = collections[key], TARGETS[key]
                for fold, (train_qids, test_qids) in enumerate(
                        cross_validation_folds(collection.qrels, args.folds, seed=args.seed)):
                    run_part(parts, source, source, fold, collection, collection, train_qids, test_qids, args)
                    familiar_part(parts, source, source, fold, collection, collection, train_qids, test_qids,
                                  encoder)
    if parts.frames['perquery'].empty:
        raise SystemExit(f'no stored parts in {parts.paths["perquery"]}: --report-only reports the parts of a run '
                         'written with the same --out')
    report(parts, args, time.perf_counter() - start)
    print(f'wrote {args.out}.md ({time.perf_counter() - start:.0f}s)')


if __name__ == '__main__':
    main()
