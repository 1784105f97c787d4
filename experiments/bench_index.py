"""Benchmark of the MultiVectorIndex's MaxSim search against reference implementations, as evidence.

    python experiments/bench_index.py [--docs 20000 100000] [--vectors 8 --dim 128 --queries 200 --repeats 5]
                                      [--threads N] [--dtype float32|float16] [--stages flat ivf ivf+SQ8 [ivf+PQ16]]
                                      [--candidates 16 32 64 128 256 512]
    python experiments/bench_index.py --scale [--docs 1000000]  # the streamed run: float16, 512 to 8192 candidates

The workload is pyterrier_multiquery.experiment.clustered_collection.clustered_collection (vectors around topic
centres, queries drawn near documents), written to a MultiVectorIndex by streaming (a generator: the corpus is never
in memory).

Systems, all on the CPU, all returning each query's top 10:
- index exact: ``index.maxsim_retriever(exact=True)`` on a frame of all queries (the result frame included).
- reference exact: one matmul of all query vectors against a block of stored vectors, the per-document max by
  ``np.maximum.reduceat``, the per-query sum by a product with a query-indicator matrix, a running top 10; blocks
  of whole documents whose similarity matrix stays under 4 MiB (the index's tile budget; 64 MiB made it 3x slower),
  read from the same memory-mapped file (float16 converted to float32 by torch, as the index does; so does
  reference approx).
- index approx <stage> c: ``maxsim_retriever(exact=False, ann=..., quantizer=..., candidates=c)``.
- reference approx <stage> c: the same FAISS index file and search (``nprobe`` 32), hits mapped to documents by
  ``searchsorted``, ``np.unique`` per query, then one padded (queries x candidates x vectors) ``bmm`` re-score
  (in chunks of queries whose gathered vectors fit in 256 MiB) and ``topk``.
(The field's engines, at matched recall: experiments/bench_peers.py.)

Timing: every system runs once to warm up (loads files and FAISS; its top 10 gives recall), then ``--repeats``
rounds, each running every system once in a fixed order (interleaved, so that drift in the machine's load touches
all systems alike). Reported: median, min and max seconds of a round's search of all queries; QPS = queries /
median; "x reference" = reference median / system median within the same run (exact rows against reference exact,
approx rows against reference approx of the same stage and candidate count: > 1 is faster than the reference).
Recall@10 = |top 10 & exact top 10| / 10 averaged over queries, exact = index exact's ranking. Bytes per vector =
files on disk (index folder, plus the FAISS file for approx rows) / stored vectors. Peak memory: each system is
re-run once in a fresh subprocess (opening the index, loading FAISS, searching all queries): the rise of the peak
RSS over the RSS before (the kernel's VmHWM, reset through /proc/self/clear_refs; it counts the pages of the
memory-mapped vectors read, which the page cache can drop) and the rise of the anonymous RSS (heap only; sampled
every 2 ms, so a spike shorter than that can be missed); approx systems are probed at their largest candidate count.
(ru_maxrss is not used: in a subprocess it keeps the peak of the imports and of the forked parent.)
``--scale``: exact runs on a query subset (``--exact-queries``), candidate counts are tried in ascending order on
that subset and only the smallest reaching recall@10 >= 0.99 is timed.
Writes experiments/results/bench_index.{md,json} (write_report).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pyterrier_multiquery._device import cpu_threads
from pyterrier_multiquery.experiment.evaluation import write_report
from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index.ann import ann_file, ann_storage, load_or_build, set_search_effort
from pyterrier_multiquery.index.maxsim import document_blocks
from pyterrier_multiquery.experiment.clustered_collection import clustered_collection

RESULTS = Path(__file__).parent / 'results'
K = 10
SEARCH_EFFORT = 32  # IVF lists probed: the retriever's default
REFERENCE_SIMS_BYTES = 4 << 20
REFERENCE_GATHER_BYTES = 256 << 20
TARGETS = {'approx / reference approx': 0.9, 'approx / index exact': 5.0, 'index exact / reference exact': 1.0}


class PeakMemory:
    """Rise of the peak RSS and of the peak anonymous RSS (MiB) while the block runs, from the RSS before it.

    The peak RSS is the kernel's (VmHWM, reset on entry through /proc/self/clear_refs), else sampled; the anonymous
    RSS (heap, not pages of memory-mapped files) is sampled every 2 ms. NaN where /proc is missing."""

    def __enter__(self):
        try:
            Path('/proc/self/clear_refs').write_text('5')  # resets VmHWM to the current RSS
            self.kernel_peak = True
        except OSError:
            self.kernel_peak = False
        self.before = {key: _proc_status(key) for key in ('VmRSS', 'RssAnon')}
        self.peak, self._stop = dict(self.before), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self.peak = {key: max(value, _proc_status(key)) for key, value in self.peak.items()}

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        peak = {key: max(value, _proc_status(key)) for key, value in self.peak.items()}
        if self.kernel_peak:
            peak['VmRSS'] = _proc_status('VmHWM')
        rises = [(peak[key] - self.before[key]) / 2**20 if self.before[key] >= 0 else float('nan')
                 for key in ('VmRSS', 'RssAnon')]
        self.rss_rise, self.anon_rise = rises


def _proc_status(key: str) -> int:
    """A size from /proc/self/status in bytes, -1 where unavailable."""
    try:
        for line in Path('/proc/self/status').read_text().splitlines():
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def parse_stage(stage: str):
    """'flat', 'ivf', 'ivf+SQ8', 'ivf+PQ16' -> (kind, quantizer)."""
    kind, _, quantizer = stage.partition('+')
    return kind, ann_storage(kind, quantizer or 'Flat')  # checks both; no '+': float32 vectors


class IndexSystem:
    """The index's own retriever, called on a query frame; ``top`` turns its result frame into docids."""

    def __init__(self, index, queries, threads, stage=None, candidates=None):
        kind, quantizer = parse_stage(stage) if stage else ('ivf', None)
        self.retriever = index.maxsim_retriever(exact=stage is None, ann=kind, quantizer=quantizer, num_results=K,
                                                candidates=candidates or 1, search_effort=SEARCH_EFFORT,
                                                device='cpu', threads=threads)
        self.topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': list(queries)})

    def search(self):
        return self.retriever(self.topics)

    def top(self, frame):
        found = np.full((len(self.topics), K), -1, dtype=np.int64)
        found[frame['qid'].str[1:].astype(int).to_numpy(), frame['rank'].to_numpy()] = frame['docid'].to_numpy()
        return found


