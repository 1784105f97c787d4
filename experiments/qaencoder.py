"""QAEncoder on SciFact with all-MiniLM-L6-v2: MiniLM against QAE_base/emb/txt/hyb and QA_naive, alpha and beta
chosen on a dev split.

    python experiments/qaencoder.py [--dev-queries 100] [--queries experiments/cache/querygen.sqlite]

The whole SciFact corpus (5,183 documents), each with the 5W1H queries SmolLM2-135M-Instruct wrote for it
(five asked for, greedy), read from the query cache that ``experiments/generate_queries.py`` fills (on a GPU).
Dev queries are a fixed sample of SciFact's train queries; the table is on the 300 test queries, with paired
t-tests against MiniLM. Writes ``experiments/results/qaencoder.{md,json}``.
"""
import tempfile
from pathlib import Path

import numpy as np
from ir_measures import RR, nDCG

from pyterrier_multiquery import minilm
from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.experiment.evaluation import experiment_parser, judged_sample, run_experiment, write_report
from pyterrier_multiquery.generation import QueryGenerator
from pyterrier_multiquery.loaders import load_dataset

RESULTS = Path(__file__).parent / 'results'
QUERIES = Path(__file__).parent / 'cache' / 'querygen.sqlite'
MEASURES = [RR @ 10, nDCG @ 10]


def main():
    parser = experiment_parser(__doc__, RESULTS / 'qaencoder', cache=False)
    parser.add_argument('--queries', type=Path, default=QUERIES, help='the query cache (generate_queries.py)')
    parser.add_argument('--dev-queries', type=int, default=100)
    parser.add_argument('--betas', type=float, nargs='+', default=[0.5, 1.0, 2.0])
    args = parser.parse_args()
    dataset = load_dataset(str(args.data_root / 'scifact'))
    dev_topics, dev_qrels = judged_sample(dataset.get_topics('train'), dataset.get_qrels('train'), args.dev_queries,
                                          seed=args.seed)
    docs = QueryGenerator(systems.query_generator(args.queries), '5w1h', num_queries=5)(
        systems.generation_corpus(dataset))
    unparsed = int(sum(len(q) == 0 for q in docs['querygen']))
    # a document the LLM gave no parsable query for keeps its title as its one query
    docs['querygen'] = [q if q else [t] for q, t in zip(docs['querygen'], docs['title'])]
    encoder = systems.memoised(minilm(batch_size=32, verbose=True))
    tuned = systems.tune_qaencoder(encoder, docs, dev_topics, dev_qrels, betas=args.betas, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        table = run_experiment(systems.qaencoder_systems(encoder, docs, tmp, tuned['chosen'], seed=args.seed,
                                                         num_results=100),
                               dataset.get_topics('test'), dataset.get_qrels('test'), eval_metrics=MEASURES,
                               baseline=0)
    setup = {'documents': len(docs), 'mean_generated_queries': float(np.mean([len(q) for q in docs['querygen']])),
             'documents_without_parsable_query': unparsed, 'truncation': truncation(encoder.encoder, docs['text']),
             'chosen': tuned['chosen'], 'dev_queries': len(dev_topics), 'seed': args.seed}
    write_report(
        args.out, 'QAEncoder on SciFact (all-MiniLM-L6-v2)',
        f'All {len(docs)} documents, {setup["mean_generated_queries"]:.2f} 5W1H queries each by SmolLM2-135M-Instruct '
        f'(Q4_1 GGUF, dequantised, greedy, 5 asked for; {unparsed} documents without a parsable one keep their title); '
        f'alpha and beta chosen on {len(dev_topics)} train queries (nDCG@10); {len(dataset.get_topics("test"))} test '
        f'queries; p-values against MiniLM (paired t-test). MiniLM reads at most '
        f'{setup["truncation"]["max_seq_length"]} tokens: {setup["truncation"]["documents_longer_than_limit"]:.0%} of '
        f'the documents are longer. Command: `python experiments/qaencoder.py`.',
        {'SciFact test': table, **{f'Dev grid: QAE_{m}': grid for m, grid in tuned['grids'].items()}},
        extra={'setup': setup})
    print(Path(args.out).with_suffix('.md').read_text())


def truncation(encoder, texts) -> dict:
    """How much of the documents (and so of the queries QAE_txt appends) MiniLM reads: its token limit, the share of
    documents at or over it and the median document length in tokens."""
    limit = encoder.model.max_seq_length
    lengths = np.array([len(ids) for ids in encoder.model.tokenizer(list(texts), add_special_tokens=True)['input_ids']])
    return {'max_seq_length': int(limit), 'documents_longer_than_limit': float(np.mean(lengths >= limit)),
            'median_document_tokens': float(np.median(lengths))}


if __name__ == '__main__':
    main()
