"""AMER over all-MiniLM-L6-v2 against MiniLM itself: k-fold cross-validation on RAMDocs and MuSiQue.

    python experiments/amer_ramdocs.py [--datasets ramdocs musique] [--folds 5] [--epochs 8]

Per fold (split by question, stratified by number of answers): MMR's lambda is chosen on the training questions;
MiniLM-FT (MiniLM fine-tuned contrastively on them, the fair single-vector baseline) trains on all of them;
AMER (encoder backbone: N = 2 vectors, the second the MiniLM query vector plus a zero-initialised residual read
from the frozen encoder) and its linear-residual ablation train on 80 % of the training questions, the epoch
chosen on the other 20 % (epoch 0 = MiniLM itself), the lists merged round-robin; AMER over MiniLM-FT (the encoder
backbone trained over the fine-tuned encoder's vectors and index, the same way) too. Every system is
scored on the fold's test questions; the folds' runs are pooled and tested against MiniLM by paired bootstrap,
on all questions, those with more than one answer, and the third whose answer passages lie furthest apart, and
the trained systems against MiniLM-FT likewise. Writes ``experiments/results/amer_ramdocs.{md,json,png}``; each
finished fold's per-query figures and choices are stored beside it as it goes (``amer_ramdocs_folds_perquery.csv``,
``amer_ramdocs_folds.csv``), so that a stopped run goes on at the first fold not stored (``--restart`` forgets them).
"""
import json
import time
from pathlib import Path

import pandas as pd
import torch
from ir_measures import alpha_nDCG

from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.experiment.cache import script_fingerprint
from pyterrier_multiquery.experiment.evaluation import (
    answer_counts,
    answer_subsets,
    compare,
    FOLD_KINDS,
    cross_validate,
    experiment_parser,
    line_figure,
    write_report,
)
from pyterrier_multiquery.experiment.main import FINE_TUNED
from pyterrier_multiquery.experiment.parts import StoredParts
from pyterrier_multiquery.loaders import load_dataset
from pyterrier_multiquery.measures import MRecall

RESULTS = Path(__file__).parent / 'results'
MEASURES = [MRecall @ 5, MRecall @ 10, MRecall @ 20, alpha_nDCG @ 10]
DEPTH = 100
RESIDUALS = {'AMER (encoder)': 'encoder', 'AMER (linear residual)': 'linear'}
#: AMER (encoder backbone) trained over MiniLM-FT and searching its index: the first stage is the pipeline's choice.
STACKED = f'AMER over {FINE_TUNED}'
#: Every AMER the folds train.
AMERS = (*RESIDUALS, STACKED)
#: The arguments that shape a fold's figures: a run goes on only with those of the folds stored.
SETTINGS = ('seed', 'folds', 'epochs', 'num_vectors', 'learning_rate', 'threads')


def cross_validate_on(name: str, args, parts: StoredParts) -> dict:
    """Every system's pooled test figures on one collection, and the choices made on each fold's training data."""
    spec = str(args.data_root / name)
    dataset = load_dataset(spec)
    first_stage = systems.DenseFirstStage(dataset, systems.cache_dir_for(spec, args.cache_dir), verbose=False)

    def fold_systems(fold, train_topics, train_qrels):
        Lambda = systems.tune_mmr_lambda(first_stage, train_topics, train_qrels, depth=DEPTH)['lambda']
        chosen = {'dataset': name, 'fold': fold, 'MMR λ': Lambda}
        built = {'MiniLM': first_stage.retriever(DEPTH),
                 'MiniLM >> MMR (λ tuned)': systems.mmr_system(first_stage, Lambda, depth=DEPTH)}
        fine_tuned = systems.train_single_vector(first_stage, train_topics, train_qrels, seed=args.seed,
                                                 threads=args.threads)
        built[FINE_TUNED] = systems.single_vector(first_stage, fine_tuned, num_results=DEPTH)
        fine_tuned_stage = systems.DenseFirstStage(dataset, first_stage.cache, model=fine_tuned, verbose=False)
        amers = [(system, first_stage, residual) for system, residual in RESIDUALS.items()]
        amers.append((STACKED, fine_tuned_stage, 'encoder'))
        for system, stage, residual in amers:
            start = time.perf_counter()
            path = systems.train_amer(stage, train_topics, train_qrels, residual=residual, epochs=args.epochs,
                                      num_vectors=args.num_vectors, learning_rate=args.learning_rate, seed=args.seed,
                                      threads=args.threads)
            training = json.loads((path / 'training.json').read_text())   # the record saved with the model
            history = training['history']
            chosen[system] = {'epoch': history['best_epoch'], 'merge': training['merge'],
                              'departure': history['departure'], 'curve': history['curve'],
                              'seconds': time.perf_counter() - start}
            built[system] = systems.amer_system(stage, path, num_results=DEPTH)
        return built, chosen

    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    scores, choices, _ = cross_validate(topics, qrels, fold_systems, MEASURES, folds=args.folds, seed=args.seed,
                                        parts=parts, key={'dataset': name})
    subsets = answer_subsets(qrels, first_stage.doc_vectors())
    means, tests = compare(scores, 'MiniLM', subsets, seed=args.seed)
    _, against_fine_tuned = compare(scores[scores['system'] != 'MiniLM'], FINE_TUNED, subsets, seed=args.seed)
    sizes = ', '.join([f'{name}: {len(answer_counts(qrels))} questions']
                      + [f'{subset} {len(qids)}' for subset, qids in subsets.items()])
    return {'means': means.assign(dataset=name), 'tests': tests.assign(dataset=name),
            'against fine-tuned': against_fine_tuned.assign(dataset=name), 'choices': choices, 'sizes': sizes}