class ReferenceExact:
    """All query vectors times a block of stored vectors, segment max per document, sum per query, top 10."""

    def __init__(self, index, queries, threads):
        _, self.vectors, self.offsets, _ = index.payload()
        self.threads, self.count = threads, len(queries)
        self.stacked = torch.from_numpy(np.concatenate(queries))
        lengths = np.array([len(q) for q in queries])
        indicator = np.zeros((len(self.stacked), len(queries)), dtype=np.float32)
        indicator[np.arange(len(self.stacked)), np.repeat(np.arange(len(queries)), lengths)] = 1
        self.indicator = torch.from_numpy(indicator / lengths.astype(np.float32))  # mean over each query's vectors
        widest = int(np.diff(self.offsets).max())
        self.blocks = document_blocks(self.offsets, max(widest, REFERENCE_SIMS_BYTES // (4 * len(self.stacked))))

    def search(self):
        best_scores = np.empty((self.count, 0), dtype=np.float32)
        best_docids = np.empty((self.count, 0), dtype=np.int64)
        with cpu_threads(self.threads):
            for first, last in self.blocks:
                block = np.require(self.vectors[self.offsets[first]:self.offsets[last]], requirements=['C', 'W'])
                sims = (torch.from_numpy(block).float() @ self.stacked.T).numpy()  # (block vectors, query vectors)
                per_doc = np.maximum.reduceat(sims, self.offsets[first:last] - self.offsets[first], axis=0)
                scores = (torch.from_numpy(per_doc) @ self.indicator).numpy().T  # (queries, block documents)
                best_scores = np.concatenate([best_scores, scores], axis=1)
                best_docids = np.concatenate([best_docids, np.broadcast_to(np.arange(first, last), scores.shape)], 1)
                if best_scores.shape[1] > K:
                    keep = np.argpartition(-best_scores, K - 1, axis=1)[:, :K]
                    best_scores = np.take_along_axis(best_scores, keep, 1)
                    best_docids = np.take_along_axis(best_docids, keep, 1)
        return np.take_along_axis(best_docids, np.lexsort((best_docids, -best_scores)), 1)

    def top(self, found):
        return found


class ReferenceApproximate:
    """The index's FAISS file searched for all query vectors at once, then one padded re-score of the candidates."""

    def __init__(self, index, queries, threads, stage, candidates):
        kind, quantizer = parse_stage(stage)
        _, self.vectors, self.offsets, _ = index.payload()
        self.ann = load_or_build(index, kind, quantizer, verbose=False)
        set_search_effort(self.ann, kind, SEARCH_EFFORT)
        self.lengths = np.diff(self.offsets)
        self.threads, self.candidates = threads, candidates
        self.queries = queries
        self.stacked = np.concatenate(queries)
        self.starts = np.cumsum([0] + [len(q) for q in queries])

    def search(self):
        with cpu_threads(self.threads, with_faiss=True):
            _, hits = self.ann.search(self.stacked, self.candidates)
            docs = np.where(hits >= 0, np.searchsorted(self.offsets, hits, side='right') - 1, -1)
            per_query = [np.unique(docs[a:b]) for a, b in zip(self.starts[:-1], self.starts[1:])]
            per_query = [d[d >= 0] for d in per_query]
            widest = int(self.lengths.max())
            step = max(1, REFERENCE_GATHER_BYTES // (4 * widest * self.stacked.shape[1] *
                                                     max(len(d) for d in per_query)))
            return np.concatenate([self._rescore(self.queries[i:i + step], per_query[i:i + step], widest)
                                   for i in range(0, len(per_query), step)])

    def _rescore(self, queries, candidates, widest):
        count, width = len(queries), max(1, max(len(c) for c in candidates))
        docids = np.full((count, width), -1, dtype=np.int64)
        for i, c in enumerate(candidates):
            docids[i, :len(c)] = c
        safe = np.maximum(docids, 0)
        # each document's rows, the last repeated up to the widest (a repeated row leaves the max unchanged)
        rows = np.minimum(self.offsets[safe][:, :, None] + np.arange(widest),
                          self.offsets[safe + 1][:, :, None] - 1)
        doc_vectors = torch.from_numpy(self.vectors[rows.reshape(-1)]).float()
        query_lengths = np.array([len(q) for q in queries])
        padded = np.zeros((count, query_lengths.max(), self.stacked.shape[1]), dtype=np.float32)
        for i, q in enumerate(queries):
            padded[i, :len(q)] = q
        sims = torch.bmm(torch.from_numpy(padded), doc_vectors.view(count, width * widest, -1).transpose(1, 2))
        scores = sims.view(count, -1, width, widest).amax(dim=3).sum(dim=1) / torch.from_numpy(query_lengths)[:, None]
        scores = scores.masked_fill(torch.from_numpy(docids < 0), -torch.inf)
        top = torch.topk(scores, min(K, width), dim=1).indices.numpy()
        found = np.full((count, K), -1, dtype=np.int64)
        found[:, :top.shape[1]] = np.take_along_axis(docids, top, 1)
        return found

    def top(self, found):
        return found


def make_system(spec: dict, index, queries, threads):
    queries = queries[:spec['queries']]
    if spec['impl'] == 'index':
        return IndexSystem(index, queries, threads, spec['stage'], spec['candidates'])
    if spec['stage'] is None:
        return ReferenceExact(index, queries, threads)
    return ReferenceApproximate(index, queries, threads, spec['stage'], spec['candidates'])


def spec(impl: str, stage=None, candidates=None, queries=None) -> dict:
    kind = 'exact' if stage is None else 'approx'
    name = f'{impl} {kind}' + (f' {stage}' if stage else '')
    return {'system': name, 'impl': impl, 'kind': kind, 'stage': stage, 'candidates': candidates, 'queries': queries}


def folder_bytes(path: Path, skip_ann: bool = True) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file() and not (skip_ann and f.name.startswith('ann.')))


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f[f >= 0]) & set(e[e >= 0])) / max(1, (e >= 0).sum())
                          for f, e in zip(found, exact)]))


