"""The MultiVectorIndex against the field's multi-vector engines on the CPU, at matched recall@10 (issue 32's fourth
item).

    python experiments/bench_peers.py --fast-plaid-python /venv-fp/bin/python --pylate-python /venv-pylate/bin/python
                                      [--workloads clustered-100k clustered-1000k minilm-scifact] [--threads 2]
                                      [--engines index fast-plaid ...] [--repeats 3] [--work-dir /tmp/bench_exact]

Workloads are bench_exact.py's (their indexes and queries are reused from ``--work-dir`` where an earlier run wrote
them): clustered-<n> (n documents of 8 vectors x 128 dims around 2,000 centres, 200 queries of 8 vectors) and
minilm-scifact (MiniLM's token vectors of SciFact's 5,183 abstracts, 384 dims; its 300 test queries' first 8
tokens). The reference top 10 of each query is the index's exact search.

Engines, each in a fresh process per build (experiments/bench_peer_worker.py; fast-plaid and MUVERA in one venv,
PyLate, which pins its own torch and fast-plaid, in another), all on ``--threads`` threads:
- index exact, and index approx: IVF with 8-bit codes (its FAISS build and self-calibration timed), at its
  calibrated default and at the candidate counts 16 to 2,048 (a factor of sqrt(2) apart) at its calibrated search
  effort.
- fast-plaid 1.7: nbits 4 and 8 (nbits 8 alone at a million documents: at 4 its recall stops below 0.95 at 100,000);
  searches over (n_ivf_probe, n_full_scores).
- PyLate 1.6 PLAID (fast-plaid 1.4.6 underneath): nbits 4 and 8, the same searches; not at a million documents.
- PyLate Voyager (HNSW over every vector, M 64, ef_construction 200): k_token 10 to 316 (ef_search 200, or twice
  k_token where that is more: at 100 it stopped at recall 0.986); at 100,000 documents only.
- MUVERA (muvera-python 0.2: 20 repetitions, 5 SimHash bits, AMS sketch to 16 dims, 10,240-dim encodings, an exact
  inner-product search of them, then exact MaxSim of the best 100 to 3,000); not at a million documents (40 GB of
  encodings).
Within a build, every search setting runs once (its top 10 gives recall@10 against the reference), then
``--repeats`` rounds each run every setting once (interleaved); queries/s = queries / median round. A sweep (the
settings naming the same parameters, from the cheapest) stops at its first setting reaching recall@10 0.99, or
slower than a setting of the build that reached it, so "best recall@10" is the highest recall of the settings run. A
peer's sweep is also cut at its first setting whose pass over the queries takes over 10 times as long as the index's
fastest setting reaching 0.99, and over a minute (its settings beyond are slower still): that setting is not timed
further (its QPS is blank), and a recall no timed setting reached reads "not reached (cut by time)": there the index
is more than 10 times as fast. Engines run one after another. "At recall r": the engine's (and build's) fastest
setting whose recall@10 is at least r; "index / peer" divides the index's queries/s at r by the peer's. Build s: the
engine's index from the stored vectors (for the index: its FAISS stage and the calibration; the vectors' own file is
written by every engine's input step alike; index exact's is the opening of the index). Index MiB: the engine's
files (index exact: the stored vectors alone). Build and search peak RSS: the worker process's peak resident memory
(VmHWM, reset before each phase) while it builds and while it searches (all settings of the build), the interpreter,
torch and the pages of memory-mapped files read included; "baseline RSS MiB" is the worker's before its build, with
torch imported, and "build baseline RSS MiB" the process's just before the build (for bench_index.py's index approx:
part 1's process, before its FAISS build; not recorded by builds made before it was).
Writes experiments/results/bench_peers.{md,json,png} after each workload; ``--rows`` writes them from the rows a run
logged (rows.jsonl in its temporary folder), for a run cut short.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch

from bench_exact import workload
from pyterrier_multiquery.experiment.evaluation import write_report

RESULTS = Path(__file__).parent / 'results'
WORKER = Path(__file__).parent / 'bench_peer_worker.py'
K = 10
#: A peer's sweep is cut at its first setting this many times slower than the index's fastest reaching 0.99...
SLOWEST_RATIO = 10
#: ... and slower than this many seconds a pass (at 100k documents every peer setting runs in a few seconds).
SLOWEST_FLOOR_S = 60
CANDIDATES = [16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512, 724, 1024, 1448, 2048]
PLAID_SEARCHES = [{'n_ivf_probe': p, 'n_full_scores': f}
                  for p, f in ((4, 256), (8, 1024), (8, 4096), (16, 4096), (32, 8192), (64, 16384))]
MILLION = 'clustered-1000k'


def plans(name: str) -> list:
    """(python, engine, build, searches) of every build a workload runs; python 'index' is this interpreter."""
    out = [('index', 'index', {'ann': False}, [{'exact': True}]),
           ('index', 'index', {'ann': True}, [{'exact': False}] + [{'exact': False, 'candidates': c}
                                                                  for c in CANDIDATES])]
    for nbits in ((8,) if name == MILLION else (4, 8)):
        out.append(('fast-plaid', 'fast-plaid', {'nbits': nbits}, PLAID_SEARCHES))
    if name != MILLION:
        out += [('pylate', 'pylate-plaid', {'nbits': nbits}, PLAID_SEARCHES) for nbits in (4, 8)]
        out.append(('fast-plaid', 'muvera', {'num_repetitions': 20, 'num_simhash_projections': 5,
                                             'projection_dimension': 16},
                    [{'rescore': n} for n in (100, 300, 1000, 3000)]))
    if name == 'clustered-100k':
        out.append(('pylate', 'pylate-voyager', {'M': 64, 'ef_construction': 200},
                    [{'k_token': k, 'ef_search': max(200, 2 * k)} for k in (10, 32, 100, 316)]))
    return out


def reference_top(index, queries, threads: int) -> dict:
    """Each query's exact top 10 docids (qid q<i>)."""
    frame = index.maxsim_retriever(num_results=K, threads=threads)(
        pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries}))
    frame = frame.sort_values(['qid', 'rank'])
    return {qid: [int(d) for d in group['docid']] for qid, group in frame.groupby('qid')}


