"""Command line of the main job: ``python -m pyterrier_multiquery [--dataset PATH|irds:ID] [--save table.csv]``."""
import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Optional


def main(argv=None) -> int:
    """Trains AMER and JPR on a training split, then compares them with BM25, MiniLM and MMR on the test split."""
    parser = argparse.ArgumentParser(prog='python -m pyterrier_multiquery', description=main.__doc__)
    parser.add_argument('--dataset', help='a BEIR, TREC, RAMDocs or MuSiQue path, or an irds: identifier '
                                          '(default: DATA_ROOT/ramdocs)')
    parser.add_argument('--data-root', default=os.environ.get('PYTERRIER_MULTIQUERY_DATA', '../shared/data'),
                        help='the folder of the bundled collections, for the default --dataset '
                             '(default: $PYTERRIER_MULTIQUERY_DATA or %(default)s)')
    parser.add_argument('--variant', help='topics/qrels variant, e.g. the BEIR split (default: the dataset\'s own)')
    parser.add_argument('--train-dataset', help='train AMER, JPR and the MMR lambda on this dataset\'s training split '
                                                '(all of it when it has none) instead of --dataset\'s')
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'),
                        help='where indexes and trained models are built once and reused (default: %(default)s)')
    parser.add_argument('--mmr-lambda', type=float, help='MMR relevance weight (default: chosen on the training '
                                                         'split by MRecall@10; 0.9 without one)')
    parser.add_argument('--mmr-depth', type=int, default=500, help='dense results MMR re-ranks (default: %(default)s)')
    parser.add_argument('--batch-size', type=int, default=64, help='encoder batch size (default: %(default)s)')
    parser.add_argument('--amer', metavar='MODEL', help='run AMER with this trained model (a folder written by '
                                                       'AMERModel.save_pretrained) instead of training one')
    parser.add_argument('--jpr', metavar='MODEL', help='run JPR with this trained model (a folder written by '
                                                      'JPRModel.save_pretrained) instead of training one')
    parser.add_argument('--no-train', action='store_true', help='train no model: baselines (and --amer/--jpr) only')
    parser.add_argument('-v', '--verbose', action='store_true', help='show every progress bar and library log')
    parser.add_argument('--save', help='write the table as CSV to this path')
    args = parser.parse_args(argv)

    from pyterrier_multiquery._quiet import quiet
    from pyterrier_multiquery.loaders import load_dataset
    from pyterrier_multiquery.experiment.evaluation import dataset_split

    spec = args.dataset
    if spec is None:
        spec = str(Path(args.data_root) / 'ramdocs')
        if not Path(spec).is_dir():
            parser.error(f'no RAMDocs folder at {spec}: give --data-root (or $PYTERRIER_MULTIQUERY_DATA) the folder '
                         'of the bundled collections, or --dataset a path or an irds: identifier')
    try:
        dataset = load_dataset(spec)
        train_dataset = load_dataset(args.train_dataset) if args.train_dataset else None
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))

    start = time.perf_counter()
    with quiet(not args.verbose):
        folders_before = _irds_folders()
        try:
            split = dataset_split(dataset, args.variant)
            train_split = split if train_dataset is None else dataset_split(train_dataset)
        except OSError as e:   # ir_datasets downloads topics and qrels on first use
            _remove_new_empty_folders(folders_before)
            parser.error(f'could not read the topics and qrels ({type(e).__name__}: {e}); an irds: dataset needs the '
                         'network the first time: without one, give --dataset a local copy')
        if train_dataset is not None and train_split.train_topics is None:   # a dataset without a split: all of it
            train_split = train_split._replace(train_topics=train_split.test_topics, train_qrels=train_split.test_qrels)
        test_topics, test_qrels = (split.test_topics, split.test_qrels)
        print(f'dataset: {spec} ({split.description}; evaluated on {len(test_topics)} test queries)')
        if train_dataset is not None:
            print(f'training on: {args.train_dataset} ({len(train_split.train_topics)} queries)')
        train = train_split.train_topics is not None and not args.no_train
        if train_split.train_topics is None and not args.no_train:
            print(f'{spec} has no training split and no --train-dataset was given: AMER and JPR are not trained '
                  '(give --train-dataset, or --amer/--jpr with trained models)')
        systems = build_systems(args, spec, dataset, train_dataset, train_split, train)
        from pyterrier_multiquery.experiment.evaluation import run_experiment
        table = run_experiment(systems, test_topics, test_qrels, baseline=1, verbose=True)
    measures = [c for c in table.columns if c != 'name' and not c.endswith((' +', ' -', ' p-value'))]
    tests = [f'{m} p-value' for m in measures if m.startswith('MRecall@') and f'{m} p-value' in table.columns]
    print(table[['name'] + measures + tests].rename(columns=lambda c: c.replace(' p-value', ' p'))
          .to_string(index=False, float_format='%.4f', na_rep=''))
    print('p: paired t-test against MiniLM (the --save table has every measure\'s test and +/- query counts)')
    print(f'took {time.perf_counter() - start:.1f}s')
    if args.save:
        table.to_csv(args.save, index=False)
        print(f'saved to {args.save}')
    return 0


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


def build_systems(args, spec, dataset, train_dataset, train_split, train: bool):
    """The table's systems: baselines, and AMER and JPR trained on ``train_split`` (or given as models)."""
    from pyterrier_multiquery.experiment import systems
    from pyterrier_multiquery.baselines import DEFAULT_MMR_LAMBDA
    cache_dir = systems.cache_dir_for(spec, args.cache_dir)
    print(f'indexes: {cache_dir} (built on the first run)', flush=True)
    first_stage = systems.DenseFirstStage(dataset, cache_dir, batch_size=args.batch_size, verbose=args.verbose)
    train_first_stage = first_stage if train_dataset is None else systems.DenseFirstStage(
        train_dataset, systems.cache_dir_for(args.train_dataset, args.cache_dir), batch_size=args.batch_size,
        verbose=args.verbose)
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
    amer_model, jpr_model = args.amer, args.jpr
    if train and amer_model is None:
        print('AMER: trained on the training split (on the first run; then cached)', flush=True)
        amer_model = systems.train_amer(train_first_stage, train_split.train_topics, train_split.train_qrels)
    if train and jpr_model is None:
        print('JPR: trained on the training split (on the first run; then cached)', flush=True)
        jpr_model = systems.train_jpr(train_first_stage, train_dataset or dataset, train_split.train_topics,
                                      train_split.train_qrels)
    if amer_model is not None:
        table['AMER'] = systems.amer(first_stage, amer_model, batch_size=args.batch_size)
    if jpr_model is not None:
        model_id = hashlib.sha1(str(Path(jpr_model).resolve()).encode()).hexdigest()[:12]
        states = cache_dir / 'jpr_candidate_states' / model_id
        from pyterrier_multiquery.jpr import JPRModel
        jpr_model = JPRModel.from_pretrained(jpr_model)   # loaded once for both rerankers
        table['MiniLM >> JPR'] = systems.jpr(first_stage.retriever(), dataset, jpr_model, state_cache=states,
                                             verbose=args.verbose)
        if amer_model is not None:
            table['AMER >> JPR'] = systems.jpr(table['AMER'], dataset, jpr_model, state_cache=states,
                                               verbose=args.verbose)
    return table