def build(path: Path, docs: int, args):
    """The index written from a stream of the synthetic collection; (index, queries, seconds, peak anon MiB)."""
    shutil.rmtree(path, ignore_errors=True)
    stream, queries = clustered_collection(docs, dim=args.dim, min_vectors=args.vectors, max_vectors=args.vectors,
                                           query_count=args.queries, query_vectors=args.query_vectors, seed=args.seed)
    with PeakMemory() as memory:
        start = time.perf_counter()
        index = MultiVectorIndex(path, verbose=False).indexer(dtype=args.dtype).index(stream)
        seconds = time.perf_counter() - start
    return index, queries, seconds, memory.anon_rise


def build_stages(index, stages, threads) -> dict:
    """Each FAISS candidate stage built (and cached in the index folder): {stage: (seconds, peak anon MiB)}."""
    built = {}
    for stage in stages:
        with PeakMemory() as memory, cpu_threads(threads, with_faiss=True):
            start = time.perf_counter()
            load_or_build(index, *parse_stage(stage), verbose=False)
            seconds = time.perf_counter() - start
        built[stage] = (seconds, memory.anon_rise)
    return built


def sweep(index, queries, exact, stages, candidates, threads) -> tuple:
    """Per stage, the smallest candidate count reaching recall@10 >= 0.99 on the exact subset (else the largest),
    and the table of recalls tried."""
    chosen, tried = {}, []
    for stage in stages:
        for count in sorted(candidates):
            system = IndexSystem(index, queries[:len(exact)], threads, stage, count)
            tried.append({'stage': stage, 'candidates': count, 'recall@10': recall(system.top(system.search()), exact)})
            chosen[stage] = count
            if tried[-1]['recall@10'] >= 0.99:
                break
    return chosen, pd.DataFrame(tried)


