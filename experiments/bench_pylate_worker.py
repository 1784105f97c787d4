"""PyLate's side of experiments/bench_index.py, run by a Python that has PyLate (which pins its own torch).

    python bench_pylate_worker.py INDEX_DIR QUERIES.npy REFERENCE.json WORK_DIR

Reads the MultiVectorIndex files of the synthetic collection (docnos d0..dn-1, in order) with numpy alone,
indexes the same vectors with PyLate's PLAID (and Voyager when PYLATE_VOYAGER=1: its HNSW build is slow on a
small machine), and prints one JSON list of result rows as the last line.
"""
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob('*') if f.is_file())


def main(index_dir, query_file, reference_file, work):
    from pylate import indexes, retrieve
    index_dir, work = Path(index_dir), Path(work)
    meta = json.loads((index_dir / 'pt_meta.json').read_text())
    offsets = np.fromfile(index_dir / 'offsets.i8', dtype=np.int64)
    vectors = np.memmap(index_dir / 'vecs.f4', dtype=np.float32, mode='r', shape=(meta['vec_count'], meta['dim']))
    docnos = [f'd{i}' for i in range(meta['doc_count'])]
    documents = [np.array(vectors[offsets[i]:offsets[i + 1]]) for i in range(meta['doc_count'])]
    queries = list(np.load(query_file))
    reference = json.loads(Path(reference_file).read_text())
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    def measure(name, index, build_seconds, folder, **retrieve_args):
        retriever = retrieve.ColBERT(index=index)
        retriever.retrieve(queries_embeddings=queries[:2], k=10, **retrieve_args)  # warm-up
        start = time.perf_counter()
        results = retriever.retrieve(queries_embeddings=queries, k=10, **retrieve_args)
        seconds = time.perf_counter() - start
        recall = np.mean([len(set(reference[f'q{i}']) & {r['id'] for r in hits}) / len(reference[f'q{i}'])
                          for i, hits in enumerate(results)])
        size = folder_bytes(folder)
        return {'system': name, 'qps': len(queries) / seconds, 'recall@10': float(recall), 'build_s': build_seconds,
                'disk_MB': size / 2**20, 'bytes/vector': size / meta['vec_count']}

    rows = []
    start = time.perf_counter()
    plaid = indexes.PLAID(index_folder=str(work), index_name='plaid', override=True, show_progress=False, device='cpu')
    plaid.add_documents(documents_ids=docnos, documents_embeddings=documents)
    build = time.perf_counter() - start
    rows.append(measure('PyLate PLAID (defaults: nbits=4, n_ivf_probe=8)', plaid, build, work / 'plaid'))
    deeper = indexes.PLAID(index_folder=str(work), index_name='plaid', override=False, show_progress=False,
                           device='cpu', n_ivf_probe=32, n_full_scores=16384)
    rows.append(measure('PyLate PLAID (n_ivf_probe=32, n_full_scores=16384)', deeper, build, work / 'plaid'))

    if os.environ.get('PYLATE_VOYAGER') == '1':
        start = time.perf_counter()
        voyager = indexes.Voyager(index_folder=str(work), index_name='voyager', override=True,
                                  embedding_size=meta['dim'])
        voyager.add_documents(documents_ids=docnos, documents_embeddings=documents)
        rows.append(measure('PyLate Voyager', voyager, time.perf_counter() - start, work / 'voyager'))
    print(json.dumps(rows))


if __name__ == '__main__':
    main(*sys.argv[1:])
