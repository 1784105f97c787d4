"""MiniLM >> MMR on RAMDocs across MMR's Lambda, as a table and a plot (Lambda = 1 is plain MiniLM).

    python experiments/mmr_lambda.py [--dataset ramdocs] [--depth 500]

Every question, MiniLM's top ``--depth`` re-ranked by MMR (cosine similarities). Writes
``experiments/results/mmr_lambda.{md,json,csv,png}``.
"""
from pathlib import Path

from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.experiment.evaluation import experiment_parser, line_figure, run_experiment, write_report
from pyterrier_multiquery.loaders import load_dataset

LAMBDAS = [0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0]
RESULTS = Path(__file__).parent / 'results'


def main():
    parser = experiment_parser(__doc__, RESULTS / 'mmr_lambda')
    parser.add_argument('--dataset', default='ramdocs', help='collection under --data-root')
    parser.add_argument('--depth', type=int, default=500, help='MiniLM results MMR re-ranks')
    args = parser.parse_args()
    spec = str(args.data_root / args.dataset)
    dataset = load_dataset(spec)
    first_stage = systems.DenseFirstStage(dataset, systems.cache_dir_for(spec, args.cache_dir))
    table = run_experiment({f'{lam}': systems.mmr_system(first_stage, lam, depth=args.depth) for lam in LAMBDAS},
                           dataset.get_topics(), dataset.get_qrels(), precompute_prefix=True)
    table = table.rename(columns={'name': 'Lambda'})
    long = table.melt(id_vars='Lambda', var_name='measure').astype({'Lambda': float})
    write_report(args.out, f'MiniLM >> MMR on {args.dataset} across Lambda',
                 f'All {len(dataset.get_topics())} questions; MiniLM\'s top {args.depth} re-ranked by MMR with '
                 'relevance weight Lambda (1 = MiniLM alone). Command: `python experiments/mmr_lambda.py`.',
                 {'Mean over the questions': table}, csv=True,
                 figure=line_figure(long, 'Lambda', 'value', line='measure', ylabel='score', size=(6, 4)))
    print(Path(args.out).with_suffix('.md').read_text())


if __name__ == '__main__':
    main()
