"""Benchmark of the MultiVectorIndex: queries per second and recall@10 against exact MaxSim.

    python experiments/bench_index.py [--docs 100000 --vectors 8 --dim 128 --queries 200]
                                      [--pylate-python /path/to/venv/bin/python] [--device cuda]

Random vectors clustered around topic centres (pyterrier_multiquery.index.synthetic). Rows: the project's
exact MaxSim, its approximate MaxSim (IVF candidates, several candidate depths; SQ8 and optional HNSW),
a plain numpy brute force, and PyLate's PLAID and Voyager indexes on the same vectors when a Python with
PyLate is given (PyLate pins another torch, so it runs in its own environment: see
experiments/bench_pylate_worker.py). Writes experiments/results/bench_index.{json,md}.
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index.synthetic import clustered_collection

RESULTS = Path(__file__).parent / 'results'


def folder_bytes(path: Path, pattern: str = '*') -> int:
    return sum(f.stat().st_size for f in path.rglob(pattern) if f.is_file())


def recall_at_10(reference: dict, found: dict) -> float:
    return float(np.mean([len(set(reference[q]) & set(found.get(q, []))) / len(reference[q]) for q in reference]))


def top10(frame: pd.DataFrame) -> dict:
    return {qid: list(group.sort_values('rank')['docno'][:10]) for qid, group in frame.groupby('qid')}


def timed(retriever, topics):
    retriever(topics.iloc[:2])  # warm-up: loads files, builds or reads the FAISS stage
    start = time.perf_counter()
    out = retriever(topics)
    return out, time.perf_counter() - start


def numpy_brute_force(path: Path, queries, k: int = 10) -> tuple:
    """Plain numpy MaxSim over all vectors held in memory (every document has the same number of vectors)."""
    meta = json.loads((path / 'pt_meta.json').read_text())
    offsets = np.fromfile(path / 'offsets.i8', dtype=np.int64)
    per_doc = int(offsets[1])
    if not (np.diff(offsets) == per_doc).all():
        return None, None
    vectors = np.fromfile(path / 'vecs.f4', dtype=np.float32).reshape(meta['doc_count'], per_doc, meta['dim'])
    start = time.perf_counter()
    found = {}
    for i, query in enumerate(queries):
        scores = (vectors @ query.T).max(axis=1).mean(axis=1)
        top = np.argpartition(-scores, k)[:k]
        found[f'q{i}'] = [f'd{j}' for j in top[np.argsort(-scores[top])]]
    return found, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--docs', type=int, default=100_000)
    parser.add_argument('--vectors', type=int, default=8)
    parser.add_argument('--dim', type=int, default=128)
    parser.add_argument('--queries', type=int, default=200)
    parser.add_argument('--candidates', type=int, nargs='+', default=[16, 32, 64, 128])
    parser.add_argument('--hnsw', action='store_true', help='also time an HNSW candidate stage (slow to build)')
    parser.add_argument('--device', default=None, help='torch/FAISS device (default: CUDA if available)')
    parser.add_argument('--pylate-python', help='a Python interpreter with PyLate installed')
    parser.add_argument('--work-dir', help='where the index is built (default: a temporary folder)')
    parser.add_argument('--out', default=str(RESULTS / 'bench_index'))
    args = parser.parse_args()

    work = Path(args.work_dir or tempfile.mkdtemp(prefix='bench_index-'))
    path = work / 'index.mvi'
    shutil.rmtree(path, ignore_errors=True)
    docs, queries = clustered_collection(args.docs, dim=args.dim, min_vectors=args.vectors, max_vectors=args.vectors,
                                         query_count=args.queries, query_vectors=8, seed=0)
    start = time.perf_counter()
    index = MultiVectorIndex(path).index(docs)
    index_seconds = time.perf_counter() - start
    stored_bytes = folder_bytes(path)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    rows = []

    exact, seconds = timed(index.maxsim_retriever(num_results=10, device=args.device), topics)
    reference = top10(exact)
    rows.append({'system': 'exact MaxSim (torch)', 'qps': len(queries) / seconds, 'recall@10': 1.0,
                 'build_s': index_seconds, 'disk_MB': stored_bytes / 2**20, 'bytes/vector': index.bytes_per_vector()})

    found, seconds = numpy_brute_force(path, queries)
    if found is not None:
        rows.append({'system': 'numpy brute force', 'qps': len(queries) / seconds,
                     'recall@10': recall_at_10(reference, found), 'build_s': index_seconds,
                     'disk_MB': stored_bytes / 2**20, 'bytes/vector': index.bytes_per_vector()})

    stages = [('ivf', None), ('ivf', 'SQ8')] + ([('hnsw', None)] if args.hnsw else [])
    for ann, quantizer in stages:
        before = set(path.glob('ann.*'))
        start = time.perf_counter()
        approximate = index.maxsim_retriever(exact=False, ann=ann, quantizer=quantizer, num_results=10,
                                             device=args.device)
        approximate(topics.iloc[:1])
        build_seconds = time.perf_counter() - start
        ann_file = (set(path.glob('ann.*')) - before).pop()
        ann_bytes = ann_file.stat().st_size
        for candidates in args.candidates:
            retriever = index.maxsim_retriever(exact=False, ann=ann, quantizer=quantizer, candidates=candidates,
                                               num_results=10, device=args.device)
            out, seconds = timed(retriever, topics)
            rows.append({'system': f'approx MaxSim {ann}{"+" + quantizer if quantizer else ""} candidates={candidates}',
                         'qps': len(queries) / seconds, 'recall@10': recall_at_10(reference, top10(out)),
                         'build_s': index_seconds + build_seconds, 'disk_MB': (stored_bytes + ann_bytes) / 2**20,
                         'bytes/vector': index.bytes_per_vector() + ann_bytes / len(index) / args.vectors})

    if args.pylate_python:
        query_file = work / 'queries.npy'
        np.save(query_file, np.stack(queries))
        (work / 'reference.json').write_text(json.dumps(reference))
        worker = Path(__file__).parent / 'bench_pylate_worker.py'
        result = subprocess.run([args.pylate_python, str(worker), str(path), str(query_file),
                                 str(work / 'reference.json'), str(work / 'pylate')], capture_output=True, text=True)
        if result.returncode != 0:
            print(result.stderr[-3000:], file=sys.stderr)
            rows.append({'system': 'PyLate (failed: see stderr)'})
        else:
            rows.extend(json.loads(result.stdout.strip().splitlines()[-1]))
    else:
        rows.append({'system': 'PyLate: not run (no --pylate-python)'})

    table = pd.DataFrame(rows)
    setting = f'{args.docs} docs x {args.vectors} vectors x {args.dim} dims, {args.queries} queries of 8 vectors'
    print(setting)
    print(table.to_string(index=False, float_format='%.3f'))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + '.json').write_text(json.dumps({'setting': setting, 'rows': rows}, indent=2) + '\n')
    Path(args.out + '.md').write_text(f'{setting}\n\n```\n{table.to_string(index=False, float_format="%.3f")}\n```\n')
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
