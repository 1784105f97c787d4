"""One engine's side of experiments/bench_peers.py, run in a fresh process by a Python that has the engine:
PyLate pins its own torch and fast-plaid, so each engine lives in its own venv.

    python bench_peer_worker.py JOB.json

JOB.json: ``engine`` (index, fast-plaid, pylate-plaid, pylate-voyager or muvera), ``index`` (a MultiVectorIndex
folder: its vectors are read with numpy alone, docids 0..n-1 in order), ``queries`` (.npy of equal-length queries),
``reference`` (.json: qid q<i> to its exact top 10 docids), ``work`` (a folder for the engine's index), ``threads``,
``repeats``, and ``builds``: a list of ``{"build": {...}, "searches": [{...}, ...]}``, the engine's build and
search parameters. For each build: the build is timed, each search setting runs once (its top 10 gives recall@10
against the reference), then ``repeats`` rounds each run every setting once (interleaved). Prints one JSON list of
rows as the last line: engine, build, search, "rounds s", recall@10, "build s", "index bytes", and the process's
peak resident memory (VmHWM, reset before each phase) during the build and during the searches ("build peak RSS
MiB", "search peak RSS MiB": the interpreter and its libraries included, and the pages of memory-mapped files read),
and its RSS before the first build, with torch imported ("baseline RSS MiB").
"""
import gc
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

K = 10


def memory_mib(field: str) -> float:
    """A line of /proc/self/status (VmRSS, or VmHWM: the peak since the last :func:`reset_peak`) in MiB."""
    line = next(x for x in Path('/proc/self/status').read_text().splitlines() if x.startswith(field + ':'))
    return int(line.split()[1]) / 1024


def reset_peak() -> None:
    """Sets VmHWM to the current RSS."""
    Path('/proc/self/clear_refs').write_text('5')


def folder_bytes(path) -> int:
    """Bytes of the files of a folder, of a file, or of a list of files."""
    if isinstance(path, list):
        return sum(f.stat().st_size for f in path)
    return sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) if path.is_dir() else path.stat().st_size


def read_index(folder: Path):
    """(vectors, offsets, dim) of a MultiVectorIndex folder, by numpy alone."""
    meta = json.loads((folder / 'pt_meta.json').read_text())
    name, dtype = {'float32': ('vecs.f4', np.float32), 'float16': ('vecs.f2', np.float16)}[meta.get('dtype', 'float32')]
    offsets = np.fromfile(folder / 'offsets.i8', dtype=np.int64)
    vectors = np.memmap(folder / name, dtype=dtype, mode='r', shape=(meta['vec_count'], meta['dim']))
    return vectors, offsets, meta['dim']


def documents(vectors, offsets) -> list:
    return [np.asarray(vectors[offsets[i]:offsets[i + 1]], dtype=np.float32) for i in range(len(offsets) - 1)]


class FastPlaid:
    """fast-plaid: PLAID with ``nbits`` residual codes; searches by ``n_ivf_probe`` and ``n_full_scores``."""

    def __init__(self, job, vectors, offsets, dim, build):
        import torch
        from fast_plaid import search
        folder = Path(job['work']) / f"fast-plaid-{build['nbits']}"
        shutil.rmtree(folder, ignore_errors=True)
        self.engine = search.FastPlaid(index=str(folder), device='cpu')
        self.engine.create(documents_embeddings=[torch.from_numpy(d) for d in documents(vectors, offsets)], **build)
        self.folder = folder

    def search(self, queries, setting):
        import torch
        found = self.engine.search(queries_embeddings=torch.from_numpy(queries), top_k=K, show_progress=False,
                                   **setting)
        return [[int(d) for d, _ in hits] for hits in found]