def run_build(python: str, job: dict, work: Path) -> list:
    """One worker process: its rows, or one row saying it failed."""
    job_file = work / 'job.json'
    job_file.write_text(json.dumps(job))
    start = time.perf_counter()
    result = subprocess.run([python, str(WORKER), str(job_file)], capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
        return [{'engine': job['engine'], 'build': job['builds'][0]['build'], 'failed': result.stderr[-300:]}]
    print(f"  {job['engine']} {job['builds'][0]['build']}: {time.perf_counter() - start:.0f} s", flush=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def system_name(row: dict) -> str:
    short = {'num_repetitions': 'reps', 'num_simhash_projections': 'bits', 'projection_dimension': 'dims'}
    build = ', '.join(f'{short.get(k, k)}={v}' for k, v in row['build'].items() if k != 'ann')
    name = {'index': 'index exact' if not row['build'].get('ann') else 'index approx'}.get(row['engine'],
                                                                                          row['engine'])
    return f'{name} ({build})' if build else name


def setting_name(row: dict) -> str:
    search = {k: v for k, v in row['search'].items() if k != 'exact'}
    if row['engine'] == 'index' and row['build'].get('ann') and 'candidates' not in search:
        found = row.get('calibrated candidates')
        return f"calibrated ({found} at effort {row['calibrated search effort']})" if found else 'calibrated (exact)'
    return ', '.join(f'{k}={v}' for k, v in search.items())


def run_workload(name: str, args, pythons: dict, work: Path, index_build: Optional[dict] = None) -> list:
    """Every build of the workload whose engine has a Python: their rows (also appended to ``work``/rows.jsonl).

    Args:
        index_build: The index's FAISS stage and calibration, made already (bench_index.py's part 1): their times
            and memory (``ANN build s``, ``calibration s``, ``ANN build peak RSS MiB``, ``ANN build baseline RSS
            MiB``); made anew if None.
    """
    index, queries = workload(name, args.work_dir, args.data_root)
    torch.set_num_threads(args.threads)
    queries_file, reference_file = work / f'{name}.queries.npy', work / f'{name}.reference.json'
    np.save(queries_file, np.stack(queries))
    reference_file.write_text(json.dumps(reference_top(index, queries, args.threads)))
    rows, documents = [], index.payload()[0]['doc_count']
    for python, engine, build, searches in plans(name):
        if python not in pythons or (args.engines and engine not in args.engines):
            continue
        job = {'engine': engine, 'index': str(index.path), 'queries': str(queries_file),
               'reference': str(reference_file), 'work': str(args.work_dir / 'peer-builds' / name),
               'threads': args.threads, 'repeats': args.repeats, 'reuse': args.reuse_builds,
               'index build': index_build, 'slowest s': None if engine == 'index' else slowest(rows),
               'builds': [{'build': build, 'searches': searches}]}
        for row in run_build(pythons[python], job, work):
            row.update(workload=name, documents=documents, queries=len(queries))
            rows.append(row)
            with open(work / 'rows.jsonl', 'a') as log:
                log.write(json.dumps(row) + '\n')
    return rows


def slowest(rows: list) -> Optional[float]:
    """:data:`SLOWEST_RATIO` times the median round of the index's fastest setting reaching recall@10 0.99 among
    ``rows``, or :data:`SLOWEST_FLOOR_S` where that is more (None where the index has no such setting)."""
    rounds = [float(np.median(r['rounds s'])) for r in rows
              if r['engine'] == 'index' and r.get('rounds s') and r['recall@10'] >= 0.99]
    return max(SLOWEST_RATIO * min(rounds), SLOWEST_FLOOR_S) if rounds else None


def tables(rows: list):
    """Every setting's row, and each system's queries/s at matched recall with the index's ratio over it."""
    table = pd.DataFrame([{
        'workload': r['workload'], 'system': system_name(r), 'setting': setting_name(r),
        'QPS': r['queries'] / float(np.median(r['rounds s'])) if r['rounds s'] else np.nan,
        'recall@10': r['recall@10'], 'build s': r['build s'],
        'index MiB': r['index bytes'] / 2 ** 20, 'build peak RSS MiB': r['build peak RSS MiB'],
        'build baseline RSS MiB': r.get('build baseline RSS MiB', np.nan),
        'search peak RSS MiB': r['search peak RSS MiB'], 'baseline RSS MiB': r['baseline RSS MiB'],
        'built at': r.get('built at', 'this run'),
        'cut by time': bool(r.get('cut by time'))}
        for r in rows if 'rounds s' in r])
    matched = []
    for (name, system), group in table.groupby(['workload', 'system'], sort=False):
        entry = {'workload': name, 'system': system, 'best recall@10': group['recall@10'].max(),
                 'build s': group['build s'].iloc[0], 'index MiB': group['index MiB'].iloc[0],
                 'build peak RSS MiB': group['build peak RSS MiB'].iloc[0],
                 'build baseline RSS MiB': group['build baseline RSS MiB'].iloc[0],
                 'search peak RSS MiB': group['search peak RSS MiB'].iloc[0],
                 'baseline RSS MiB': group['baseline RSS MiB'].iloc[0], 'built at': group['built at'].iloc[0]}
        for target in (0.95, 0.99):
            reached = group[(group['recall@10'] >= target) & group['QPS'].notna()]
            entry[f'QPS at {target}'] = reached['QPS'].max() if len(reached) else np.nan
            entry[f'setting at {target}'] = reached.loc[reached['QPS'].idxmax(), 'setting'] if len(reached) else \
                'not reached (cut by time)' if group['cut by time'].any() else 'not reached'
        matched.append(entry)
    matched = pd.DataFrame(matched)
    for target in (0.95, 0.99):
        ours = matched[matched['system'] == 'index approx'].set_index('workload')[f'QPS at {target}']
        matched[f'index / peer at {target}'] = matched['workload'].map(ours) / matched[f'QPS at {target}']
    return table, matched


def plot(table: pd.DataFrame, out: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(table['workload']))
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        for system, group in table[table['workload'] == name].groupby('system', sort=False):
            group = group.sort_values('recall@10')
            ax.plot(group['recall@10'], group['QPS'], marker='o', markersize=3, label=system)
        for target in (0.95, 0.99):
            ax.axvline(target, color='grey', linestyle=':')
        ax.set_yscale('log')
        ax.set_xlabel('recall@10 against exact search')
        ax.set_ylabel('queries/s')
        ax.set_title(name)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out.with_suffix('.png'), dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--workloads', nargs='+', default=['clustered-100k', MILLION, 'minilm-scifact'])
    parser.add_argument('--fast-plaid-python', help='a Python with fast-plaid 1.7 and muvera-python')
    parser.add_argument('--pylate-python', help='a Python with PyLate 1.6 and voyager 2.0.9 (2.2 refuses the list '
                        "of rows PyLate's Voyager index adds)")
    parser.add_argument('--engines', nargs='+', help='only these engines (default: all whose Python is given)')
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--work-dir', type=Path, default=Path('/tmp/bench_exact'))
    parser.add_argument('--data-root', type=Path, default=Path(__file__).parents[1] / '..' / 'shared' / 'data')
    parser.add_argument('--reuse-builds', action='store_true',
                        help="reopen a peer's earlier build of the same vectors, version, parameters and threads (from "
                        '--work-dir/peer-builds; its build time and memory are those recorded when it was built)')
    parser.add_argument('--out', type=Path, default=RESULTS / 'bench_peers')
    parser.add_argument('--rows', type=Path, help='only write the report of the rows a run logged (its rows.jsonl)')
    args = parser.parse_args()
    started = time.perf_counter()
    if args.rows:
        report([json.loads(line) for line in args.rows.read_text().splitlines()], args, started)
        return
    pythons = {'index': sys.executable, 'fast-plaid': args.fast_plaid_python, 'pylate': args.pylate_python}
    pythons = {key: value for key, value in pythons.items() if value}
    args.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        rows = []
        for name in args.workloads:
            print(name, flush=True)
            rows += run_workload(name, args, pythons, Path(work))
            report(rows, args, started)  # after each workload: a run cut short keeps the finished ones
    print(args.out.with_suffix('.md').read_text())


def report(rows: list, args, started: float) -> None:
    """Writes the tables and the plot of ``rows`` to ``args.out`` (.md, .json, .png)."""
    table, matched = tables(rows)
    cpu = next((line.split(':', 1)[1].strip() for line in Path('/proc/cpuinfo').read_text().splitlines()
                if line.startswith('model name')), platform.processor())
    failed = [f"{r['engine']} {r['build']} on {r['workload']}: {r['failed']}" for r in rows if 'failed' in r]
    text = (f'Machine: {os.cpu_count()} CPUs ({cpu}), {args.threads} threads, load average {os.getloadavg()[0]:.2f} '
            f'at the end; torch {torch.__version__} (the index). ' + (
                f'Written from the rows a run logged ({args.rows}). ' if args.rows else
                f'Written {time.perf_counter() - started:.0f} s after the run started. ') +
            f'Command: `python experiments/bench_peers.py {" ".join(sys.argv[1:])}`.'
            + (f'\n\nFailed builds: {"; ".join(failed)}' if failed else '') + '\n\n' + __doc__.split('\n\n', 2)[2])
    write_report(args.out, "The index against the field's multi-vector engines at matched recall", text,
                 {'At matched recall@10': matched, 'Every setting': table}, floatfmt='.4g',
                 extra={'rows': rows})
    plot(table, args.out)


if __name__ == '__main__':
    main()
