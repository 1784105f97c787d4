"""Command line of the main job: ``python -m pyterrier_multiquery [--dataset PATH|irds:ID] [--save table.csv]``."""
import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Optional

import pandas as pd

from pyterrier_multiquery.experiment.determinism import DEFAULT_THREADS

#: The fair baseline's name: all-MiniLM-L6-v2 fine-tuned on the same training questions as the trained methods.
FINE_TUNED = 'MiniLM-FT'
#: The trained refiners over each first stage, compared with it: AMER, JPR and their stack, by the first stage's name.
REFINED = {'MiniLM': ('AMER', 'MiniLM >> JPR', 'AMER >> JPR'),
           FINE_TUNED: (f'AMER over {FINE_TUNED}', f'{FINE_TUNED} >> JPR', f'AMER over {FINE_TUNED} >> JPR')}
#: The trained multi-vector methods, compared with it.
TRAINED = REFINED['MiniLM'] + REFINED[FINE_TUNED]
#: ``--first-stage``: the first stages the trained refiners start from.
FIRST_STAGES = {'minilm': ('MiniLM',), 'minilm-ft': (FINE_TUNED,), 'both': ('MiniLM', FINE_TUNED)}
#: How the main job trains each model: for the trainers' epochs, a schedule fixed in advance (AMER's lists merged
#: round-robin, as in its paper); choosing an epoch and merge on a few dozen held-out questions picked a different
#: point at each run, which is noise, not choice. A fifth of the training questions is held out to choose how far
#: AMER and JPR depart from their first stage (the one-standard-error rule), so that they stay near it where their
#: training does not carry over.
SCHEDULES = {FINE_TUNED: {},
             'AMER': {'dev_fraction': .2, 'choose_epoch': False, 'departure': 'one_se', 'merge': 'round_robin'},
             'JPR': {'dev_fraction': .2, 'choose_epoch': False, 'departure': 'one_se'}}