class PylatePlaid:
    """PyLate's PLAID index (fast-plaid underneath) with ``nbits`` codes; searches by ``n_ivf_probe`` and
    ``n_full_scores`` (constructor arguments of an index object reopened on the same folder)."""

    def __init__(self, job, vectors, offsets, dim, build):
        from pylate import indexes
        self.folder = Path(job['work']) / f"pylate-{build['nbits']}"
        shutil.rmtree(self.folder, ignore_errors=True)
        plaid = indexes.PLAID(index_folder=str(self.folder), index_name='plaid', override=True, show_progress=False,
                              device='cpu', **build)
        plaid.add_documents(documents_ids=[str(i) for i in range(len(offsets) - 1)],
                            documents_embeddings=documents(vectors, offsets))
        self.build, self.retrievers = build, {}

    def search(self, queries, setting):
        from pylate import indexes, retrieve
        key = json.dumps(setting, sort_keys=True)
        if key not in self.retrievers:
            plaid = indexes.PLAID(index_folder=str(self.folder), index_name='plaid', override=False,
                                  show_progress=False, device='cpu', **self.build, **setting)
            self.retrievers[key] = retrieve.ColBERT(index=plaid)
        found = self.retrievers[key].retrieve(queries_embeddings=list(queries), k=K)
        return [[int(r['id']) for r in hits] for hits in found]


class PylateVoyager:
    """PyLate's Voyager (HNSW over every stored vector, ``M`` and ``ef_construction``); searches take ``k_token``
    neighbours of each query vector (``ef_search`` of the reopened index) and re-score their documents."""

    def __init__(self, job, vectors, offsets, dim, build):
        from pylate import indexes
        self.folder = Path(job['work']) / 'voyager'
        shutil.rmtree(self.folder, ignore_errors=True)
        voyager = indexes.Voyager(index_folder=str(self.folder), index_name='voyager', override=True,
                                  embedding_size=dim, **build)
        voyager.add_documents(documents_ids=[str(i) for i in range(len(offsets) - 1)],
                              documents_embeddings=documents(vectors, offsets))
        self.build, self.dim, self.retrievers = build, dim, {}

    def search(self, queries, setting):
        from pylate import indexes, retrieve
        setting = dict(setting)
        k_token = setting.pop('k_token')
        key = json.dumps(setting, sort_keys=True)
        if key not in self.retrievers:
            voyager = indexes.Voyager(index_folder=str(self.folder), index_name='voyager', override=False,
                                      embedding_size=self.dim, **self.build, **setting)
            self.retrievers[key] = retrieve.ColBERT(index=voyager)
        found = self.retrievers[key].retrieve(queries_embeddings=list(queries), k=K, k_token=k_token)
        return [[int(r['id']) for r in hits] for hits in found]


class Muvera:
    """MUVERA: each document's fixed-dimensional encoding (muvera-python, AMS-sketched), an exact inner-product
    search of the queries' encodings for ``rescore`` candidates, then exact MaxSim (float32) of those."""

    def __init__(self, job, vectors, offsets, dim, build):
        from muvera import Muvera as Encoder
        self.encoder = Encoder(dimension=dim, projection_type='ams_sketch', seed=42, **build)
        docs = documents(vectors, offsets)
        self.fdes = np.concatenate([self.encoder.encode_documents(docs[i:i + 4096])
                                    for i in range(0, len(docs), 4096)]).astype(np.float32)
        self.vectors, self.offsets = vectors, offsets
        self.folder = Path(job['work']) / 'muvera.npy'
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        np.save(self.folder, self.fdes)

    def search(self, queries, setting):
        import torch
        encoded = torch.from_numpy(np.asarray(self.encoder.encode_queries(list(queries)), dtype=np.float32))
        fdes = torch.from_numpy(self.fdes)
        candidates = torch.cat([(encoded @ fdes[i:i + 65536].T) for i in range(0, len(fdes), 65536)], 1)
        candidates = candidates.topk(min(setting['rescore'], len(fdes)), dim=1).indices.numpy()
        out = []
        for query, docids in zip(queries, candidates):
            lengths = self.offsets[docids + 1] - self.offsets[docids]
            rows = np.concatenate([np.arange(self.offsets[d], self.offsets[d + 1]) for d in docids])
            sims = torch.from_numpy(np.asarray(self.vectors[rows], dtype=np.float32)) @ torch.from_numpy(query).T
            owner = torch.from_numpy(np.repeat(np.arange(len(docids)), lengths))
            maxima = torch.full((len(docids), len(query)), -torch.inf).scatter_reduce_(
                0, owner[:, None].expand(-1, len(query)), sims, 'amax')
            out.append([int(docids[i]) for i in maxima.mean(1).topk(K).indices])
        return out


