"""Benchmark of the MultiVectorIndex searched and built over Ray, against the same index in one process.

    python experiments/bench_distributed.py [--docs 100000] [--min-vectors 8 --max-vectors 64 --dim 128]
                                            [--queries 100 --query-vectors 8] [--repeats 5] [--actors 1 2 4]
                                            [--build-tasks 1 2 4] [--work DIR]

The corpus: ``--docs`` documents of ``--min-vectors`` to ``--max-vectors`` vectors (uniform; 36 on average by
default, about what ColBERT keeps of a passage), ``--dim`` dimensions, float32, around topic centres as
pyterrier_multiquery.experiment.clustered_collection makes them; each document is drawn from its own seed, so that
any split of the corpus into parts gives the same documents. Queries: ``--queries`` of ``--query-vectors`` vectors,
searched as one batch (one frame).

Builds: the corpus into 4 shards by ``ShardedMultiVectorIndex.indexer(num_shards=4)`` in this process (it draws the
documents and writes the shards one after the other), then by ``ray_indexer()`` with 1, 2 and 4 Ray tasks, each
drawing and writing its part (1 task: one shard; 2: two; 4: four), each task reserving ``cores / tasks`` CPUs.
One build each (a build takes minutes; the numbers are single runs).

Searches, on the 4-shard index built by 4 tasks, returning 1000 documents per query:
- one process: ``index.maxsim_retriever(...)`` in this process, on ``--threads`` threads (default: all cores).
- Ray, N actors: ``index.ray(num_actors=N).maxsim_retriever(...)``; the 4 shards in N groups. With 1 actor, the
  actor uses ``--threads`` threads (as the one process does: this row gives Ray's overhead); with 2 and 4, one
  thread each.
Two retrievers: exact MaxSim, and approximate MaxSim (IVF with 8-bit codes, the default, ``--candidates`` per
query vector, 32 lists probed). Every system is run once to warm up, then ``--repeats`` rounds each run every
system once (interleaved, so drift in the machine's load touches all alike); medians reported. Latency = the
median seconds of a 100-query batch; QPS = queries / latency. Ray overhead = (1 actor latency - one process
latency) / one process latency. Identical: the Ray ranking and scores equal to the one-process run's with the same
thread count, bit for bit. Memory per actor (not given for the one process, which also drew the whole corpus for
its build): the actor process's resident memory after the runs (VmRSS, which counts the pages of the memory-mapped
shards it read, shared with the page cache) and its anonymous part (RssAnon: its own heap).

Projection to 4, 16 and 64 nodes (the per-node figures measured here, the rest assumed as written in the report):
a batch costs fan-out (submitting N calls and collecting N results: the measured round trip of an empty call to
1, 2 and 4 actors, extrapolated linearly in N), the slowest node's search (the measured one-actor compute time,
scaled by the documents it holds), the transfer of the results (N x queries x 1000 x 12 bytes, at an assumed
1 GB/s per link into the driver) and the driver's merge (``merge_top`` of N parts, measured here for each N).
"""
import argparse
import functools
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pyterrier_multiquery.experiment.evaluation import write_report
from pyterrier_multiquery.index import ShardedMultiVectorIndex
from pyterrier_multiquery.index.maxsim import merge_top

ROOT = Path(__file__).resolve().parents[1]

NUM_RESULTS = 1000
SHARDS = 4
TOPICS = 1000
SPREAD = 0.5
RESULT_BYTES = 12  # a float32 score and an int64 docid per result
LINK_BYTES_PER_S = 1e9


def corpus_part(start: int, stop: int, dim: int, min_vectors: int, max_vectors: int, seed: int = 0):
    """Documents ``start`` to ``stop - 1`` of the corpus, each from its own seed (a Ray task draws its own part)."""
    centres = np.random.default_rng(seed).normal(size=(TOPICS, dim)).astype(np.float32)
    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])
        size = int(rng.integers(min_vectors, max_vectors + 1))
        embs = centres[rng.integers(0, TOPICS, size=2)[rng.integers(0, 2, size=size)]] + \
            SPREAD * rng.normal(size=(size, dim)).astype(np.float32)
        yield {'docno': f'd{i}', 'doc_embs': embs / np.linalg.norm(embs, axis=1, keepdims=True)}


def make_queries(args) -> pd.DataFrame:
    """Queries near documents: each perturbs topic centres of a random document, as clustered_collection does."""
    rng = np.random.default_rng(args.seed + 2)
    centres = np.random.default_rng(args.seed).normal(size=(TOPICS, args.dim)).astype(np.float32)
    embs = []
    for _ in range(args.queries):
        picks = rng.integers(0, TOPICS, size=2)[rng.integers(0, 2, size=args.query_vectors)]
        q = centres[picks] + SPREAD * rng.normal(size=(args.query_vectors, args.dim)).astype(np.float32)
        embs.append((q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32))
    return pd.DataFrame({'qid': [f'q{i}' for i in range(args.queries)], 'query': '', 'query_embs': embs})


