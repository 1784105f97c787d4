"""MiniLM >> MMR on RAMDocs across MMR's Lambda, as a table and a plot.

    python experiments/mmr_lambda.py [--dataset ../shared/data/ramdocs] [--cache-dir ~/.cache/pyterrier_multiquery]

Writes experiments/results/mmr_lambda.csv and mmr_lambda.png. Lambda = 1 is plain MiniLM.
"""
import argparse
from pathlib import Path

import matplotlib
import pandas as pd

from pyterrier_multiquery.baselines import MMR, flex_index, minilm
from pyterrier_multiquery.loaders import load_dataset
from pyterrier_multiquery.experiment import DEFAULT_MEASURES, cache_dir_for, default_data_dir, run_experiment

LAMBDAS = [0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0]
RESULTS = Path(__file__).parent / 'results'


def main():
    data_dir = default_data_dir()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dataset', default=str(data_dir / 'ramdocs') if data_dir else None)
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'))
    parser.add_argument('--depth', type=int, default=500)
    args = parser.parse_args()
    if args.dataset is None:
        parser.error('no shared data folder found: give --dataset')

    dataset = load_dataset(args.dataset)
    encoder = minilm()
    index = flex_index(cache_dir_for(args.dataset, args.cache_dir) / 'minilm.flex', encoder, dataset.get_corpus_iter)
    candidates = encoder >> index.retriever(num_results=args.depth) >> index.vec_loader()
    systems = {f'{lam}': candidates >> MMR(lam, depth=args.depth) for lam in LAMBDAS}
    table = run_experiment(systems, dataset.get_topics(), dataset.get_qrels(), precompute_prefix=True)
    table = table.rename(columns={'name': 'Lambda'})
    print(table.to_string(index=False, float_format='%.4f'))
    RESULTS.mkdir(exist_ok=True)
    table.to_csv(RESULTS / 'mmr_lambda.csv', index=False)

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for measure in (str(m) for m in DEFAULT_MEASURES):
        ax.plot(pd.to_numeric(table['Lambda']), table[measure], marker='o', label=measure)
    ax.set_xlabel('MMR Lambda (1 = relevance only)')
    ax.set_ylabel('score')
    ax.set_title(f'MiniLM >> MMR on {Path(args.dataset).name}')
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / 'mmr_lambda.png', dpi=120)


if __name__ == '__main__':
    main()