def interleaved(systems: list, repeats: int) -> tuple:
    """One warm-up run per system (its top 10 kept), then ``repeats`` rounds of every system once."""
    tops = [system.top(system.search()) for system in systems]
    seconds = [[] for _ in systems]
    for _ in range(repeats):
        for system, times in zip(systems, seconds):
            start = time.perf_counter()
            system.search()
            times.append(time.perf_counter() - start)
    return tops, seconds


def probe_memory(specs, index, queries, work: Path, threads) -> list:
    """Peak memory of each spec, measured in a fresh subprocess (see ``--probe``)."""
    np.save(work / 'queries.npy', np.stack(queries))
    out = []
    for s in specs:
        job = {**s, 'index': str(index.path), 'queries_file': str(work / 'queries.npy'), 'threads': threads}
        result = subprocess.run([sys.executable, __file__, '--probe', json.dumps(job)], capture_output=True, text=True)
        if result.returncode != 0:
            print(result.stderr[-3000:], file=sys.stderr)
            out.append((float('nan'), float('nan')))
        else:
            out.append(tuple(json.loads(result.stdout.strip().splitlines()[-1])))
    return out


def run_probe(job: dict) -> None:
    """The subprocess side of probe_memory: prints [peak RSS rise, peak anon rise] in MiB."""
    queries = list(np.load(job['queries_file']))
    with PeakMemory() as memory:
        system = make_system(job, MultiVectorIndex(job['index'], verbose=False), queries, job['threads'])
        system.search()
    print(json.dumps([memory.rss_rise, memory.anon_rise]))


def row(s: dict, seconds: list, queries: int, reference: list, found, exact, build_s, bytes_per_vector, memory):
    median = float(np.median(seconds))
    return {'system': s['system'], 'candidates': '' if s['candidates'] is None else str(s['candidates']),
            'queries': queries, 'median s': median, 'min s': min(seconds), 'max s': max(seconds),
            'QPS': queries / median, 'x reference': float(np.median(reference)) / median,
            'recall@10': recall(found[:len(exact)], exact), 'build s': build_s, 'bytes/vector': bytes_per_vector,
            'peak RSS rise MiB': memory[0], 'peak anon rise MiB': memory[1], 'rounds s': list(seconds)}