def bounds(docs: int, parts: int) -> list:
    cuts = np.linspace(0, docs, parts + 1).astype(int)
    return list(zip(cuts[:-1], cuts[1:]))


def build(args, work: Path) -> tuple:
    """The builds (one process, then 1, 2 and 4 Ray tasks); returns their rows and the index built by 4 tasks."""
    rows, cores = [], os.cpu_count()
    part = functools.partial(corpus_part, dim=args.dim, min_vectors=args.min_vectors, max_vectors=args.max_vectors,
                             seed=args.seed)
    start = time.perf_counter()
    one = ShardedMultiVectorIndex(work / 'one-process', verbose=False).indexer(num_shards=SHARDS).index(
        list(part(0, args.docs)))
    rows.append({'build': f'one process, {SHARDS} shards', 'tasks': 1, 'seconds': time.perf_counter() - start,
                 'vectors': one.payload()[0]['vec_count']})
    shutil.rmtree(one.path)
    print(rows[-1], flush=True)
    index = None
    for tasks in args.build_tasks:
        target = ShardedMultiVectorIndex(work / f'ray-{tasks}', verbose=False)
        parts = [functools.partial(part, a, b) for a, b in bounds(args.docs, tasks)]
        start = time.perf_counter()
        target.ray_indexer(num_cpus=cores / tasks).index(parts)
        rows.append({'build': f'Ray, {tasks} task{"s" if tasks > 1 else ""}', 'tasks': tasks,
                     'seconds': time.perf_counter() - start, 'vectors': target.payload()[0]['vec_count']})
        print(rows[-1], flush=True)
        if tasks == SHARDS:
            index = target
        else:
            shutil.rmtree(target.path)
    if index is None:
        index = ShardedMultiVectorIndex(work / 'ray-4', verbose=False)
        index.ray_indexer(num_cpus=cores / SHARDS).index(
            [functools.partial(part, a, b) for a, b in bounds(args.docs, SHARDS)])
    return pd.DataFrame(rows), index


def retriever(target, kind: str, threads: int, candidates: int):
    settings = {'num_results': NUM_RESULTS, 'threads': threads}
    if kind == 'approximate':
        return target.ann_retriever(ann='ivf', candidates=candidates, search_effort=32, **settings)
    return target.retriever(**settings)


def same_run(run: pd.DataFrame, reference: pd.DataFrame) -> bool:
    """Whether two result frames have the same rankings and the same scores, bit for bit."""
    columns = ['qid', 'docno', 'docid', 'rank']
    return bool(run[columns].equals(reference[columns]) and
                np.array_equal(run['score'].to_numpy(), reference['score'].to_numpy()))


def memory(pid: int) -> tuple:
    """VmRSS and RssAnon of a process on this machine, in MiB."""
    fields = dict(line.split(':', 1) for line in Path(f'/proc/{pid}/status').read_text().splitlines() if ':' in line)
    return tuple(int(fields[key].split()[0]) / 1024 for key in ('VmRSS', 'RssAnon'))


