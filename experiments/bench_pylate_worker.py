"""PyLate's side of experiments/bench_index.py, run by a Python that has PyLate (which pins its own torch).

    python bench_pylate_worker.py INDEX_DIR QUERIES.npy REFERENCE.json WORK_DIR [REPEATS [THREADS]]

Reads the MultiVectorIndex files of the synthetic collection (docnos d0..dn-1, in order; float32 or float16) with
numpy alone, indexes the same vectors with PyLate's PLAID (and Voyager when PYLATE_VOYAGER=1: its HNSW build is slow
on a small machine), warms each configuration up once, then times REPEATS rounds (default 5) each running every
configuration once (interleaved, as bench_index.py does), on THREADS torch threads. REFERENCE.json maps qid (q<i>)
to the exact top 10 docids; recall@10 is measured over those queries. Prints one JSON list of rows as the last line:
system, "rounds s" (seconds of each round), recall@10, "build s", bytes/vector, "peak RSS rise MiB" (this process's
ru_maxrss rise from after reading the vectors: PLAID's build included).
"""
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob('*') if f.is_file())


def main(index_dir, query_file, reference_file, work, repeats='5', threads=None):
    import torch
    from pylate import indexes, retrieve
    if threads:
        torch.set_num_threads(int(threads))
    index_dir, work = Path(index_dir), Path(work)
    meta = json.loads((index_dir / 'pt_meta.json').read_text())
    name, dtype = {'float32': ('vecs.f4', np.float32), 'float16': ('vecs.f2', np.float16)}[meta.get('dtype', 'float32')]
    offsets = np.fromfile(index_dir / 'offsets.i8', dtype=np.int64)
    vectors = np.memmap(index_dir / name, dtype=dtype, mode='r', shape=(meta['vec_count'], meta['dim']))
    docnos = [f'd{i}' for i in range(meta['doc_count'])]
    documents = [np.asarray(vectors[offsets[i]:offsets[i + 1]], dtype=np.float32) for i in range(meta['doc_count'])]
    queries = list(np.load(query_file))
    reference = {qid: {f'd{d}' for d in docids if d >= 0}
                 for qid, docids in json.loads(Path(reference_file).read_text()).items()}
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    configurations = []  # (name, retriever, build seconds, folder, retrieve arguments)
    start = time.perf_counter()
    plaid = indexes.PLAID(index_folder=str(work), index_name='plaid', override=True, show_progress=False, device='cpu')
    plaid.add_documents(documents_ids=docnos, documents_embeddings=documents)
    build = time.perf_counter() - start
    configurations.append(('PyLate PLAID (defaults: nbits=4, n_ivf_probe=8)', plaid, build, work / 'plaid'))
    deeper = indexes.PLAID(index_folder=str(work), index_name='plaid', override=False, show_progress=False,
                           device='cpu', n_ivf_probe=32, n_full_scores=16384)
    configurations.append(('PyLate PLAID (n_ivf_probe=32, n_full_scores=16384)', deeper, build, work / 'plaid'))
    if os.environ.get('PYLATE_VOYAGER') == '1':
        start = time.perf_counter()
        voyager = indexes.Voyager(index_folder=str(work), index_name='voyager', override=True,
                                  embedding_size=meta['dim'])
        voyager.add_documents(documents_ids=docnos, documents_embeddings=documents)
        configurations.append(('PyLate Voyager', voyager, time.perf_counter() - start, work / 'voyager'))

    retrievers = [retrieve.ColBERT(index=index) for _, index, _, _ in configurations]
    recalls = []
    for retriever in retrievers:  # warm-up, and the results recall is measured on
        results = retriever.retrieve(queries_embeddings=queries, k=10)
        recalls.append(float(np.mean([len(reference[f'q{i}'] & {r['id'] for r in results[i]}) / len(reference[f'q{i}'])
                                      for i in range(len(queries)) if f'q{i}' in reference])))
    rounds = [[] for _ in retrievers]
    for _ in range(int(repeats)):
        for retriever, seconds in zip(retrievers, rounds):
            start = time.perf_counter()
            retriever.retrieve(queries_embeddings=queries, k=10)
            seconds.append(time.perf_counter() - start)
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    print(json.dumps([{'system': name, 'rounds s': seconds, 'recall@10': recall, 'build s': build,
                       'bytes/vector': folder_bytes(folder) / meta['vec_count'], 'peak RSS rise MiB': rss}
                      for (name, _, build, folder), seconds, recall in zip(configurations, rounds, recalls)]))


if __name__ == '__main__':
    main(*sys.argv[1:])
