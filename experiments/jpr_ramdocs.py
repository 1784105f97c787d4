"""JPR and IndepPR with a first-stage prior against their MiniLM first stage: 5-fold cross-validation by question.

    python experiments/jpr_ramdocs.py [--datasets ramdocs musique] [--candidates 20] [--epochs 20]

Collections: RAMDocs (500 questions, one to three answers) and MuSiQue (100 questions, each supporting paragraph its own
answer), both from the shared data folder. First stage: all-MiniLM-L6-v2, top |B| = ``--candidates`` per question. The
rerankers over MiniLM share one frozen all-MiniLM-L6-v2 passage encoder, the one over MiniLM-FT reads with MiniLM-FT
(states computed once per question and encoder, kept in the cache folder); only their decoders train. Per fold, on the
other folds' questions, :func:`~pyterrier_multiquery.experiment.systems.train_jpr` trains each model and keeps its best
epoch (0, the untrained model, included) on a fifth of them held out as dev; the test fold is never seen. Systems:
MiniLM (its top k), IndepPR + prior, JPR + prior decoded with SeqDecode and TreeDecode, and JPR without the prior
(TreeDecode, the ablation: the model before the prior existed); and stacked on the fine-tuned encoder, MiniLM-FT (MiniLM
fine-tuned contrastively on the fold's training questions, the fair single-vector baseline: its top k) and MiniLM-FT >>
JPR + prior (trained over MiniLM-FT's candidates, TreeDecode), tested against MiniLM-FT. Measures on all questions,
those with more than one answer, and the low-similarity third (the third with the most spread-out target passages by
MiniLM cosine distance), with a paired bootstrap of each system against MiniLM. Writes
``experiments/results/jpr_ramdocs.{md,json,png}`` (the figure: the training curves) and the per-query figures
``jpr_ramdocs_perquery.csv``. Each finished fold's per-query figures and training record are stored as it goes
(``jpr_ramdocs_folds_perquery.csv``, ``jpr_ramdocs_folds.csv``), so that a stopped run goes on at the first fold not
stored (``--restart`` forgets them).
"""
import json
import time
from pathlib import Path

import numpy as np
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
MEASURES = [MRecall @ 5, MRecall @ 10, alpha_nDCG @ 10]
MODELS = {'IndepPR + prior': dict(mode='independent', prior=True),
          'JPR + prior': dict(mode='dynamic_oracle', prior=True),
          'JPR, no prior': dict(mode='dynamic_oracle', prior=False)}
#: JPR + prior trained over MiniLM-FT's candidates and reranking them (the first stage is the pipeline's choice).
STACKED_MODEL = f'{FINE_TUNED} >> JPR + prior'
RERANKERS = {'IndepPR + prior': ('IndepPR + prior', 'independent'), 'JPR + prior (Seq)': ('JPR + prior', 'seq'),
             'JPR + prior (Tree)': ('JPR + prior', 'tree'), 'JPR, no prior (Tree)': ('JPR, no prior', 'tree')}


#: The arguments that shape a fold's figures: a run goes on only with those of the folds stored.
SETTINGS = ('seed', 'folds', 'candidates', 'k', 'epochs', 'dev_fraction', 'learning_rate', 'gamma', 'beta',
            'max_length', 'threads')