def empty_round_trip(ray_index, calls: int = 50) -> float:
    """Median seconds of a call that does nothing on every actor (``doc_count``)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        ray_index.map('doc_count')
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def merge_seconds(nodes: int, queries: int, repeats: int = 7) -> float:
    """Median seconds of merging ``nodes`` parts of each query's top 1000 (as the driver does)."""
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(nodes):
        scores = -np.sort(-rng.random((queries, NUM_RESULTS), dtype=np.float32), axis=1)
        parts.append((scores, rng.integers(0, 10**9, size=(queries, NUM_RESULTS)), np.full(queries, NUM_RESULTS)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        merge_top(parts, NUM_RESULTS)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def search(args, index) -> tuple:
    import ray
    cores = os.cpu_count()
    queries = make_queries(args)
    systems = {('one process', 0): None}
    # all the actors live at once (so that the rounds interleave), each reserving an equal part of the cores: the
    # reservation is Ray's bookkeeping, the threads are set by the retrievers
    share = cores / sum(args.actors)
    ray_indexes = {n: index.ray(num_actors=n, num_cpus=share) for n in args.actors}
    for n in args.actors:
        systems[(f'Ray, {n} actor{"s" if n > 1 else ""}', n)] = ray_indexes[n]
    rows, identical = [], {}
    for kind in args.retrievers:
        runs = {}
        for (name, n), ray_index in systems.items():
            threads = args.threads if n <= 1 else 1
            runs[name] = (retriever(ray_index or index, kind, threads, args.candidates), threads)
        outputs = {}
        for name, (r, _) in runs.items():  # warm-up (the approximate: FAISS builds or loads)
            start = time.perf_counter()
            outputs[name] = r(queries)
            print(kind, 'warm-up', name, round(time.perf_counter() - start, 1), flush=True)
        references = {args.threads: outputs['one process']}
        for name, (_, threads) in runs.items():  # against one process with the same thread count
            if threads not in references:
                references[threads] = retriever(index, kind, threads, args.candidates)(queries)
            identical[(kind, name)] = '' if name == 'one process' else same_run(outputs[name], references[threads])
        seconds = {name: [] for name in runs}
        for round_ in range(args.repeats):
            for name, (r, _) in runs.items():
                start = time.perf_counter()
                r(queries)
                seconds[name].append(time.perf_counter() - start)
            print(kind, round_, {name: round(s[-1], 3) for name, s in seconds.items()}, flush=True)
        base = statistics.median(seconds['one process'])
        for (name, n), ray_index in systems.items():
            latency = statistics.median(seconds[name])
            # this process also drew the whole corpus for the one-process build: its memory is not the index's
            rss, anon = (np.mean([memory(pid)[i] for pid in ray_index.pids]) for i in (0, 1)) if ray_index else \
                (float('nan'), float('nan'))
            rows.append({'retriever': kind, 'system': name, 'actors': n, 'threads per actor': runs[name][1] if n else
                         '', 'latency s': latency, 'min s': min(seconds[name]), 'max s': max(seconds[name]),
                         'QPS': args.queries / latency, 'x one process': base / latency,
                         'overhead %': 100 * (latency - base) / base if n == 1 else float('nan'),
                         'identical': identical[(kind, name)], 'RSS MiB': rss, 'anon MiB': anon})
    fan_out = {n: empty_round_trip(ray_indexes[n]) for n in args.actors}
    for ray_index in ray_indexes.values():
        ray_index.close()
    ray.shutdown()
    return pd.DataFrame(rows), fan_out


def projection(args, table: pd.DataFrame, fan_out: dict) -> pd.DataFrame:
    """Latency of a batch on 4, 16 and 64 nodes, from the measured costs (see the module docstring)."""
    actors = sorted(fan_out)
    slope = np.polyfit(actors, [fan_out[n] for n in actors], 1)[0] if len(actors) > 1 else 0.
    rows = []
    for kind in table['retriever'].unique():
        one = table[(table['retriever'] == kind) & (table['actors'] == 1)].iloc[0]
        compute = one['latency s'] - fan_out[1]  # one actor, all the corpus, all the cores of a node
        for nodes in (4, 16, 64):
            transfer = nodes * args.queries * NUM_RESULTS * RESULT_BYTES / LINK_BYTES_PER_S
            merge = merge_seconds(nodes, args.queries)
            fan = fan_out[1] + slope * (nodes - 1)
            for scaling, per_node in (('same corpus split', compute / nodes), ('corpus x nodes', compute)):
                latency = fan + per_node + transfer + merge
                rows.append({'retriever': kind, 'nodes': nodes, 'scaling': scaling, 'documents': args.docs * (
                    nodes if scaling == 'corpus x nodes' else 1), 'fan-out s': fan, 'node search s': per_node,
                    'transfer s': transfer, 'merge s': merge, 'latency s': latency, 'QPS': args.queries / latency})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, projected: pd.DataFrame):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for kind, marker in [(k, m) for k, m in (('exact', 'o'), ('approximate', 's')) if k in set(table['retriever'])]:
        rows = table[(table['retriever'] == kind) & (table['actors'] > 0)]
        line = left.plot(rows['actors'], rows['QPS'], marker=marker, label=f'{kind}, Ray')[0]
        one = table[(table['retriever'] == kind) & (table['actors'] == 0)]['QPS'].iloc[0]
        left.axhline(one, linestyle='--', color=line.get_color(), label=f'{kind}, one process')
        for scaling, style in (('same corpus split', '-'), ('corpus x nodes', ':')):
            rows = projected[(projected['retriever'] == kind) & (projected['scaling'] == scaling)]
            right.plot(rows['nodes'], rows['QPS'], marker=marker, linestyle=style, color=line.get_color(),
                       label=f'{kind}, {scaling}')
    left.set(xlabel='Ray actors (2 cores: 4 actors are oversubscribed)', ylabel='queries per second', yscale='log',
             xticks=sorted(table['actors'][table['actors'] > 0].unique()), title='Measured, 100-query batches')
    right.set_xscale('log', base=2)
    right.set(xlabel='nodes', ylabel='queries per second', yscale='log', xticks=[4, 16, 64],
              xticklabels=['4', '16', '64'], title='Projected')
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.tight_layout()
    return figure


def machine() -> str:
    cpu = next((line.split(':', 1)[1].strip() for line in Path('/proc/cpuinfo').read_text().splitlines()
                if line.startswith('model name')), platform.processor())
    import ray
    return (f'{os.cpu_count()} CPU cores ({cpu}): 4 actors (or tasks) on {os.cpu_count()} cores are oversubscribed, '
            f'so 2 and 4 actors cannot be faster than the cores allow; load average {os.getloadavg()[0]:.2f} at the '
            f'start (other work shared the machine); Python {platform.python_version()}, torch {torch.__version__}, '
            f'ray {ray.__version__}, numpy {np.__version__}')


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--docs', type=int, default=100_000)
    parser.add_argument('--min-vectors', type=int, default=8)
    parser.add_argument('--max-vectors', type=int, default=64)
    parser.add_argument('--dim', type=int, default=128)
    parser.add_argument('--queries', type=int, default=100, help='queries in the batch')
    parser.add_argument('--query-vectors', type=int, default=8)
    parser.add_argument('--repeats', type=int, default=5, help='interleaved timing rounds')
    parser.add_argument('--actors', type=int, nargs='+', default=[1, 2, 4])
    parser.add_argument('--build-tasks', type=int, nargs='+', default=[1, 2, 4])
    parser.add_argument('--retrievers', nargs='+', choices=('exact', 'approximate'), default=['exact', 'approximate'])
    parser.add_argument('--candidates', type=int, default=256, help='candidates per query vector (approximate)')
    parser.add_argument('--threads', type=int, default=os.cpu_count(),
                        help='threads of the one process and of the single actor (2 and 4 actors: one each)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--work', type=Path, help='folder for the indexes (default: a temporary one, removed)')
    parser.add_argument('--out', type=Path, default=ROOT / 'experiments' / 'results' / 'bench_distributed')
    args = parser.parse_args()
    if 1 not in args.actors:
        parser.error('--actors must include 1 (the overhead row and the projection need it)')
    import ray
    began = time.perf_counter()
    description_machine = machine()
    # the actors and tasks import this checkout, as this process does
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False,
             runtime_env={'env_vars': {'PYTHONPATH': str(ROOT)}})
    work = Path(tempfile.mkdtemp(prefix='bench_distributed-', dir=args.work))
    try:
        builds, index = build(args, work)
        table, fan_out = search(args, index)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    projected = projection(args, table, fan_out)
    overhead = table[table['actors'] == 1][['retriever', 'overhead %']]
    lines = [f'Ray overhead at one actor, {r["retriever"]}: {r["overhead %"]:.1f} % (goal < 15 %: '
             f'{"met" if r["overhead %"] < 15 else "not met"})' for _, r in overhead.iterrows()]
    fan = ', '.join(f'{n} actor{"s" if n > 1 else ""} {1000 * s:.1f} ms' for n, s in sorted(fan_out.items()))
    description = (
        f'{args.docs} documents of {args.min_vectors} to {args.max_vectors} vectors x {args.dim} dims (float32), '
        f'{builds["vectors"].iloc[0]} vectors in all; {args.queries} queries of {args.query_vectors} vectors; '
        f'{args.repeats} interleaved rounds. Machine: {description_machine}. The whole run took '
        f'{time.perf_counter() - began:.0f} s. Command: `python experiments/{Path(__file__).name} '
        f'{" ".join(sys.argv[1:])}`.\n\n' + '\n'.join(f'- {line}' for line in lines) +
        f'\n- Round trip of an empty call to every actor (fan-out and collection): {fan}.\n\n' +
        __doc__.split('\n\n', 2)[2] + '\nProjection assumptions: each node is like this machine (its cores, its '
        'disk), holds its documents memory-mapped and searches them in the measured one-actor time per document '
        '(linear in documents: the exact search reads every vector, and the approximate one is taken to scale alike, '
        'which overstates its cost); the fan-out cost grows linearly with the nodes at the slope measured from 1 to '
        f'{max(args.actors)} actors here; results travel at {LINK_BYTES_PER_S / 1e9:.0f} GB/s into the driver, one '
        'node after another (no overlap); the driver merges as measured. "same corpus split": these documents over '
        'N nodes; "corpus x nodes": each node holds as many as here.')
    write_report(args.out, 'The MultiVectorIndex over Ray: search and build', description,
                 {'Search (100-query batches)': table, 'Builds': builds, 'Projection': projected},
                 extra={'fan_out_s': fan_out, 'settings': {k: str(v) for k, v in vars(args).items()}},
                 figure=plot(table, projected), csv=True, floatfmt='.4g')
    print(args.out.with_suffix('.md').read_text())


if __name__ == '__main__':
    main()