def main(argv=None) -> int:
    """Trains AMER and JPR on a training split, then compares them with BM25, MiniLM and MMR on the test split."""
    parser = argparse.ArgumentParser(prog='python -m pyterrier_multiquery', description=main.__doc__)
    parser.add_argument('--dataset', help='a BEIR, TREC, RAMDocs, MuSiQue or HotpotQA/2WikiMultiHopQA path, or an '
                                          'irds: identifier (default: DATA_ROOT/ramdocs)')
    parser.add_argument('--data-root', default=os.environ.get('PYTERRIER_MULTIQUERY_DATA', '../shared/data'),
                        help='the folder of the bundled collections, for the default --dataset '
                             '(default: $PYTERRIER_MULTIQUERY_DATA or %(default)s)')
    parser.add_argument('--variant', help='topics/qrels variant, e.g. the BEIR split (default: the dataset\'s own)')
    parser.add_argument('--train-dataset', nargs='+', metavar='DATASET',
                        help='train the models and the MMR lambda on these datasets\' training splits (all of one '
                             'when it has none; several are trained on together) instead of --dataset\'s')
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'),
                        help='where indexes and trained models are built once and reused, keyed by the data, '
                             'settings, versions and code that made them (default: %(default)s)')
    parser.add_argument('--refresh', action='store_true', help='rebuild every index and model this run uses, even '
                                                               'where a valid cached one is there')
    parser.add_argument('--mmr-lambda', type=float, help='MMR relevance weight (default: chosen on the training '
                                                         'split by MRecall@10; 0.9 without one)')
    parser.add_argument('--mmr-depth', type=int, default=500, help='dense results MMR re-ranks (default: %(default)s)')
    parser.add_argument('--batch-size', type=int, default=64, help='encoder batch size (default: %(default)s)')
    parser.add_argument('--amer', metavar='MODEL', help='run AMER with this trained model (a folder written by '
                                                       'AMERModel.save_pretrained) instead of training one')
    parser.add_argument('--jpr', metavar='MODEL', help='run JPR with this trained model (a folder written by '
                                                      'JPRModel.save_pretrained) instead of training one')
    parser.add_argument('--first-stage', choices=list(FIRST_STAGES), default='both',
                        help='what AMER and JPR start from: the frozen all-MiniLM-L6-v2, MiniLM-FT (MiniLM fine-tuned '
                             'on the training split), or both, each in its own rows (default: %(default)s)')
    parser.add_argument('--no-train', action='store_true', help='train no model: baselines (and --amer/--jpr) only')
    parser.add_argument('--threads', type=int, default=DEFAULT_THREADS,
                        help='torch threads: the figures are the same to the last digit for one count on one '
                             'machine (default: %(default)s, the count the README\'s table was made with)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the training runs (default: %(default)s)')
    parser.add_argument('-v', '--verbose', action='store_true', help='show every progress bar and library log')
    parser.add_argument('--save', help='write the table as CSV to this path')
    args = parser.parse_args(argv)

    from pyterrier_multiquery._quiet import quiet
    from pyterrier_multiquery.loaders import CombinedDataset, load_dataset
    from pyterrier_multiquery.experiment.evaluation import dataset_split, training_questions

    spec = args.dataset
    if spec is None:
        spec = str(Path(args.data_root) / 'ramdocs')
        if not Path(spec).is_dir():
            parser.error(f'no RAMDocs folder at {spec}: give --data-root (or $PYTERRIER_MULTIQUERY_DATA) the folder '
                         'of the bundled collections, or --dataset a path or an irds: identifier')
    try:
        dataset = load_dataset(spec)
        train_dataset = None
        if args.train_dataset:
            members = [load_dataset(member) for member in args.train_dataset]
            train_dataset = members[0] if len(members) == 1 else CombinedDataset(members)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))

    start = time.perf_counter()
    from pyterrier_multiquery.experiment.determinism import make_deterministic
    make_deterministic(args.seed, args.threads)
    with quiet(not args.verbose):
        folders_before = _irds_folders()
        try:
            trained_on = []
            if train_dataset is not None:
                trained_on = list(train_dataset.members.values()) if isinstance(train_dataset, CombinedDataset) \
                    else [train_dataset]
            # trained on other collections only: every question of --dataset is a test question
            split = dataset_split(dataset, args.variant, whole=bool(trained_on) and dataset not in trained_on)
            train_split = split
            if train_dataset is not None:
                train_topics, train_qrels = training_questions(train_dataset)
                train_split = split._replace(train_topics=train_topics, train_qrels=train_qrels)
        except OSError as e:   # ir_datasets downloads topics and qrels on first use
            _remove_new_empty_folders(folders_before)
            parser.error(f'could not read the topics and qrels ({type(e).__name__}: {e}); an irds: dataset needs the '
                         'network the first time: without one, give --dataset a local copy')
        test_topics, test_qrels = (split.test_topics, split.test_qrels)
        print(f'dataset: {spec} ({split.description}; evaluated on {len(test_topics)} test queries)')
        if train_dataset is not None:
            print(f'training on: {" + ".join(args.train_dataset)} ({len(train_split.train_topics)} queries)')
        train = train_split.train_topics is not None and not args.no_train
        if train_split.train_topics is None and not args.no_train:
            print(f'{spec} has no training split and no --train-dataset was given: AMER and JPR are not trained '
                  '(give --train-dataset, or --amer/--jpr with trained models)')
        systems = build_systems(args, spec, dataset, train_dataset, train_split, train)
        from pyterrier_multiquery.experiment.evaluation import run_experiment
        import pyterrier as pt
        runs = {name: system(test_topics) for name, system in pt.tqdm(systems.items(), desc='systems', unit='system')}
        table = run_experiment(runs, test_topics, test_qrels, baseline=1)
        if FINE_TUNED in runs:    # the trained methods against the fair baseline, the fine-tuned single vector
            against = run_experiment(runs, test_topics, test_qrels, baseline=list(runs).index(FINE_TUNED))
            tested = [c for c in against.columns if c.endswith(' p-value')]
            table = table.join(against[tested].rename(columns=lambda c: f'{c} vs {FINE_TUNED}'))
    print(format_table(table))
    print(f'took {time.perf_counter() - start:.1f}s')
    if args.save:
        table.to_csv(args.save, index=False)
        print(f'saved to {args.save}')
    return 0


def format_table(table: pd.DataFrame) -> str:
    """The main job's table as it prints it (and as the README shows it): each system's measures, the paired
    t-tests of MRecall against MiniLM and, where it ran, of the trained methods against the fine-tuned single
    vector."""
    measures = [c for c in table.columns if c != 'name' and not c.endswith((' +', ' -', ' p-value', FINE_TUNED))]
    tests = [f'{m} p-value' for m in measures if m.startswith('MRecall@') and f'{m} p-value' in table.columns]
    lines = [table[['name'] + measures + tests].rename(columns=lambda c: c.replace(' p-value', ' p'))
             .to_string(index=False, float_format='%.4f', na_rep=''),
             "p: paired t-test against MiniLM (the --save table has every measure's test and +/- query counts)"]
    versus = [f'{m} p-value vs {FINE_TUNED}' for m in measures if m.startswith('MRecall@')]
    if set(versus) <= set(table.columns):
        lines += [f'p against {FINE_TUNED}, the fine-tuned single vector (paired t-test):',
                  table.loc[table['name'].isin(TRAINED), ['name'] + versus]
                  .rename(columns=lambda c: c.replace(f' p-value vs {FINE_TUNED}', ' p'))
                  .to_string(index=False, float_format='%.4f', na_rep='')]
    return '\n'.join(lines)


def _irds_folders() -> Optional[set]:
    """The folders under ir_datasets' home, or None when it is not loaded (only irds: datasets load it)."""
    if 'ir_datasets' not in sys.modules:
        return None
    home = Path(sys.modules['ir_datasets'].util.home_path())
    return {home} | {p for p in home.rglob('*') if p.is_dir()}