class Index:
    """This project's MultiVectorIndex (run by the project's Python): its FAISS candidate stage built and its
    candidate count calibrated, both timed, for approximate searches; searches are retriever arguments."""

    def __init__(self, job, vectors, offsets, dim, build):
        from pyterrier_multiquery.index import MultiVectorIndex
        from pyterrier_multiquery.index.ann import load_or_build
        from pyterrier_multiquery.index.calibration import calibrated
        self.index = MultiVectorIndex(job['index'], verbose=False)
        self.threads, self.retrievers, self.folder = job['threads'], {}, Path(job['index'])
        self.extra = {}
        if build.get('ann'):
            for old in [*self.folder.glob('ann.*.faiss'), *self.folder.glob('calibration.*')]:
                old.unlink()  # an earlier run's: built again, timed
            start = time.perf_counter()
            load_or_build(self.index, 'ivf', verbose=False)
            self.extra['ANN build s'] = time.perf_counter() - start
            start = time.perf_counter()
            self.extra['calibrated candidates'] = calibrated(self.index.maxsim_retriever(
                exact=False, num_results=K, threads=self.threads)).candidates
            self.extra['calibration s'] = time.perf_counter() - start
        else:  # exact search needs the stored vectors alone
            self.folder = [f for f in self.folder.iterdir() if not f.name.startswith(('ann.', 'calibration.'))]

    def search(self, queries, setting):
        import pandas as pd
        key = json.dumps(setting, sort_keys=True)
        if key not in self.retrievers:
            self.retrievers[key] = self.index.maxsim_retriever(num_results=K, threads=self.threads, **setting)
        frame = self.retrievers[key](pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))],
                                                   'query_embs': list(queries)}))
        frame = frame.sort_values(['qid', 'rank'])
        found = frame.groupby('qid', sort=False)['docid'].apply(list)
        return [[int(d) for d in found[f'q{i}']] for i in range(len(queries))]


ENGINES = {'index': Index, 'fast-plaid': FastPlaid, 'pylate-plaid': PylatePlaid, 'pylate-voyager': PylateVoyager,
           'muvera': Muvera}


def main(job_file):
    job = json.loads(Path(job_file).read_text())
    import torch
    torch.set_num_threads(job['threads'])
    vectors, offsets, dim = read_index(Path(job['index']))
    queries = np.load(job['queries']).astype(np.float32)
    reference = json.loads(Path(job['reference']).read_text())
    rows, baseline = [], memory_mib('VmRSS')
    for plan in job['builds']:
        gc.collect()
        reset_peak()
        start = time.perf_counter()
        engine = ENGINES[job['engine']](job, vectors, offsets, dim, plan['build'])
        build_s = time.perf_counter() - start
        build_peak = memory_mib('VmHWM')
        gc.collect()
        reset_peak()
        recalls = []
        for setting in plan['searches']:  # warm-up; its top 10 gives recall
            found = engine.search(queries, setting)
            recalls.append(float(np.mean([len(set(f) & set(reference[f'q{i}'])) / K for i, f in enumerate(found)])))
        rounds = [[] for _ in plan['searches']]
        for _ in range(job['repeats']):
            for setting, seconds in zip(plan['searches'], rounds):
                start = time.perf_counter()
                engine.search(queries, setting)
                seconds.append(time.perf_counter() - start)
        search_peak = memory_mib('VmHWM')
        extra = getattr(engine, 'extra', {})
        for setting, seconds, recall in zip(plan['searches'], rounds, recalls):
            rows.append({'engine': job['engine'], 'build': plan['build'], 'search': setting, 'rounds s': seconds,
                         'recall@10': recall, 'build s': build_s, 'index bytes': folder_bytes(engine.folder),
                         'build peak RSS MiB': build_peak, 'search peak RSS MiB': search_peak,
                         'baseline RSS MiB': baseline, **extra})
    print(json.dumps(rows))


if __name__ == '__main__':
    main(*sys.argv[1:])
