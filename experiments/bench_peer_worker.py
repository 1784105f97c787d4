"""One engine's side of experiments/bench_peers.py, run in a fresh process by a Python that has the engine:
PyLate pins its own torch and fast-plaid, so each engine lives in its own venv.

    python bench_peer_worker.py JOB.json

JOB.json: ``engine`` (index, fast-plaid, pylate-plaid, pylate-voyager or muvera), ``index`` (a MultiVectorIndex
folder: its vectors are read with numpy alone, docids 0..n-1 in order), ``queries`` (.npy of equal-length queries),
``reference`` (.json: qid q<i> to its exact top 10 docids), ``work`` (a folder for the peers' built indexes),
``threads``, ``repeats``, ``reuse`` (whether a peer's earlier build may be reopened), ``slowest s`` (null, or the
seconds past which a setting's first run cuts its sweep), ``index build`` (null, or the
times and peak memory of the index's FAISS stage and calibration, made already in its folder), and ``builds``: a
list of ``{"build": {...}, "searches": [{...}, ...]}``, the engine's build and search parameters. For each build:
the build is timed, each search setting runs once (its top 10 gives recall@10 against the reference), then
``repeats`` rounds each run every setting once (interleaved). The settings of a sweep (those naming the same
parameters, listed from the cheapest) stop at the first one whose recall@10 reaches 0.99, or that took longer than a
setting already run that reached 0.99: the larger ones cost more and cannot be the fastest at a matched recall of
0.95 or 0.99; and at the first one that took longer than ``slowest s`` without reaching it (not timed further: its
"rounds s" is null; the build's rows: "cut by time"). Prints one JSON list of rows as the last line: engine, build,
search, "rounds s", recall@10, "build s", "index bytes", and the process's peak resident memory (VmHWM, reset before
each phase) during the build and during the searches ("build peak RSS MiB", "search peak RSS MiB": the interpreter
and its libraries included, and the pages of memory-mapped files read), and its RSS before the first build, with
torch imported ("baseline RSS MiB"), and just before each build ("build baseline RSS MiB").

A peer's build lands in a folder of ``work`` named by a hash of what made it (engine, its version, the build
parameters, the stored vectors' checksums, threads); its record (build.json: build s, build peak RSS MiB, the time
it was built) is written last, by rename, so a folder without one is an unfinished build and is built again. With
``reuse``, a build whose record exists is reopened and its row carries the record's figures and "built at" (a
million documents take fast-plaid 80 minutes on 2 threads). The index's own FAISS stage and calibration are made
anew, unless ``index build`` says they were made already (then they are read, and the row carries its figures).
"""
import gc
import hashlib
import json
import shutil
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

K = 10
#: A sweep stops at its first setting reaching this recall@10 (the highest recall the benchmark matches).
STOP_RECALL = 0.99


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

    package = 'fast-plaid'

    def __init__(self, folder, vectors, offsets, dim, build, built):
        import torch
        from fast_plaid import search
        self.engine, self.folder = search.FastPlaid(index=str(folder), device='cpu'), folder
        if not built:
            self.engine.create(documents_embeddings=[torch.from_numpy(d) for d in documents(vectors, offsets)],
                               **build)

    def search(self, queries, setting):
        import torch
        found = self.engine.search(queries_embeddings=torch.from_numpy(queries), top_k=K, show_progress=False,
                                   **setting)
        return [[int(d) for d, _ in hits] for hits in found]


