"""The index's CUDA path against its CPU path: equal rankings, and the speed ratio, on a lent GPU machine.

    python experiments/bench_gpu.py [--docs 20000 100000] [--queries 200] [--repeats 3] [--cpu-threads 2 16]

The workload is bench_index.py's (pyterrier_multiquery.experiment.clustered_collection: 8 vectors of 128 dimensions
a document around 2,000 topic centres, noise 0.5, unit-normalised; queries of 8 vectors drawn the same way; top 10),
written once to a MultiVectorIndex by streaming. Systems, each called on a frame of all queries:
- index exact (cpu, N threads): ``index.retriever(exact=True, device='cpu', threads=N)``.
- index exact (cuda): ``index.retriever(exact=True, device='cuda')``: the stored vectors are copied to the GPU at
  the first search (the warm-up) and kept there, as they fit twice over in its free memory.
- index approx (cpu / cuda): ``index.retriever(exact=False)`` at its defaults: the candidate count and search effort
  each device's self-calibration chose (at the warm-up), IVF candidates by FAISS (on the GPU where FAISS was built
  for it) re-scored exactly on the device, or exact search where the calibration found that faster.
- index approx (cuda, the cpu's setting): the CPU's calibrated candidate count and search effort given to the CUDA
  retriever, so that its FAISS stage runs whatever the CUDA calibration chose.
- reference exact (cuda): all stored vectors resident on the GPU, one matmul of all query vectors against them, the
  per-document max and per-query mean by reshapes (every document has the same number of vectors here), ``topk``:
  what plain torch does when the collection fits on the card.

Rankings: each system's top 10 against index exact on the CPU (the first thread count): the share of queries whose
ten docnos come in the same order, the mean overlap (recall@10), and the largest score difference on shared docnos.
Timing: one warm-up call each, then ``--repeats`` interleaved rounds (every system once a round); the median of a
round's seconds gives queries/s; "x cpu" divides index exact (cpu, first thread count)'s median by the system's.
"setting" says what each approximate search ran with. Writes ``--out`` .md/.json (default
experiments/results/bench_gpu).

FAISS searches on the GPU only with a faiss-gpu build that has kernels for the card. The faiss-gpu-cu12 wheels
checked, 1.9.0.post1 to 1.14.1, carry machine code for sm_70 and sm_80 alone, and no PTX: on a Hopper GPU (sm_90:
the H100, the H200) their first GPU kernel fails ("no kernel image is available for execution on the device") and
FAISS aborts the process; 1.8 and 1.9.0 carry sm_90 but need NumPy < 2. There, faiss-cpu searches the IVF lists on
the CPU and the rest of the search runs on the GPU. The report's machine line says where FAISS searched.
"""
import argparse
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pyterrier_multiquery.experiment.clustered_collection import clustered_collection
from pyterrier_multiquery.experiment.evaluation import write_report
from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index.calibration import calibrated

K = 10


class Retriever:
    """One of the index's retrievers on a frame of all queries; ``top`` gives (docnos, scores) per query."""

    def __init__(self, name, retriever, topics):
        self.name, self.retriever, self.topics = name, retriever, topics

    def search(self):
        result = self.retriever(self.topics)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return result

    def top(self, frame):
        frame = frame.sort_values(['qid', 'rank'])
        return {qid: (list(g['docno']), g['score'].to_numpy()) for qid, g in frame.groupby('qid')}

    def setting(self) -> str:
        """What the search ran with: exact, or candidates and search effort (given, or as calibrated)."""
        if self.retriever.exact:
            return 'exact'
        if self.retriever.candidates is not None:
            return f'{self.retriever.candidates} candidates, effort {self.retriever.search_effort} (given)'
        found = calibrated(self.retriever)
        if found.candidates is None:
            return 'exact (calibrated)'
        return f'{found.candidates} candidates, effort {found.search_effort} (calibrated)'