def _remove_new_empty_folders(before: Optional[set]) -> None:
    """Removes the empty folders a failed ir_datasets download left under its home, deepest first."""
    if before is None:
        return
    for folder in sorted(_irds_folders() - before, key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()


def refiners(args, cache, name: str, first_stage, train_first_stage, dataset, train_dataset, train_split, train: bool,
             amer_model=None, jpr_model=None) -> dict:
    """AMER, ``first stage >> JPR`` and ``AMER >> JPR`` over one first stage (``name``), trained on ``train_split``
    over ``train_first_stage`` where ``train`` (or given as models), under the names of :data:`REFINED`."""
    from pyterrier_multiquery.experiment import systems
    amer_name, jpr_name, stacked_name = REFINED[name]
    if train and amer_model is None:
        print(f'{amer_name}: trained on the training split (on the first run; then cached)', flush=True)
        amer_model = systems.train_amer(train_first_stage, train_split.train_topics, train_split.train_qrels,
                                        **SCHEDULES['AMER'], seed=args.seed, threads=args.threads, verbose=True)
    if train and jpr_model is None:
        print(f'{jpr_name}: trained on the training split (on the first run; then cached)', flush=True)
        jpr_model = systems.train_jpr(train_first_stage, train_dataset or dataset, train_split.train_topics,
                                      train_split.train_qrels, **SCHEDULES['JPR'], seed=args.seed, threads=args.threads,
                                      verbose=True)
    table = {}
    if amer_model is not None:
        table[amer_name] = systems.amer_system(first_stage, amer_model, batch_size=args.batch_size)
    if jpr_model is not None:
        model_id = hashlib.sha1(str(Path(jpr_model).resolve()).encode()).hexdigest()[:12]
        states = cache.root / 'jpr_candidate_states' / model_id
        from pyterrier_multiquery.jpr import JPRModel
        jpr_model = JPRModel.from_pretrained(jpr_model)   # loaded once for both rerankers
        table[jpr_name] = systems.jpr_system(first_stage.retriever(), dataset, jpr_model, seed=args.seed,
                                             state_cache=states, verbose=args.verbose)
        if amer_model is not None:
            table[stacked_name] = systems.jpr_system(table[amer_name], dataset, jpr_model, seed=args.seed,
                                                     state_cache=states, verbose=args.verbose)
    return table


def build_systems(args, spec, dataset, train_dataset, train_split, train: bool):
    """The table's systems: baselines, and AMER and JPR trained on ``train_split`` (or given as models)."""
    from pyterrier_multiquery.baselines import DEFAULT_MMR_LAMBDA
    from pyterrier_multiquery.experiment import systems
    from pyterrier_multiquery.experiment.cache import Cache
    cache = Cache(args.cache_dir, refresh=args.refresh, verbose=True)
    print(f'cache: {cache.root} (indexes and models built on the first run, rebuilt when what made them changes)',
          flush=True)
    first_stage = systems.DenseFirstStage(dataset, cache, batch_size=args.batch_size, verbose=args.verbose)
    train_first_stage = first_stage if train_dataset is None else systems.DenseFirstStage(
        train_dataset, cache, batch_size=args.batch_size, verbose=args.verbose)
    mmr_lambda = args.mmr_lambda
    if mmr_lambda is None:
        mmr_lambda = DEFAULT_MMR_LAMBDA
        if train_split.train_topics is not None:
            tuned = systems.tune_mmr_lambda(train_first_stage, train_split.train_topics, train_split.train_qrels,
                                            depth=args.mmr_depth)
            mmr_lambda = tuned['lambda']
            print(f'MMR lambda {mmr_lambda} chosen on the training split ({tuned["measure"]} '
                  + ', '.join(f'{k}: {v:.3f}' for k, v in tuned['scores'].items()) + ')')
    table = systems.baseline_systems(first_stage, mmr_lambda=mmr_lambda, mmr_depth=args.mmr_depth)
    stages = {'MiniLM': (first_stage, train_first_stage)}
    if train:
        print(f'{FINE_TUNED}: MiniLM fine-tuned on the training split (on the first run; then cached)', flush=True)
        fine_tuned = systems.train_single_vector(train_first_stage, train_split.train_topics, train_split.train_qrels,
                                                 **SCHEDULES[FINE_TUNED], seed=args.seed, threads=args.threads,
                                                 verbose=True)
        table[FINE_TUNED] = systems.single_vector(first_stage, fine_tuned)
        if FINE_TUNED in FIRST_STAGES[args.first_stage]:
            over = lambda data: systems.DenseFirstStage(data, cache, model=fine_tuned,  # noqa: E731
                                                        batch_size=args.batch_size, verbose=args.verbose)
            stages[FINE_TUNED] = (over(dataset), over(train_dataset) if train_dataset is not None else None)
    for name, (stage, train_stage) in stages.items():
        given = (args.amer, args.jpr) if name == 'MiniLM' else (None, None)   # given models are MiniLM's
        table.update(refiners(args, cache, name, stage, train_stage or stage, dataset, train_dataset, train_split,
                              train and name in FIRST_STAGES[args.first_stage], *given))
    return table

