"""The MultiVectorIndex's benchmark in one run (issue 32): exact MaxSim against a blocked einsum reference and the
machine's matmul peak, the approximate search at its self-calibrated defaults, and the field's engines at matched
recall@10.

    python experiments/bench_index.py --fast-plaid-python /venv-fp/bin/python --pylate-python /venv-pylate/bin/python
                                      [--reuse-builds] [--workloads ...] [--peer-workloads ...] [--engines ...]
                                      [--threads 2] [--repeats 3] [--work-dir /tmp/bench_exact] [--data-root DIR]

The peers run in two venvs of their own (torch 2.11, which both pin: a CUDA build, run on the CPU; about 5 GB each):

    python -m venv /venv-fp && /venv-fp/bin/pip install fast-plaid==1.7.0.2110 muvera-python==0.2.0 torch==2.11.0
    python -m venv /venv-pylate && /venv-pylate/bin/pip install pylate==1.6.0 voyager==2.0.9 torch==2.11.0

Two parts, one after the other, on the same threads (each workload's index and queries are written to
``--work-dir`` by the first run and reused by later ones):
1. Every workload of ``--workloads`` (experiments/bench_exact.py): index exact against the einsum reference, and the
   approximate search at its calibrated defaults, interleaved; its FAISS build and self-test are timed, with the
   process's peak memory while they run. The float32 matmul peak is measured before and after the part.
2. Every workload of ``--peer-workloads`` (experiments/bench_peers.py): index exact, index approx at its calibrated
   default and at candidate counts 16 to 2,048 at its calibrated search effort (the FAISS stage and calibration of
   part 1, with part 1's times and memory), fast-plaid, PyLate's PLAID and Voyager and MUVERA, each at a small sweep
   of its settings in its own process and venv. With ``--reuse-builds`` a peer's earlier build of the same vectors,
   version, parameters and threads is reopened: its build time and memory are those recorded when it was built, and
   the table says when.

The headline table gives each workload's ratios: index exact over the einsum reference, the share of the matmul peak
(the higher of the two measurements), the approximate search over exact with its recall@10, and (on the peer
workloads) the index's queries/s at recall@10 0.95 and 0.99 over the fastest peer's at that recall. The parts'
own descriptions follow the tables. Writes experiments/results/bench_index.{md,json} after each workload of either
part (a run cut short names the workloads it lacks), bench_index_exact.png (GFLOP/s and approximate speed-ups) and
bench_index_peers.png (queries/s against recall@10).
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import bench_exact
import bench_peers
from pyterrier_multiquery.experiment.evaluation import write_report
from pyterrier_multiquery.index.exact import screening_dtype

RESULTS = Path(__file__).parent / 'results'
WORKLOADS = ['clustered-20k', 'ragged-20k', 'dim96-20k', 'clustered-100k', 'clustered-1000k', 'minilm-scifact']
PEER_WORKLOADS = ['clustered-100k', 'clustered-1000k', 'minilm-scifact']
TARGETS = (0.95, 0.99)


def fastest_peers(matched: pd.DataFrame, target: float) -> dict:
    """Per workload where peers ran: (the fastest peer at recall@10 ``target`` and its queries/s, or 'none reaches
    it' (saying where a sweep was cut by time, so the index is more than ``SLOWEST_RATIO`` times as fast as that
    peer there), and the index's queries/s at ``target`` over that peer's)."""
    out = {}
    column = f'QPS at {target}'
    for name, group in matched.groupby('workload', sort=False):
        peers = group[~group['system'].str.startswith('index')]
        ours = group.loc[group['system'] == 'index approx', column]
        if not len(peers) or not len(ours):
            continue
        reached = peers.dropna(subset=[column])
        if not len(reached):
            cut = peers[f'setting at {target}'].str.contains('cut by time').any()
            out[name] = ('none reaches it' + (f' (a sweep cut by time: index over {bench_peers.SLOWEST_RATIO}x)'
                                              if cut else ''), np.nan)
            continue
        fastest = reached.loc[reached[column].idxmax()]
        out[name] = (f"{fastest['system']}: {fastest[column]:.0f} q/s", ours.iloc[0] / fastest[column])
    return out


def headline(exact: pd.DataFrame, peak: float, matched: pd.DataFrame) -> pd.DataFrame:
    """Each workload's ratios: part 1's, and the index over the fastest peer at each matched recall."""
    table = exact[['workload', 'documents', 'index / einsum']].copy()
    table['index % of fp32 peak'] = 100 * exact['index exact GFLOP/s'] / peak
    table['approx candidates'] = exact['approx candidates']
    table['approx / exact'] = exact['approx / index exact']
    table['approx recall@10'] = exact['recall@10 approx vs exact']
    for target in TARGETS:
        peers = fastest_peers(matched, target)
        table[f'fastest peer at {target}'] = [peers.get(w, ('', np.nan))[0] for w in table['workload']]
        table[f'index / fastest peer at {target}'] = [peers.get(w, ('', np.nan))[1] for w in table['workload']]
    return table


def report(args, exact_rows: list, peaks: list, peer_rows: list, started: float) -> None:
    """Writes the tables and plots of what the run has measured so far to ``args.out``."""
    exact = pd.DataFrame(exact_rows)
    peak = max(peaks)  # the higher peak: the lower, safer share
    exact.insert(exact.columns.get_loc('recall@10 index vs einsum'), 'index % of fp32 peak',
                 100 * exact['index exact GFLOP/s'] / peak)
    settings, matched = bench_peers.tables(peer_rows) if any('rounds s' in r for r in peer_rows) else \
        (pd.DataFrame(), pd.DataFrame(columns=['workload', 'system']))
    done_exact, done_peers = list(exact['workload']), list(dict.fromkeys(r['workload'] for r in peer_rows))
    missing = [f'{w} (part 1)' for w in args.workloads if w not in done_exact] + \
        [f'{w} (part 2)' for w in args.peer_workloads if w not in done_peers]
    cpu = bench_exact.cpu_name()
    failed = [f"{r['engine']} {r['build']} on {r['workload']}: {r['failed'].strip().splitlines()[-1]}"
              for r in peer_rows if 'failed' in r]
    text = (f'Machine: {os.cpu_count()} CPUs ({cpu}), {args.threads} threads, load average {os.getloadavg()[0]:.2f} '
            f'when written; torch {torch.__version__} (the index), screened in {screening_dtype("cpu")}. float32 '
            f'matmul peak: {" and ".join(f"{p:.0f}" for p in peaks)} GFLOP/s (before part 1'
            f'{" and after it" if len(peaks) > 1 else ""}). '
            f'Written {time.perf_counter() - started:.0f} s after the run started. Command: '
            f'`python experiments/bench_index.py {" ".join(sys.argv[1:])}`.'
            + (f'\n\n**Incomplete run**: not yet measured: {", ".join(missing)}.' if missing else '')
            + (f'\n\nFailed builds: {"; ".join(failed)}.' if failed else '')
            + '\n\n' + __doc__.split('\n\n', 2)[2]
            + '\n\nPart 1, from experiments/bench_exact.py:\n\n' + bench_exact.__doc__.split('\n\n', 2)[2]
            + '\n\nPart 2, from experiments/bench_peers.py:\n\n' + bench_peers.__doc__.split('\n\n', 2)[2])
    tables = {'Headline ratios': headline(exact, peak, matched) if len(exact) else pd.DataFrame(),
              'Part 1: exact and calibrated approximate search': exact.drop(columns='rounds s', errors='ignore'),
              'Part 2: at matched recall@10': matched, 'Part 2: every setting': settings}
    write_report(args.out, 'The multi-vector index against einsum, the matmul peak and the field, in one run', text,
                 tables, floatfmt='.4g', extra={'peaks GFLOP/s': peaks, 'exact rows': exact_rows,
                                                'peer rows': peer_rows})
    if len(exact):
        bench_exact.plot(exact, peaks, args.out.with_name(args.out.name + '_exact'))
    if len(settings):
        bench_peers.plot(settings, args.out.with_name(args.out.name + '_peers'))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--workloads', nargs='+', default=WORKLOADS,
                        help='part 1 (workload names as experiments/bench_exact.py)')
    parser.add_argument('--peer-workloads', nargs='+', default=PEER_WORKLOADS, help='part 2')
    parser.add_argument('--fast-plaid-python', help='a Python with fast-plaid 1.7 and muvera-python 0.2')
    parser.add_argument('--pylate-python', help='a Python with PyLate 1.6 and voyager 2.0.9 (2.2 refuses the list '
                        "of rows PyLate's Voyager index adds)")
    parser.add_argument('--engines', nargs='+', help='part 2: only these engines (default: all whose Python is given)')
    parser.add_argument('--reuse-builds', action='store_true',
                        help="part 2: reopen a peer's earlier build of the same vectors, version, parameters and "
                        'threads (in --work-dir/peer-builds; its build time and memory are those recorded then)')
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--work-dir', type=Path, default=Path('/tmp/bench_exact'))
    parser.add_argument('--data-root', type=Path, default=Path(__file__).parents[1] / '..' / 'shared' / 'data')
    parser.add_argument('--out', type=Path, default=RESULTS / 'bench_index')
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    pythons = {'index': sys.executable, 'fast-plaid': args.fast_plaid_python, 'pylate': args.pylate_python}
    pythons = {key: value for key, value in pythons.items() if value}
    started = time.perf_counter()
    peaks, exact_rows, peer_rows = [bench_exact.matmul_peak(args.threads)], [], []
    for name in args.workloads:
        print(f'part 1: {name}', flush=True)
        exact_rows.append(bench_exact.run_workload(name, args, args.work_dir))
        report(args, exact_rows, peaks, peer_rows, started)
    peaks.append(bench_exact.matmul_peak(args.threads))
    made = {row['workload']: {key: row[key] for key in ('ANN build s', 'calibration s', 'ANN build peak RSS MiB',
                                                        'ANN build baseline RSS MiB')} for row in exact_rows}
    with tempfile.TemporaryDirectory() as work:
        for name in args.peer_workloads:
            print(f'part 2: {name}', flush=True)
            peer_rows += bench_peers.run_workload(name, args, pythons, Path(work), index_build=made.get(name))
            report(args, exact_rows, peaks, peer_rows, started)
    print(args.out.with_suffix('.md').read_text())


if __name__ == '__main__':
    main()