def cross_validate_on(name: str, args, parts: StoredParts) -> dict:
    """Every system's per-query figures on one collection, its subsets, the training curves and the times."""
    spec = str(args.data_root / name)
    dataset = load_dataset(spec)
    first_stage = systems.DenseFirstStage(dataset, systems.cache_dir_for(spec, args.cache_dir), verbose=False)
    states = first_stage.cache_dir / 'jpr_candidate_states'   # keyed by the texts, max_length and the encoder
    settings = dict(num_candidates=args.candidates, k=args.k, epochs=args.epochs, dev_fraction=args.dev_fraction,
                    learning_rate=args.learning_rate, gamma=args.gamma, max_length=args.max_length, seed=args.seed)

    def fold_systems(fold, train_topics, train_qrels):
        fine_tuned = systems.train_single_vector(first_stage, train_topics, train_qrels, seed=args.seed,
                                                 threads=args.threads)
        fine_tuned_stage = systems.DenseFirstStage(dataset, first_stage.cache, model=fine_tuned, verbose=False)
        trained = [(model, first_stage, mode) for model, mode in MODELS.items()]
        trained.append((STACKED_MODEL, fine_tuned_stage, MODELS['JPR + prior']))
        paths, record = {}, {'curves': [], 'train_seconds': {}}
        for model, stage, mode in trained:
            start = time.perf_counter()
            paths[model] = systems.train_jpr(stage, dataset, train_topics, train_qrels, state_cache=states,
                                             **settings, **mode)
            record['train_seconds'][model] = time.perf_counter() - start
            training = json.loads((paths[model] / 'training.json').read_text())   # the record saved with the model
            record['curves'].extend({'collection': name, 'fold': fold, 'model': model, **point}
                                    for point in training['history']['curve'])

        def reranked(stage, model, decode):
            return systems.jpr_system(stage, dataset, paths[model], num_candidates=args.candidates, k=args.k,
                                      decode=decode, beta=args.beta, seed=args.seed, state_cache=states, verbose=False)

        stage = first_stage.retriever(args.candidates)
        fine_tuned_candidates = fine_tuned_stage.retriever(args.candidates)
        return {'MiniLM': stage % args.k,
                **{system: reranked(stage, model, decode) for system, (model, decode) in RERANKERS.items()},
                FINE_TUNED: fine_tuned_candidates % args.k,
                f'{STACKED_MODEL} (Tree)': reranked(fine_tuned_candidates, STACKED_MODEL, 'tree')}, record

    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    scores, records, decode_seconds = cross_validate(topics, qrels, fold_systems, MEASURES, folds=args.folds,
                                                     seed=args.seed, parts=parts, key={'collection': name})
    counts = answer_counts(qrels)
    timings = {'train_seconds_per_fold': {model: float(np.mean([r['train_seconds'][model] for r in records]))
                                          for model in (*MODELS, STACKED_MODEL)},
               'run_seconds_per_question': {system: t / counts.size for system, t in decode_seconds.items()}}
    return {'scores': scores, 'subsets': answer_subsets(qrels, first_stage.doc_vectors()), 'counts': counts,
            'curves': [point for r in records for point in r['curves']], 'timings': timings}


def main():
    parser = experiment_parser(__doc__, RESULTS / 'jpr_ramdocs')
    parser.add_argument('--datasets', nargs='+', default=['ramdocs', 'musique'], help='collections under --data-root')
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
    parser.add_argument('--restart', action='store_true', help='forget the folds stored by an earlier run')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    settings = {**{k: getattr(args, k) for k in SETTINGS}, 'code': script_fingerprint(__file__)}
    parts = StoredParts(args.out, FOLD_KINDS, settings, restart=args.restart)
    results = {name: cross_validate_on(name, args, parts) for name in args.datasets}
    tables = {}
    for name, r in results.items():
        means, tests = compare(r['scores'], 'MiniLM', r['subsets'], seed=args.seed)
        sizes = ', '.join(f'{subset} {len(qids)}' for subset, qids in r['subsets'].items())
        tables[f'{name}: means ({r["counts"].size} questions; {sizes})'] = means
        tables[f'{name}: paired bootstrap against MiniLM (10,000 resamples)'] = tests[
            ['system', 'measure', 'questions', 'mean_diff', 'ci_low', 'ci_high', 'p_value']]
        stacked = r['scores'][r['scores']['system'].isin([FINE_TUNED, f'{STACKED_MODEL} (Tree)'])]
        _, tests = compare(stacked, FINE_TUNED, r['subsets'], seed=args.seed)
        tables[f'{name}: paired bootstrap against {FINE_TUNED} (10,000 resamples)'] = tests[
            ['system', 'measure', 'questions', 'mean_diff', 'ci_low', 'ci_high', 'p_value']]
    curves = pd.DataFrame([point for r in results.values() for point in r['curves']])
    tables.update(training_tables(curves))
    pd.concat([per_query_table(name, r) for name, r in results.items()]).to_csv(
        Path(args.out).with_name(Path(args.out).name + '_perquery.csv'), index=False)
    total = time.perf_counter() - started
    write_report(args.out, 'JPR with a first-stage prior against MiniLM (RAMDocs, MuSiQue)', description(args, total),
                 tables, extra={'settings': {k: str(v) for k, v in vars(args).items() if k != 'cache_dir'},
                                'timings': {name: r['timings'] for name, r in results.items()},
                                'training_curves': curves.to_dict('records'), 'total_seconds': total},
                 figure=line_figure(mean_curves(curves), 'epoch', 'value', line='model', panel='curve',
                                    ylabel='mean over folds'))
    print(Path(args.out).with_suffix('.md').read_text())


