"""The index's CPU search times at two commits, on the same machine, interleaved: has a change made it slower?

    python experiments/bench_commits.py OLD_CHECKOUT NEW_CHECKOUT [--workloads clustered-20k ragged-20k dim96-20k
        clustered-100k] [--rounds 8] [--repeats 3] [--threads 2] [--work-dir DIR] [--out experiments/results/NAME]

Each checkout (a folder, e.g. from ``git worktree add /tmp/old REV``) builds its own index of the same documents (the
workloads of bench_exact.py, generated once here and saved as arrays) with its own code, and its own IVF stage. A round
runs, for each workload, one process of each checkout in turn (the order alternating from round to round), each
importing the package from its checkout: a warm-up search, then ``--repeats`` timed searches of each system, their
order rotated, and its median. Systems, on ``--threads`` threads, a frame of the workload's 200 queries, top 10:
``exact`` (``maxsim_retriever``) and ``approximate`` (IVF, 8-bit codes, 256 candidates, search effort 32 fixed, so
that both commits search alike whatever their calibration would choose; ``maxsim_retriever(exact=False)`` before the
``ann_retriever`` split).

The report gives per workload and system each checkout's median of its processes' medians, the ratio new / old of
each round's pair (its median and range; the geometric mean with its 95 % t-interval on the log ratios), a two-sided
Wilcoxon signed-rank p of the pairs, and whether the two checkouts returned the same rankings (exact: docnos and
scores; approximate: recall@10 of each against exact).
Writes ``OUT.md`` and ``OUT.json``.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

K = 10
WORKLOADS = ['clustered-20k', 'ragged-20k', 'dim96-20k', 'clustered-100k']
APPROXIMATE = dict(candidates=256, search_effort=32)
SYSTEMS = ('exact', 'approximate')
COLUMNS = ['workload', 'system', 'old median s', 'new median s', 'new / old (median of rounds)', 'range',
           'geometric mean, 95 % CI', 'Wilcoxon p', 'same exact rankings and scores', 'recall@10 vs exact (old, new)']


def arrays(name: str, work: Path) -> Path:
    """The workload's documents (vectors, lengths) and queries as arrays in ``work``, generated once (into a
    temporary folder renamed when complete)."""
    folder = work / 'arrays' / name
    if not folder.exists():
        # here, not at the top: a worker imports an older checkout's package
        from bench_exact import synthetic
        from pyterrier_multiquery._files import building
        docs, queries = synthetic(name)
        vectors = [d['doc_embs'] for d in docs]
        with building(folder) as tmp:
            tmp.mkdir()
            np.save(tmp / 'lengths.npy', np.array([len(v) for v in vectors]))
            np.save(tmp / 'vectors.npy', np.concatenate(vectors))
            np.save(tmp / 'queries.npy', np.stack(queries))
    return folder


def worker(checkout: Path, folder: Path, index_path: Path, threads: int, repeats: int) -> dict:
    """In a checkout's process: its index of the arrays (built once), each system's warm-up and timed searches.

    Raises:
        RuntimeError: If the package this process imports is not the checkout's.
    """
    import pyterrier_multiquery
    if not Path(pyterrier_multiquery.__file__).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f'the package was imported from {pyterrier_multiquery.__file__}, not from the checkout '
                           f'{str(checkout)!r} (is it a checkout of pyterrier_multiquery?)')
    import pandas as pd
    import torch

    from pyterrier_multiquery.index import MultiVectorIndex
    torch.set_num_threads(threads)
    index = MultiVectorIndex(index_path, verbose=False)
    if not index.built():
        vectors, lengths = np.load(folder / 'vectors.npy'), np.load(folder / 'lengths.npy')
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        index.indexer(overwrite=True).index({'docno': f'd{i}', 'doc_embs': vectors[a:b]}
                                            for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])))
    queries = np.load(folder / 'queries.npy')
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': list(queries)})
    approximate = (index.ann_retriever(num_results=K, threads=threads, **APPROXIMATE) if hasattr(index, 'ann_retriever')
                   else index.maxsim_retriever(num_results=K, threads=threads, exact=False, **APPROXIMATE))
    systems = {'exact': index.maxsim_retriever(num_results=K, threads=threads), 'approximate': approximate}
    found = {key: system(topics) for key, system in systems.items()}   # the warm-up (the IVF stage built or loaded)
    seconds = {key: [] for key in systems}
    for repeat in range(repeats):
        for key in SYSTEMS[repeat % 2:] + SYSTEMS[:repeat % 2]:
            start = time.perf_counter()
            systems[key](topics)
            seconds[key].append(time.perf_counter() - start)
    exact = found['exact'].sort_values(['qid', 'rank'])
    rankings = {key: frame.sort_values(['qid', 'rank']).groupby('qid')['docno'].apply(list).to_dict()
                for key, frame in found.items()}
    recall = float(np.mean([len(set(rankings['approximate'].get(q, ())) & set(r)) / K
                            for q, r in rankings['exact'].items()]))
    digest = hashlib.sha256(pd.util.hash_pandas_object(exact[['qid', 'docno', 'score']], index=False).values.tobytes())
    return {'seconds': {k: float(np.median(s)) for k, s in seconds.items()}, 'exact digest': digest.hexdigest(),
            'approximate recall@10': recall}


def run_worker(checkout: Path, name: str, args) -> dict:
    """One process of a checkout on one workload; its result."""
    command = [sys.executable, __file__, '--worker', str(checkout), str(arrays(name, args.work_dir)),
               str(args.work_dir / 'indexes' / checkout.name / name), '--threads', str(args.threads), '--repeats',
               str(args.repeats)]
    env = {**os.environ, 'PYTHONPATH': str(checkout)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=args.work_dir)
    if done.returncode != 0:
        raise RuntimeError(f'{checkout.name} on {name} failed:\n{done.stderr[-3000:]}')
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(args, results: dict) -> str:
    """The markdown report of every round's results."""
    from scipy.stats import t, wilcoxon

    from bench_exact import cpu_name
    old, new = (c.name for c in args.checkouts)
    lines = [f'# The index at two checkouts: {old} (old) and {new} (new)', '',
             f'{args.rounds} rounds, each a process per checkout and workload in turn (order alternating), '
             f'{args.repeats} timed searches of each system per process after a warm-up; {args.threads} threads; '
             f'200 queries of 8 vectors, top 10. Machine: {os.cpu_count()} CPUs ({cpu_name()}). Command: '
             f'`python {" ".join(sys.argv)}`.', '',
             '| ' + ' | '.join(COLUMNS) + ' |', '|---|---|---:|---:|---:|---|---|---:|---|---|']
    for name, rounds in results.items():
        for system in SYSTEMS:
            o = np.array([r[old]['seconds'][system] for r in rounds])
            n = np.array([r[new]['seconds'][system] for r in rounds])
            ratio = n / o
            differences = np.log(n) - np.log(o)
            mean = ''   # the geometric mean and its interval, from two rounds on
            if len(rounds) > 1:
                spread = t.ppf(0.975, len(rounds) - 1) * differences.std(ddof=1) / np.sqrt(len(rounds))
                mean = (f'{np.exp(differences.mean()):.3f} ({np.exp(differences.mean() - spread):.3f}-'
                        f'{np.exp(differences.mean() + spread):.3f})')
            p = (float('nan') if len(rounds) < 5 else 1. if not differences.any()   # no pair differs
                 else wilcoxon(differences).pvalue)
            same, recall = '', ''
            if system == 'exact':
                same = 'yes' if all(r[old]['exact digest'] == r[new]['exact digest'] for r in rounds) else 'NO'
            else:
                recall = f"{rounds[0][old]['approximate recall@10']:.4f}, {rounds[0][new]['approximate recall@10']:.4f}"
            lines.append(f'| {name} | {system} | {np.median(o):.4f} | {np.median(n):.4f} | {np.median(ratio):.3f} | '
                         f'{ratio.min():.3f}-{ratio.max():.3f} | {mean} | {p:.3g} | {same} | {recall} |')
    return '\n'.join(lines) + '\n'


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('checkouts', nargs='*', type=Path, help='the old and the new checkout')
    parser.add_argument('--workloads', nargs='+', default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument('--rounds', type=int, default=8)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--work-dir', type=Path, default=Path('/tmp/bench_commits'))
    parser.add_argument('--out', type=Path, default=Path(__file__).parent / 'results' / 'bench_commits')
    parser.add_argument('--worker', nargs=3, metavar=('CHECKOUT', 'ARRAYS', 'INDEX'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        checkout, folder, index_path = map(Path, args.worker)
        print(json.dumps(worker(checkout, folder, index_path, args.threads, args.repeats)))
        return
    if len(args.checkouts) != 2 or args.checkouts[0].resolve().name == args.checkouts[1].resolve().name:
        parser.error('give two checkouts, the old and the new, whose folders have different names')
    if args.rounds < 1 or args.repeats < 1:
        parser.error(f'--rounds and --repeats must be at least 1, got {args.rounds} and {args.repeats}')
    args.checkouts = [c.resolve() for c in args.checkouts]
    args.work_dir = args.work_dir.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results = {name: [] for name in args.workloads}
    import pyterrier as pt
    with pt.tqdm(total=args.rounds * len(args.workloads) * 2, unit='process', desc='bench_commits') as bar:
        for round_ in range(args.rounds):
            for name in args.workloads:
                pair = {}
                for checkout in (args.checkouts if round_ % 2 == 0 else args.checkouts[::-1]):
                    pair[checkout.name] = run_worker(checkout, name, args)
                    bar.update()
                results[name].append(pair)
            text = report(args, {n: r for n, r in results.items() if r})   # after every round: a run cut short
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_suffix('.md').write_text(text)
            args.out.with_suffix('.json').write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == '__main__':
    main()