def verdict(docs: int, table: pd.DataFrame) -> dict:
    """The operating point (the fastest index approx row with recall@10 >= 0.99, else the most accurate) and the
    three ratios against their targets."""
    approx = table[table['system'].str.startswith('index approx')]
    good = approx[approx['recall@10'] >= 0.99]
    point = good.loc[good['QPS'].idxmax()] if len(good) else approx.loc[approx['recall@10'].idxmax()]
    exact = table[table['system'] == 'index exact'].iloc[0]
    ratios = {'approx / reference approx': point['x reference'], 'approx / index exact': point['QPS'] / exact['QPS'],
              'index exact / reference exact': exact['x reference']}
    line = (f'{docs} docs: operating point {point["system"]} c={point["candidates"]} (recall@10 '
            f'{point["recall@10"]:.3f}, {point["QPS"]:.0f} QPS); ' +
            '; '.join(f'{name} = {value:.2f} (target >= {TARGETS[name]}: '
                      f'{"PASS" if value >= TARGETS[name] else "FAIL"})' for name, value in ratios.items()) +
            f'; approx / reference approx over all approx rows: {approx["x reference"].min():.2f} to '
            f'{approx["x reference"].max():.2f}')
    reference = table[(table['system'] == point['system'].replace('index', 'reference', 1)) &
                      (table['candidates'] == point['candidates'])].iloc[0]
    return {'docs': docs, 'operating point': f'{point["system"]} c={point["candidates"]}', **ratios, 'line': line,
            'reference': reference}


def bench_size(docs: int, args, work: Path) -> tuple:
    """Builds, times and probes every system for one collection size: (table, verdict, extra tables, build info)."""
    index, queries, build_s, build_anon = build(work / f'docs{docs}.mvi', docs, args)
    stage_builds = build_stages(index, args.stages, args.threads)
    exact_queries = min(args.exact_queries or len(queries), len(queries))
    exact_system = IndexSystem(index, queries[:exact_queries], args.threads)
    exact = exact_system.top(exact_system.search())
    extra = {}
    if args.scale:
        chosen, extra['candidate sweep (recall@10 on the exact subset)'] = \
            sweep(index, queries, exact, args.stages, args.candidates, args.threads)
        pairs = [(stage, chosen[stage]) for stage in args.stages]
    else:
        pairs = [(stage, count) for stage in args.stages for count in args.candidates]
    specs = [spec('index', queries=exact_queries), spec('reference', queries=exact_queries)]
    for stage, count in pairs:
        specs += [spec('index', stage, count, len(queries)), spec('reference', stage, count, len(queries))]
    tops, seconds = interleaved([make_system(s, index, queries, args.threads) for s in specs], args.repeats)
    largest = {stage: max(c for st, c in pairs if st == stage) for stage in args.stages}
    probed = [s for s in specs if s['stage'] is None or s['candidates'] == largest[s['stage']]]
    memory = dict(zip([json.dumps(s) for s in probed], probe_memory(probed, index, queries, work, args.threads)
                      if args.memory else [(float('nan'),) * 2] * len(probed)))
    vec_count, base = index.payload()[0]['vec_count'], folder_bytes(index.path)
    rows = []
    for i, s in enumerate(specs):
        reference = seconds[i if s['impl'] == 'reference' else i + 1]
        stage = s['stage']
        size = base + (ann_file(index, *parse_stage(stage)).stat().st_size if stage else 0)
        same_stage = [p for p in probed if p['impl'] == s['impl'] and p['stage'] == stage]
        rows.append(row(s, seconds[i], s['queries'], reference, tops[i], exact,
                        build_s + (stage_builds[stage][0] if stage else 0), size / vec_count,
                        memory[json.dumps(same_stage[0])]))
    table = pd.DataFrame(rows)
    result = verdict(docs, table)
    result.pop('reference')  # a row of the table, not a verdict
    builds = {'docs': str(docs), 'vectors': vec_count, 'index build s': build_s,
              'index build peak anon MiB': build_anon, 'index bytes/vector': base / vec_count,
              **{f'{st} build s': b[0] for st, b in stage_builds.items()},
              **{f'{st} build peak anon MiB': b[1] for st, b in stage_builds.items()}}
    return table, result, extra, builds


def machine(args) -> str:
    import faiss
    cpu = next((line.split(':', 1)[1].strip() for line in Path('/proc/cpuinfo').read_text().splitlines()
                if line.startswith('model name')), platform.processor()) if Path('/proc/cpuinfo').exists() else ''
    return (f'{os.cpu_count()} CPUs ({cpu}), load average {os.getloadavg()[0]:.2f} at the start; {args.threads} '
            f'threads for torch and FAISS (OMP_NUM_THREADS={os.environ.get("OMP_NUM_THREADS", "unset")}); Python '
            f'{platform.python_version()}, torch {torch.__version__}, faiss {faiss.__version__}, '
            f'numpy {np.__version__}')


