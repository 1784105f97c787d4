"""The main job over training seeds: the point each seed's training chose and the spread of the test figures.

    python experiments/seeds.py [--seeds 0 1 2] [--cache-dir DIR]

Runs the main job (``python -m pyterrier_multiquery``, RAMDocs, fixed split) once per seed, each from the same cache
folder, so that the indexes are built once and each seed trains its own MiniLM-FT, and AMER and JPR over MiniLM and
over MiniLM-FT (a cached model is keyed by its seed). The schedule is fixed in advance (no epoch or merge is chosen
on data); what a seed's training chooses is each refiner's departure weight from its first stage, on a fifth of the
training questions. Reports, per system, each seed's MRecall@5/@10 and their mean and standard deviation, each
seed's paired t-test of MRecall@10 against MiniLM-FT, and per seed the chosen weights. Writes
``experiments/results/seeds.{md,json,csv,png}``. Each finished seed's table and weights are stored as it goes
(``seeds_runs.csv``, ``seeds_weights.csv``, under the fingerprint of the main job's code), so a stopped run goes on
from the next seed (``--restart`` forgets them; ``--report-only`` reports what is stored).
"""
import json
from pathlib import Path

import pandas as pd

from pyterrier_multiquery.experiment.cache import code_fingerprint
from pyterrier_multiquery.experiment.evaluation import experiment_parser, write_report
from pyterrier_multiquery.experiment.main import main as main_job
from pyterrier_multiquery.experiment.parts import StoredParts

RESULTS = Path(__file__).parent / 'results'
MEASURES = ['MRecall@5', 'MRecall@10']


def chosen_weights(cache_dir: Path, seed: int) -> dict:
    """The departure weights the seed's AMER and JPR trainings chose, read from the training records of their cache
    entries, by method and first stage (``AMER over minilm``, ``JPR over single-vector``: MiniLM-FT)."""
    chosen = {}
    for kind in ('amer', 'jpr'):
        for manifest in sorted(cache_dir.glob(f'{kind}-*/manifest.json')):
            key = json.loads(manifest.read_text())['key']
            if key['settings'].get('seed') == seed and key['settings'].get('departure') == 'one_se':
                training = json.loads((manifest.parent / 'artifact' / 'training.json').read_text())
                chosen[f'{kind.upper()} over {training["first_stage"]}'] = training['history']['departure']
    return dict(sorted(chosen.items()))   # the cache's entry names are hashes: order the columns by name


def figure(runs: pd.DataFrame):
    """Each system's MRecall@10 per seed (points) and the mean (bar)."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(dict.fromkeys(runs['system']))
    means = runs.groupby('system', sort=False)['MRecall@10'].mean()
    ax.bar(range(len(names)), [means[n] for n in names], color='lightgrey')
    for i, name in enumerate(names):
        values = runs.loc[runs['system'] == name, 'MRecall@10']
        ax.scatter([i] * len(values), values, color='tab:blue', zorder=3, s=12)
    ax.set_xticks(range(len(names)), names, rotation=30, ha='right', fontsize=8)
    ax.set_ylim(max(0., runs['MRecall@10'].min() - .05), min(1., runs['MRecall@10'].max() + .02))
    ax.set_ylabel('MRecall@10 (RAMDocs test split)')
    ax.set_title('Main job over training seeds (bars: mean; points: seeds)', fontsize=10)
    fig.tight_layout()
    return fig


def run_seed(parts: StoredParts, seed: int, args) -> None:
    """Runs the main job with ``seed`` and stores its table and the weights its training chose."""
    out = args.out.with_name(f'{args.out.name}_seed{seed}.csv')
    status = main_job(['--data-root', str(args.data_root), '--cache-dir', str(args.cache_dir), '--seed', str(seed),
                       '--save', str(out)])
    if status != 0:
        raise SystemExit(f'the main job with seed {seed} exited with status {status}')
    table = pd.read_csv(out)
    out.unlink()
    tests = [f'{m} p-value vs MiniLM-FT' for m in MEASURES if f'{m} p-value vs MiniLM-FT' in table.columns]
    parts.add(runs=table[['name'] + MEASURES + tests].rename(columns={'name': 'system'}).assign(seed=seed),
              weights=pd.DataFrame([{'seed': seed, **chosen_weights(Path(args.cache_dir), seed)}]))


def main():
    parser = experiment_parser(__doc__.splitlines()[0], RESULTS / 'seeds')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--restart', action='store_true', help='forget the seeds stored by an earlier run')
    parser.add_argument('--report-only', action='store_true', help='write the report of the stored seeds only')
    args = parser.parse_args()
    code = {'code': code_fingerprint('pyterrier_multiquery.experiment.main')}
    parts = StoredParts(args.out, ('runs', 'weights'), None if args.report_only else code, restart=args.restart)
    if not args.report_only:
        for seed in args.seeds:
            if not parts.done('weights', seed=seed):   # a seed's weights are stored after its table
                run_seed(parts, seed, args)
    runs, weights = parts.frames['runs'], parts.frames['weights']
    if runs.empty:
        raise SystemExit(f'no stored seeds in {parts.paths["runs"]}')
    runs = runs[runs['seed'].isin(args.seeds)].copy()
    weights = weights[weights['seed'].isin(args.seeds)].reset_index(drop=True)
    runs['system'] = runs['system'].str.replace(r'\(λ=[0-9.]+\)', '', regex=True)   # MMR's lambda may differ
    spread = runs.groupby('system', sort=False)[MEASURES].agg(['mean', 'std'])
    spread.columns = [f'{m} {s}' for m, s in spread.columns]
    per_seed = runs.pivot(index='system', columns='seed', values='MRecall@10').add_prefix('MRecall@10 seed ')
    table = spread.join(per_seed)
    if 'MRecall@10 p-value vs MiniLM-FT' in runs.columns:   # each seed's paired t-test against MiniLM-FT
        table = table.join(runs.pivot(index='system', columns='seed', values='MRecall@10 p-value vs MiniLM-FT')
                           .add_prefix('MRecall@10 p vs MiniLM-FT, seed '))
    table = table.reset_index()
    write_report(args.out, 'The main job over training seeds', __doc__.split('\n\n', 2)[2],
                 {'Test figures over seeds (mean, standard deviation)': table,
                  'Departure weights chosen by each seed': weights},
                 extra={'seeds': sorted(runs['seed'].unique().tolist()), **(parts.settings or {})},
                 figure=figure(runs), csv=True)
    print(table.to_string(index=False, float_format='%.4f'))
    print(weights.to_string(index=False))


if __name__ == '__main__':
    main()