def training_tables(curves: pd.DataFrame) -> dict:
    """Mean training loss and dev score by epoch over the folds, and the epoch each fold kept."""
    summary = curves.groupby(['collection', 'model', 'epoch'])[['loss', 'dev']].mean().unstack('epoch')
    best = curves.loc[curves.groupby(['collection', 'model', 'fold'])['dev'].idxmax()]
    return {'Training curve: mean training loss by epoch over folds': summary['loss'].round(4).reset_index(),
            'Training curve: mean dev score (mean of MRecall@5 and @10) by epoch over folds':
                summary['dev'].round(4).reset_index(),
            'Epoch kept per fold (best on dev)': best.pivot_table(index=['collection', 'model'], columns='fold',
                                                                  values='epoch').reset_index()}


def mean_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """Training loss and dev score (mean of MRecall@5 and @10) by epoch, averaged over folds, in long form."""
    mean = curves.groupby(['collection', 'model', 'epoch'], as_index=False)[['loss', 'dev']].mean()
    long = mean.melt(id_vars=['collection', 'model', 'epoch'], var_name='quantity').dropna()
    return long.assign(curve=long['collection'] + ': ' + long['quantity'].map({'loss': 'training loss',
                                                                               'dev': 'dev MRecall'}))


def per_query_table(name: str, result: dict) -> pd.DataFrame:
    """One row per question and measure, one column per system (the notebook's input)."""
    wide = result['scores'].pivot_table(index=['qid', 'measure'], columns='system', values='value').reset_index()
    return wide.assign(collection=name, answers=wide['qid'].map(result['counts']))


def description(args, total: float) -> str:
    return (f'First stage all-MiniLM-L6-v2, |B| = {args.candidates}, k = {args.k}; frozen passage encoder (max '
            f'{args.max_length} tokens) of each reranker\'s first stage (all-MiniLM-L6-v2 or MiniLM-FT), pointer '
            f'decoder of 2 layers trained on |B|/4 candidates per question (the greedy answer cover and random '
            f'others) for up to {args.epochs} epochs (learning rate {args.learning_rate}, gamma {args.gamma}); the '
            f'epoch (0 = untrained) chosen on {args.dev_fraction:.0%} of each fold\'s training questions; TreeDecode '
            f'beta = {args.beta}. {args.folds}-fold cross-validation by question, stratified by answer count (seed '
            f'{args.seed}). Prior: logits + w * -log(1 + first-stage rank), w learned from 1, query head from zero, so '
            f'an untrained model returns the MiniLM order. This invocation took {total:.0f}s on {args.threads} CPU '
            f'thread(s) (folds stored by an earlier one not counted). '
            f'Command: `python experiments/jpr_ramdocs.py`.')


if __name__ == '__main__':
    main()