class PylatePlaid:
    """PyLate's PLAID index (fast-plaid underneath) with ``nbits`` codes; searches by ``n_ivf_probe`` and
    ``n_full_scores`` (constructor arguments of an index object reopened on the same folder)."""

    package = 'pylate'

    def __init__(self, folder, vectors, offsets, dim, build, built):
        from pylate import indexes
        if not built:
            plaid = indexes.PLAID(index_folder=str(folder), index_name='plaid', override=True, show_progress=False,
                                  device='cpu', **build)
            plaid.add_documents(documents_ids=[str(i) for i in range(len(offsets) - 1)],
                                documents_embeddings=documents(vectors, offsets))
        self.folder, self.build, self.retrievers = folder, build, {}

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

    package = 'pylate'

    def __init__(self, folder, vectors, offsets, dim, build, built):
        from pylate import indexes
        if not built:
            voyager = indexes.Voyager(index_folder=str(folder), index_name='voyager', override=True,
                                      embedding_size=dim, **build)
            voyager.add_documents(documents_ids=[str(i) for i in range(len(offsets) - 1)],
                                  documents_embeddings=documents(vectors, offsets))
        self.folder, self.build, self.dim, self.retrievers = folder, build, dim, {}

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

    package = 'muvera-python'

    def __init__(self, folder, vectors, offsets, dim, build, built):
        from muvera import Muvera as Encoder
        self.encoder = Encoder(dimension=dim, projection_type='ams_sketch', seed=42, **build)
        if not built:
            docs = documents(vectors, offsets)
            np.save(folder / 'encodings.npy', np.concatenate([self.encoder.encode_documents(docs[i:i + 4096])
                                                              for i in range(0, len(docs), 4096)]).astype(np.float32))
        self.fdes = np.load(folder / 'encodings.npy')
        self.folder, self.vectors, self.offsets = folder, vectors, offsets

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
    candidate count and search effort calibrated, both timed, for approximate searches; searches are retriever
    arguments (a candidate count searches at the calibrated effort)."""

    def __init__(self, job, build):
        from pyterrier_multiquery.index import MultiVectorIndex
        from pyterrier_multiquery.index.ann import load_or_build
        from pyterrier_multiquery.index.calibration import calibrated
        self.index = MultiVectorIndex(job['index'], verbose=False)
        self.threads, self.retrievers, self.folder = job['threads'], {}, Path(job['index'])
        self.extra, self.record = {}, None
        if build.get('ann'):
            made = job.get('index build')  # made already by the caller (bench_index.py), with its figures
            if made is None:
                for old in self.folder.glob('ann.*.faiss'):
                    old.unlink()  # an earlier run's: built again, timed
            start = time.perf_counter()
            load_or_build(self.index, 'ivf')
            self.extra['ANN build s'] = time.perf_counter() - start
            start = time.perf_counter()
            approximate = self.index.ann_retriever(num_results=K, threads=self.threads)
            found = approximate.calibrate() if made is None else calibrated(approximate)  # measured, or the maker's
            self.extra['calibration s'] = time.perf_counter() - start
            self.extra['calibrated candidates'] = found.candidates
            self.extra['calibrated search effort'] = found.search_effort
            if made is not None:  # the files were read, not made: the figures are the maker's
                self.extra.update({'ANN build s': made['ANN build s'], 'calibration s': made['calibration s']})
                self.record = {'build s': made['ANN build s'] + made['calibration s'],
                               'build peak RSS MiB': made['ANN build peak RSS MiB'],
                               'build baseline RSS MiB': made['ANN build baseline RSS MiB']}
        else:  # exact search needs the stored vectors alone
            self.folder = [f for f in self.folder.iterdir() if not f.name.startswith('ann.')]

    def search(self, queries, setting):
        import pandas as pd
        key = json.dumps(setting, sort_keys=True)
        if key not in self.retrievers:
            setting = dict(setting)
            search = self.index.retriever if setting.pop('exact', True) else self.index.ann_retriever
            effort = {'search_effort': self.extra['calibrated search effort']} if 'candidates' in setting else {}
            self.retrievers[key] = search(num_results=K, threads=self.threads, **{**effort, **setting})
        frame = self.retrievers[key](pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))],
                                                   'query_embs': list(queries)}))
        frame = frame.sort_values(['qid', 'rank'])
        found = frame.groupby('qid', sort=False)['docid'].apply(list)
        return [[int(d) for d in found[f'q{i}']] for i in range(len(queries))]


def warm_up(engine, queries: np.ndarray, settings: list, reference: dict, slowest: float = np.inf) -> tuple:
    """Runs each setting once: ``(settings run, their recall@10, the positions of those that cut a sweep by time)``.

    A sweep (the settings naming the same parameters) stops at its first setting whose recall@10 reaches
    :data:`STOP_RECALL`, or that took longer than a setting already run that reached it (the index's calibrated
    default, exact search on MiniLM's token vectors, against its candidate counts): that setting, and the larger
    ones, cannot be the fastest at a matched recall. It is cut at its first setting that took longer than
    ``slowest`` seconds without reaching it: the larger ones are slower still (that setting is not timed further)."""
    searches, recalls, stopped, fastest_reaching, cut = [], [], set(), np.inf, set()
    for setting in settings:
        sweep = tuple(sorted(setting))
        if sweep in stopped:
            continue
        start = time.perf_counter()
        found = engine.search(queries, setting)
        seconds = time.perf_counter() - start
        searches.append(setting)
        recalls.append(float(np.mean([len(set(f) & set(reference[f'q{i}'])) / K for i, f in enumerate(found)])))
        if recalls[-1] >= STOP_RECALL:
            fastest_reaching = min(fastest_reaching, seconds)
        if recalls[-1] >= STOP_RECALL or seconds > fastest_reaching:
            stopped.add(sweep)
        elif seconds > slowest:
            stopped.add(sweep)
            cut.add(len(searches) - 1)
    return searches, recalls, cut


PEERS = {'fast-plaid': FastPlaid, 'pylate-plaid': PylatePlaid, 'pylate-voyager': PylateVoyager, 'muvera': Muvera}


def build_folder(job, build) -> Path:
    """The folder of a peer's build, named by a hash of what made it."""
    meta = json.loads((Path(job['index']) / 'pt_meta.json').read_text())
    made_of = {'engine': job['engine'], 'version': version(PEERS[job['engine']].package), 'build': build,
               'vectors': meta['sha256'], 'threads': job['threads']}
    digest = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]
    return Path(job['work']) / f"{job['engine']}-{digest}"