def main():
    parser = experiment_parser(__doc__, RESULTS / 'amer_ramdocs')
    parser.add_argument('--datasets', nargs='+', default=['ramdocs', 'musique'], help='collections under --data-root')
    parser.add_argument('--folds', type=int, default=5)
    parser.add_argument('--epochs', type=int, default=8, help='most epochs (the best on dev is kept)')
    parser.add_argument('--num-vectors', type=int, default=2)
    parser.add_argument('--learning-rate', type=float, default=1e-4)
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads (default: %(default)s, the count the published runs were made with)')
    parser.add_argument('--restart', action='store_true', help='forget the folds stored by an earlier run')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    settings = {**{k: getattr(args, k) for k in SETTINGS}, 'code': script_fingerprint(__file__)}
    parts = StoredParts(args.out, FOLD_KINDS, settings, restart=args.restart)
    results = [cross_validate_on(name, args, parts) for name in args.datasets]
    choices = [choice for result in results for choice in result['choices']]
    chosen = pd.DataFrame([{**{k: c[k] for k in ('dataset', 'fold', 'MMR λ')},
                            **{f'{s} {k}': c[s][k] for s in AMERS for k in ('epoch', 'merge', 'seconds')}}
                           for c in choices])
    curves = pd.DataFrame([{'dataset': c['dataset'], 'system': s, 'fold': c['fold'], 'epoch': p['epoch'],
                            'dev': p['dev']} for c in choices for s in AMERS
                           for p in c[s]['curve']])
    write_report(
        args.out, 'AMER over all-MiniLM-L6-v2 against MiniLM (cross-validation)',
        f'{args.folds}-fold cross-validation by question ({"; ".join(r["sizes"] for r in results)}); MiniLM top '
        f'{DEPTH} per system; N = {args.num_vectors}, {args.epochs} epochs at most, lr {args.learning_rate}, frozen '
        f'encoder, hard negatives = MiniLM\'s top 10 non-relevant passages; epoch chosen on a fifth of each '
        f'training fold, lists merged round-robin. MiniLM-FT: MiniLM fine-tuned contrastively on the fold\'s '
        f'training questions (the '
        f'single-query baseline of the AMER paper, systems.train_single_vector\'s schedule). p: paired bootstrap '
        f'(10,000 resamples) against MiniLM, and against MiniLM-FT, over the pooled test questions. This '
        f'invocation took {time.perf_counter() - start:.0f}s (folds stored by an earlier one not counted). '
        f'Command: `python experiments/amer_ramdocs.py`.',
        {'Mean over test questions': pd.concat([r['means'] for r in results], ignore_index=True),
         'Paired bootstrap against MiniLM': pd.concat([r['tests'] for r in results], ignore_index=True)[
             ['dataset', 'system', 'measure', 'questions', 'mean_diff', 'ci_low', 'ci_high', 'p_value']],
         'Paired bootstrap against MiniLM-FT': pd.concat([r['against fine-tuned'] for r in results],
                                                         ignore_index=True)[
             ['dataset', 'system', 'measure', 'questions', 'mean_diff', 'ci_low', 'ci_high', 'p_value']],
         'Choices made on training data (per fold)': chosen},
        extra={'settings': {k: str(v) for k, v in vars(args).items() if k not in ('cache_dir', 'data_root')},
               'training': choices},
        figure=line_figure(curves, 'epoch', 'dev', line=['system', 'fold'], panel='dataset',
                           ylabel='dev (MRecall@5 + MRecall@10) / 2'))
    print(Path(args.out).with_suffix('.md').read_text())


if __name__ == '__main__':
    main()
