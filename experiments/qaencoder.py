"""QAEncoder on SciFact with all-MiniLM-L6-v2: MiniLM against QAE_base/emb/txt/hyb and QA_naive, alpha and beta
chosen on a dev split.

    python experiments/qaencoder.py [--dev-queries 100]

The whole SciFact corpus (5,183 documents), each with the 5W1H queries SmolLM2-135M-Instruct wrote for it
(``experiments/generate_queries.py``: five asked for, greedy; generated on an H100 and read from its
cache). Dev queries are a fixed sample of SciFact's train queries; the table is on the 300 test queries. Writes
``experiments/results/qaencoder.{json,md}``.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
from ir_measures import RR, nDCG

from pyterrier_multiquery import MultiVectorIndex, load_dataset, minilm
from pyterrier_multiquery.experiment import default_data_dir, run_experiment
from pyterrier_multiquery.generation import QueryGenerator
from pyterrier_multiquery.qaencoder import QAEncoder, grid_search

sys.path.insert(0, str(Path(__file__).parent))
from generate_queries import generator, scifact_corpus  # noqa: E402

RESULTS = Path(__file__).parent / 'results'
MEASURES = [RR @ 10, nDCG @ 10]


class MemoisedEncoder:
    """A bi-encoder's ``encode_queries``/``encode_docs`` that encode each distinct text once (the grid search and
    the final systems encode the same generated queries, documents and fingerprints again and again)."""

    def __init__(self, encoder):
        self.encoder = encoder
        self.memo = {'query': {}, 'doc': {}}

    def _encode(self, side, texts):
        memo = self.memo[side]
        missing = list(dict.fromkeys(t for t in texts if t not in memo))
        if missing:
            encode = self.encoder.encode_queries if side == 'query' else self.encoder.encode_docs
            memo.update(zip(missing, encode(missing)))
        return np.stack([memo[t] for t in texts])

    def encode_queries(self, texts):
        return self._encode('query', list(texts))

    def encode_docs(self, texts):
        return self._encode('doc', list(texts))


def dense_system(encoder, documents, directory):
    """Exhaustive search over ``documents``' ``doc_vec`` (a FlexIndex in ``directory``)."""
    from pyterrier_dr import FlexIndex
    index = FlexIndex(str(directory))
    index.indexer().index(documents[['docno', 'doc_vec']].to_dict('records'))
    return encoder.query_encoder() >> index.np_retriever(num_results=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dev-queries', type=int, default=100)
    parser.add_argument('--betas', type=float, nargs='+', default=[0.5, 1.0, 2.0])
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()

    dataset = load_dataset(str(default_data_dir() / 'scifact'))
    test_topics, test_qrels = dataset.get_topics('test'), dataset.get_qrels('test')
    train_topics, train_qrels = dataset.get_topics('train'), dataset.get_qrels('train')
    dev_topics = train_topics[train_topics['qid'].isin(train_qrels['qid'])].sample(args.dev_queries, random_state=args.seed)
    dev_qrels = train_qrels[train_qrels['qid'].isin(dev_topics['qid'])]
    docs = QueryGenerator(generator(), '5w1h', num_queries=5)(scifact_corpus())
    unparsed = int(sum(len(q) == 0 for q in docs['querygen']))
    # a document the LLM gave no parsable query for keeps its title as its one query
    docs['querygen'] = [q if q else [t] for q, t in zip(docs['querygen'], docs['title'])]
    print(f'{len(docs)} documents, {np.mean([len(q) for q in docs["querygen"]]):.2f} generated queries each '
          f'({unparsed} without a parsable one); {len(dev_topics)} dev and {len(test_topics)} test queries')

    encoder = minilm(batch_size=32, verbose=True)
    memo = MemoisedEncoder(encoder)
    dev_qrels_ir = dev_qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})
    chosen, grids = {}, {}
    for method in ('emb', 'txt', 'hyb'):
        grid = grid_search(memo, docs, dev_topics, dev_qrels_ir, method=method, betas=args.betas, seed=args.seed)
        grids[method] = grid.to_dict('records')
        best = grid.iloc[0]
        chosen[method] = {k: float(best[k]) for k in ('alpha', 'beta') if not pd.isna(best[k])}
        print(f'QAE_{method} on dev:\n{grid.to_string(index=False)}', flush=True)

    # how much of the appended queries the encoder sees: MiniLM reads at most its max_seq_length tokens
    tokenizer, limit = encoder.model.tokenizer, encoder.model.max_seq_length
    doc_tokens = np.array([len(ids) for ids in tokenizer(list(docs['text']), add_special_tokens=True)['input_ids']])
    truncation = {'max_seq_length': int(limit), 'documents_longer_than_limit': float(np.mean(doc_tokens >= limit)),
                  'median_document_tokens': float(np.median(doc_tokens))}
    print(truncation)

    systems = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        docs['doc_vec'] = list(memo.encode_docs(list(docs['text'])))
        systems['MiniLM'] = dense_system(encoder, docs, tmp / 'minilm.flex')
        variants = {'QAE_base': QAEncoder(memo, 'base')}
        for method, params in chosen.items():
            label = 'QAE_' + method + ' (' + ', '.join(f'{k}={v:g}' for k, v in params.items()) + ')'
            variants[label] = QAEncoder(memo, method, seed=args.seed, **params)
        for name, qae in variants.items():
            systems[name] = dense_system(encoder, qae(docs.drop(columns=['doc_vec'])), tmp / f'{len(systems)}.flex')
        naive = MultiVectorIndex(tmp / 'naive.mvi')
        naive.indexer().index(QAEncoder(memo, 'naive')(docs.drop(columns=['doc_vec'])).to_dict('records'))
        as_embs = pt.apply.query_embs(lambda row: np.asarray(row['query_vec'], dtype=np.float32)[None])
        systems['QA_naive'] = encoder.query_encoder() >> as_embs >> naive.maxsim_retriever(num_results=100)
        table = run_experiment(systems, test_topics, test_qrels, eval_metrics=MEASURES, baseline=0)

    print(table.to_string(index=False, float_format='%.4f'))
    RESULTS.mkdir(exist_ok=True)
    setup = {'collection': 'SciFact: whole corpus, 300 test queries', 'documents': len(docs),
             'dev_queries': len(dev_topics), 'generator': 'SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised), greedy, '
             '5W1H prompt, 5 queries asked for; generated on an H100 (experiments/generate_queries.py)',
             'mean_generated_queries': float(np.mean([len(q) for q in docs['querygen']])),
             'documents_without_parsable_query': unparsed, 'truncation': truncation, 'chosen': chosen,
             'dev_grids': grids, 'seed': args.seed}
    (RESULTS / 'qaencoder.json').write_text(json.dumps({'setup': setup, 'table': table.to_dict('records')}, indent=1))
    (RESULTS / 'qaencoder.md').write_text(
        f'# QAEncoder on SciFact (all-MiniLM-L6-v2)\n\nAll {len(docs)} documents, '
        f'{setup["mean_generated_queries"]:.2f} 5W1H queries each by SmolLM2-135M-Instruct; alpha and beta chosen '
        f'on {len(dev_topics)} train queries (nDCG@10); 300 test queries; p-values against MiniLM (paired t-test).'
        f'\n\n' + table.to_markdown(index=False, floatfmt='.4f') + '\n')


if __name__ == '__main__':
    main()