def describe(args, verdicts, seconds: float) -> str:
    mode = (f'--scale: exact on the first {min(args.exact_queries, args.queries)} queries, the smallest candidate '
            'count reaching recall@10 >= 0.99 on them timed' if args.scale else 'every candidate count timed')
    return (f'{args.vectors} vectors x {args.dim} dims per document ({args.dtype} on disk), {args.queries} queries of '
            f'{args.query_vectors} vectors, {args.repeats} interleaved rounds, {mode}. Machine: {machine(args)}. '
            f'The whole run took {seconds:.0f} s. Command: `python experiments/{Path(__file__).name} '
            f'{" ".join(sys.argv[1:])}`.\n\n' + __doc__.split('\n\n', 2)[2] + '\nVerdicts:\n\n' +
            '\n'.join(f'- {v["line"]}' for v in verdicts))


def report(args, results, seconds: float) -> None:
    """Writes the report: a table per collection size (and its candidate sweep), the builds, the verdicts."""
    tables = {}
    for docs, (table, _, extra, _) in zip(args.docs, results):
        tables[f'{docs} documents'] = table.drop(columns='rounds s')
        tables.update({f'{docs} documents: {name}': frame for name, frame in extra.items()})
    tables['Builds'] = pd.DataFrame([builds for _, _, _, builds in results])
    verdicts = [verdict for _, verdict, _, _ in results]
    tables['Verdicts'] = pd.DataFrame(verdicts).drop(columns='line')
    write_report(args.out, 'MultiVectorIndex MaxSim search against reference implementations',
                 describe(args, verdicts, seconds), tables, floatfmt='.4g',
                 extra={'settings': {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                        'rows': {docs: table.to_dict('records') for docs, (table, _, _, _) in zip(args.docs, results)}})
    print(Path(args.out).with_suffix('.md').read_text())


def main():
    if len(sys.argv) == 3 and sys.argv[1] == '--probe':
        return run_probe(json.loads(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--docs', type=int, nargs='+', help='collection sizes (default 20000; 1000000 with --scale)')
    parser.add_argument('--vectors', type=int, default=8, help='vectors per document')
    parser.add_argument('--dim', type=int, default=128)
    parser.add_argument('--queries', type=int, default=200)
    parser.add_argument('--query-vectors', type=int, default=8)
    parser.add_argument('--repeats', type=int, default=5, help='interleaved timing rounds (at least 3)')
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--dtype', choices=('float32', 'float16'), help='stored vectors (default float32; float16 '
                        'with --scale)')
    parser.add_argument('--stages', nargs='+', help='candidate stages (default flat ivf ivf+SQ8; ivf+SQ8 with '
                        '--scale; ivf+PQ16 also works, but FAISS trains it slowly: 44 s single-threaded at 2000 docs)')
    parser.add_argument('--candidates', type=int, nargs='+', help='candidates per query vector (default 16 to 512 '
                        'by doubling; 512 to 8192 with --scale)')
    parser.add_argument('--scale', action='store_true', help='the large streamed run (see above)')
    parser.add_argument('--exact-queries', type=int, help='queries searched exactly (default all; 32 with --scale)')
    parser.add_argument('--no-memory', dest='memory', action='store_false', help='skip the memory subprocesses')
    parser.add_argument('--work-dir', type=Path, help='where indexes are built (default: a temporary folder)')
    parser.add_argument('--out', type=Path, default=RESULTS / 'bench_index')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error('--repeats must be at least 3')
    args.docs = args.docs or [1_000_000 if args.scale else 20_000]
    args.stages = args.stages or (['ivf+SQ8'] if args.scale else ['flat', 'ivf', 'ivf+SQ8'])
    args.exact_queries = args.exact_queries or (32 if args.scale else None)
    args.dtype = args.dtype or ('float16' if args.scale else 'float32')
    args.candidates = args.candidates or ([512, 1024, 2048, 4096, 8192] if args.scale else [16, 32, 64, 128, 256, 512])
    start, work = time.perf_counter(), Path(args.work_dir or tempfile.mkdtemp(prefix='bench_index-'))
    work.mkdir(parents=True, exist_ok=True)
    results = [bench_size(docs, args, work) for docs in args.docs]
    report(args, results, time.perf_counter() - start)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
