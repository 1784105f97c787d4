"""Reproduces all-MiniLM-L6-v2 on SciFact test through the project's loader and pipeline.

Reference: nDCG@10 = 0.645 (BEIR's published figure, and the figure measured on ../shared/data).

    python experiments/reference_scifact.py [--data ../shared/data/scifact] [--cache-dir experiments/cache]
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

from ir_measures import R, nDCG

from pyterrier_multiquery.baselines import flex_index, minilm
from pyterrier_multiquery.loaders import BeirDataset
from pyterrier_multiquery.experiment import default_data_dir, run_experiment

REFERENCE_NDCG10 = 0.645
TOLERANCE = 0.005


def main():
    data_dir = default_data_dir()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--data', default=str(data_dir / 'scifact') if data_dir else None, help='BEIR SciFact directory')
    parser.add_argument('--cache-dir', help='keep the index here (default: a temporary folder, so encoding is timed)')
    parser.add_argument('--out', default=str(Path(__file__).parent / 'results' / 'reference_scifact.json'))
    args = parser.parse_args()
    if args.data is None:
        parser.error('no shared data folder found: give --data')

    dataset = BeirDataset(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        encoder = minilm()
        index = flex_index(Path(args.cache_dir or tmp) / 'scifact-minilm.flex', encoder, lambda: dataset.get_corpus_iter())
        indexed = time.perf_counter()
        table = run_experiment({'all-MiniLM-L6-v2': encoder >> index.retriever(num_results=1000)},
                               dataset.get_topics('test'), dataset.get_qrels('test'), eval_metrics=[nDCG@10, R@100])
        done = time.perf_counter()

    ndcg10 = float(table['nDCG@10'].iloc[0])
    result = {
        'nDCG@10': ndcg10, 'R@100': float(table['R@100'].iloc[0]),
        'reference_nDCG@10': REFERENCE_NDCG10, 'within_tolerance': abs(ndcg10 - REFERENCE_NDCG10) <= TOLERANCE,
        'index_seconds': round(indexed - start, 1), 'retrieve_evaluate_seconds': round(done - indexed, 1),
    }
    print(table.to_string(index=False, float_format='%.4f'))
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + '\n')
    if not result['within_tolerance']:
        raise SystemExit(f'nDCG@10 {ndcg10:.4f} is not within {TOLERANCE} of {REFERENCE_NDCG10}')


if __name__ == '__main__':
    main()