class ResidentReference:
    """Plain torch with the whole collection on the GPU: matmul, max over each document's vectors, mean, topk."""

    name = 'reference exact (cuda, resident)'

    def __init__(self, index, queries, vectors_per_doc):
        _, vectors, _, _ = index.payload()
        self.docnos = index.docnos().fwd
        self.docs = torch.from_numpy(np.array(vectors, dtype=np.float32)).cuda()
        self.queries = torch.from_numpy(np.stack(queries)).cuda()   # (queries, query vectors, dim)
        self.width = vectors_per_doc

    def setting(self) -> str:
        """Exact, as every reference search."""
        return 'exact'

    def search(self):
        q, qv, dim = self.queries.shape
        scores = []
        for start in range(0, q, 64):
            batch = self.queries[start:start + 64].reshape(-1, dim)
            sims = (batch @ self.docs.T).view(len(batch) // qv, qv, -1, self.width)
            scores.append(torch.topk(sims.amax(-1).mean(1), K, dim=1))
        torch.cuda.synchronize()
        return scores

    def top(self, found):
        values = torch.cat([v for v, _ in found]).cpu().numpy()
        ids = torch.cat([i for _, i in found]).cpu().numpy()
        return {f'q{i}': ([self.docnos[d] for d in ids[i]], values[i]) for i in range(len(ids))}


def agreement(found: dict, exact: dict) -> dict:
    """Same order, overlap and largest score difference on shared docnos, against ``exact``."""
    same, overlap, gap = [], [], 0.
    for qid, (docnos, scores) in exact.items():
        other, other_scores = found[qid]
        same.append(other == docnos)
        overlap.append(len(set(other) & set(docnos)) / K)
        mine = dict(zip(docnos, scores))
        gap = max([gap] + [abs(mine[d] - s) for d, s in zip(other, other_scores) if d in mine])
    return {'same order': float(np.mean(same)), 'recall@10': float(np.mean(overlap)), 'max |Δscore|': float(gap)}


def faiss_build() -> str:
    """FAISS's version, and whether it searches on the GPU."""
    import faiss
    gpus = faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0
    return f'faiss {faiss.__version__}, ' + (f'on the GPU ({gpus} visible)' if gpus else 'on the CPU')


def bench(docs: int, args, work: Path) -> list:
    """The rows of one collection size."""
    stream, queries = clustered_collection(docs, dim=args.dim, min_vectors=args.vectors, max_vectors=args.vectors,
                                           topics=args.topics, query_count=args.queries,
                                           query_vectors=args.vectors, seed=0)
    start = time.perf_counter()
    index = MultiVectorIndex(work / f'index{docs}', verbose=False).indexer().index(stream)
    build = time.perf_counter() - start
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    def retriever(name, exact, device, threads=None, **setting):
        return Retriever(name, index.retriever(exact=exact, device=device, threads=threads, num_results=K, **setting),
                         topics)

    first = args.cpu_threads[0]
    systems = [retriever(f'index exact (cpu, {t} threads)', True, 'cpu', t) for t in args.cpu_threads]
    systems.append(retriever(f'index approx (cpu, {first} threads)', False, 'cpu', first))
    tops = {s.name: s.top(s.search()) for s in systems}   # warm-up: loads files, builds FAISS, calibrates
    if torch.cuda.is_available():
        gpu = [retriever('index exact (cuda)', True, 'cuda'), retriever('index approx (cuda)', False, 'cuda')]
        cpu = calibrated(systems[-1].retriever)   # the one the warm-up made
        if cpu.candidates is not None:
            gpu.append(retriever("index approx (cuda, the cpu's setting)", False, 'cuda',
                                 candidates=cpu.candidates, search_effort=cpu.search_effort))
        gpu.append(ResidentReference(index, queries, args.vectors))
        tops.update({s.name: s.top(s.search()) for s in gpu})   # warm-up: copies to the GPU, calibrates there
        systems += gpu
    seconds = {s.name: [] for s in systems}
    for _ in range(args.repeats):
        for s in systems:
            start = time.perf_counter()
            s.search()
            seconds[s.name].append(time.perf_counter() - start)
    exact = tops[systems[0].name]
    base = np.median(seconds[systems[0].name])
    rows = []
    for s in systems:
        median = float(np.median(seconds[s.name]))
        rows.append({'docs': docs, 'system': s.name, 'setting': s.setting(), 'queries/s': len(queries) / median,
                     'x cpu': base / median,
                     'median s': median, 'min s': min(seconds[s.name]), 'max s': max(seconds[s.name]),
                     **agreement(tops[s.name], exact), 'build s': build})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--docs', type=int, nargs='+', default=[20000, 100000])
    parser.add_argument('--queries', type=int, default=200)
    parser.add_argument('--vectors', type=int, default=8)
    parser.add_argument('--dim', type=int, default=128)
    parser.add_argument('--topics', type=int, default=2000)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--cpu-threads', type=int, nargs='+', default=[2, 16])
    parser.add_argument('--out', type=Path, default=Path(__file__).parent / 'results' / 'bench_gpu')
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        rows = [row for docs in args.docs for row in bench(docs, args, Path(work))]
    table = pd.DataFrame(rows)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'
    machine = (f'{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, GPU: {gpu}; '
               f'{faiss_build()}')
    write_report(args.out, "The index's CUDA path against its CPU path", __doc__.split('\n\n', 2)[2] +
                 f'\n\nMachine: {machine}; torch {torch.__version__}.', {'Rankings and speed': table},
                 extra={'machine': machine, 'seconds': time.perf_counter() - start, 'args': vars(args)})
    print(table.to_string(index=False, float_format='%.4f'))


if __name__ == '__main__':
    main()