def open_peer(job, vectors, offsets, dim, build):
    """(engine, its record): a build reopened where ``job['reuse']`` and a finished one exists, else built anew and
    timed (the record's build s and build peak RSS MiB, then written, by rename)."""
    folder = build_folder(job, build)
    record_file = folder / 'build.json'
    if job.get('reuse') and record_file.exists():
        record = json.loads(record_file.read_text())
        return PEERS[job['engine']](folder, vectors, offsets, dim, build, built=True), record
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    baseline, start = memory_mib('VmRSS'), time.perf_counter()
    engine = PEERS[job['engine']](folder, vectors, offsets, dim, build, built=False)
    record = {'build s': time.perf_counter() - start, 'build peak RSS MiB': memory_mib('VmHWM'),
              'build baseline RSS MiB': baseline, 'built at': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}
    partial = folder / 'build.json.tmp'
    partial.write_text(json.dumps(record))
    partial.rename(record_file)
    return engine, {key: value for key, value in record.items() if key != 'built at'}


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
        if job['engine'] == 'index':
            before, start = memory_mib('VmRSS'), time.perf_counter()
            engine = Index(job, plan['build'])
            record = engine.record or {'build s': time.perf_counter() - start,
                                       'build peak RSS MiB': memory_mib('VmHWM'), 'build baseline RSS MiB': before}
        else:
            engine, record = open_peer(job, vectors, offsets, dim, plan['build'])
        gc.collect()
        reset_peak()
        searches, recalls, cut = warm_up(engine, queries, plan['searches'], reference,
                                         job.get('slowest s') or np.inf)
        rounds = [None if i in cut else [] for i in range(len(searches))]
        for _ in range(job['repeats']):
            for setting, seconds in zip(searches, rounds):
                if seconds is None:
                    continue
                start = time.perf_counter()
                engine.search(queries, setting)
                seconds.append(time.perf_counter() - start)
        search_peak = memory_mib('VmHWM')
        extra = getattr(engine, 'extra', {})
        for setting, seconds, recall in zip(searches, rounds, recalls):
            rows.append({'engine': job['engine'], 'build': plan['build'], 'search': setting, 'rounds s': seconds,
                         'recall@10': recall, 'index bytes': folder_bytes(engine.folder),
                         'search peak RSS MiB': search_peak, 'baseline RSS MiB': baseline, 'cut by time': bool(cut),
                         **record, **extra})
    print(json.dumps(rows))


if __name__ == '__main__':
    main(*sys.argv[1:])
