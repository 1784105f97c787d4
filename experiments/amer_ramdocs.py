"""AMER over all-MiniLM-L6-v2 against MiniLM itself: k-fold cross-validation on RAMDocs and MuSiQue.

    python experiments/amer_ramdocs.py [--datasets ramdocs musique] [--folds 5] [--epochs 8]

Per fold (split by question, stratified by number of answers): MMR's lambda is chosen on the training questions;
AMER (encoder backbone: N = 2 vectors, the second the MiniLM query vector plus a zero-initialised residual read
from the frozen encoder) and its linear-residual ablation train on 80 % of the training questions, the epoch and
the merge (round robin, score sum, RRF) chosen on the other 20 % (epoch 0 = MiniLM itself). Every system is
scored on the fold's test questions; the folds' runs are pooled and tested against MiniLM by paired bootstrap,
on all questions, those with more than one answer, and the third whose answer passages lie furthest apart.
Writes ``experiments/results/amer_ramdocs.{md,json,png}``.
"""
import argparse
import json
import time
from pathlib import Path

import pandas as pd
import pyterrier as pt
import torch
from ir_measures import alpha_nDCG

from pyterrier_multiquery import systems
from pyterrier_multiquery.analysis import low_similarity_subset, target_distances
from pyterrier_multiquery.loaders import load_dataset
from pyterrier_multiquery.evaluation import answer_counts, compare, cross_validation_folds, per_query, write_report
from pyterrier_multiquery.experiment import cache_dir_for, default_data_dir
from pyterrier_multiquery.measures import MRecall

RESULTS = Path(__file__).parent / 'results'
MEASURES = [MRecall @ 5, MRecall @ 10, MRecall @ 20, alpha_nDCG @ 10]
DEPTH = 100


def cross_validate(name: str, args) -> dict:
    """Pooled test runs of every system over the folds, with the choices made on training data."""
    spec = str(args.data_dir / name)
    dataset = load_dataset(spec)
    first_stage = systems.DenseFirstStage(dataset, cache_dir_for(spec, args.cache_dir), verbose=False)
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    runs, choices = {}, []
    folds = list(cross_validation_folds(qrels, args.folds, seed=args.seed))
    for fold, (train_qids, test_qids) in enumerate(pt.tqdm(folds, desc=f'{name} folds')):
        train = topics[topics['qid'].isin(set(train_qids))]
        test = topics[topics['qid'].isin(set(test_qids))]
        train_qrels = qrels[qrels['qid'].isin(set(train_qids))]
        Lambda = systems.tune_mmr_lambda(first_stage, train, train_qrels, depth=DEPTH)['lambda']
        fold_systems = {'MiniLM': first_stage.retriever(DEPTH), 'MiniLM >> MMR (λ tuned)': systems.mmr(
            first_stage, Lambda, depth=DEPTH)}
        chosen = {'fold': fold, 'mmr_lambda': Lambda}
        for system, residual in [('AMER (encoder)', 'encoder'), ('AMER (linear residual)', 'linear')]:
            start = time.perf_counter()
            path = systems.train_amer(first_stage, train, train_qrels, residual=residual, epochs=args.epochs,
                                      num_vectors=args.num_vectors, learning_rate=args.learning_rate, seed=args.seed)
            training = json.loads((path / systems.AMER_TRAINING).read_text())
            chosen[system] = {**training['chosen'], 'curve': training['curve'], 'seconds': time.perf_counter() - start}
            fold_systems[system] = systems.amer(first_stage, path, num_results=DEPTH)
        choices.append(chosen)
        for system, pipeline in fold_systems.items():
            runs.setdefault(system, []).append(pipeline(test))
    runs = {system: pd.concat(frames, ignore_index=True) for system, frames in runs.items()}
    counts = answer_counts(qrels)
    subsets = {'>1 answer': counts[counts > 1].index,
               'low-sim third': low_similarity_subset(target_distances(qrels, first_stage.doc_vectors()))}
    means, tests = compare(per_query(runs, qrels, MEASURES), 'MiniLM', subsets)
    return {'means': means.assign(dataset=name), 'tests': tests.assign(dataset=name), 'choices': choices,
            'subset sizes': {k: len(v) for k, v in subsets.items()}, 'questions': len(counts)}


def plot_curves(results: dict):
    """Dev score (mean of MRecall@5 and @10, best merge) by epoch of each fold's AMER models."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.5), squeeze=False)
    for ax, (name, result) in zip(axes[0], results.items()):
        for choice in result['choices']:
            for system, style in [('AMER (encoder)', '-'), ('AMER (linear residual)', ':')]:
                curve = pd.DataFrame(choice[system]['curve'])
                ax.plot(curve['epoch'], curve[['round_robin', 'score_sum', 'rrf']].max(axis=1), style,
                        label=f'{system}, fold {choice["fold"]}')
        ax.set_title(f'{name}: dev score by epoch (epoch 0 = MiniLM)')
        ax.set_xlabel('epoch')
        ax.set_ylabel('dev (MRecall@5 + MRecall@10) / 2')
    axes[0][-1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--data-dir', type=Path, default=default_data_dir(), help='the shared data folder')
    parser.add_argument('--datasets', nargs='+', default=['ramdocs', 'musique'])
    parser.add_argument('--folds', type=int, default=5)
    parser.add_argument('--epochs', type=int, default=8)
    parser.add_argument('--num-vectors', type=int, default=2)
    parser.add_argument('--learning-rate', type=float, default=1e-4)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'))
    args = parser.parse_args()
    if args.data_dir is None:
        parser.error('no shared data folder found: give --data-dir')
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    results = {name: cross_validate(name, args) for name in args.datasets}
    means = pd.concat([r['means'] for r in results.values()], ignore_index=True)
    tests = pd.concat([r['tests'] for r in results.values()], ignore_index=True)
    chosen = pd.DataFrame([{'dataset': name, 'fold': c['fold'], 'MMR λ': c['mmr_lambda'],
                            **{f'{s} {k}': c[s][k] for s in ('AMER (encoder)', 'AMER (linear residual)')
                               for k in ('epoch', 'merge', 'seconds')}}
                           for name, r in results.items() for c in r['choices']])
    sizes = '; '.join(f'{name}: {r["questions"]} questions, ' + ', '.join(f'{k} {v}' for k, v in r['subset sizes'].items())
                      for name, r in results.items())
    write_report(
        RESULTS / 'amer_ramdocs', 'AMER over all-MiniLM-L6-v2 against MiniLM (cross-validation)',
        f'{args.folds}-fold cross-validation by question ({sizes}); MiniLM top {DEPTH} per system; N = '
        f'{args.num_vectors}, {args.epochs} epochs at most, lr {args.learning_rate}, frozen encoder, hard negatives '
        f'= MiniLM\'s top 10 non-relevant passages; epoch and merge chosen on a fifth of each training fold. '
        f'p: paired bootstrap (10,000 resamples) against MiniLM over the pooled test questions. Took '
        f'{time.perf_counter() - start:.0f}s. Command: `python experiments/amer_ramdocs.py`.',
        {'Mean over test questions': means,
         'Paired bootstrap against MiniLM': tests[['dataset', 'system', 'measure', 'questions', 'mean_diff',
                                                   'ci_low', 'ci_high', 'p_value']],
         'Choices made on training data (per fold)': chosen},
        extra={'settings': {k: str(v) for k, v in vars(args).items() if k not in ('cache_dir', 'data_dir')},
               'training': {name: r['choices'] for name, r in results.items()}},
        figure=plot_curves(results))
    print((RESULTS / 'amer_ramdocs.md').read_text())


if __name__ == '__main__':
    main()
