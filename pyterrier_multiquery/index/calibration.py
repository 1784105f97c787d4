"""The approximate search's candidate count and search effort, measured on the index itself by an explicit step
(:meth:`~.ann_retriever.ApproxMaxSimRetriever.calibrate`): a self-test on sampled documents.

An ANN stage needs more candidates per query vector as a collection grows and as its vectors crowd together, and past
some count exact search is the cheaper way to the same ranking. How much of the FAISS index each query vector visits
(IVF lists probed, HNSW's ``efSearch``) trades against the candidate count: fewer lists probed cost less but need more
candidates for the same recall. :func:`calibrate` finds, for each search effort of :data:`SEARCH_EFFORTS` (or the one
the retriever names), the smallest candidate count whose recall against exact search, at the depth the retriever asks
for (its ``num_results``, up to :data:`MAX_DEPTH`), reaches :data:`TARGET_RECALL` on documents of the index used as
queries (each document's own vectors, at most :data:`QUERY_VECTORS` of them, itself excluded from both rankings): that
part is deterministic, the same on every run. Which of these efforts is fastest, and whether it beats exact search, is
timed, so it holds for the machine it ran on: the answer is kept per machine and kind of device, in
:func:`calibration_dir` (outside the index folder, so that a copied, shared or uploaded index carries none), and used by
later searches there. A search with no calibration for its machine uses :data:`DEFAULT_CANDIDATES` and
:data:`DEFAULT_SEARCH_EFFORT` and says so once.
"""
import functools
import hashlib
import json
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import building
from pyterrier_multiquery.index.errors import CorruptIndexError

#: Recall (at the retriever's depth) against exact search that the chosen candidate count must reach on the sampled
#: documents: 0.99, the promise to the user's queries, plus about two standard errors of the sample's estimate.
TARGET_RECALL = 0.995
#: Documents used as queries by the self-test.
SAMPLE_DOCUMENTS = 128
#: Vectors of a sampled document that make its query (drawn at random from longer ones): a query's length, such as
#: ColBERT's 32 tokens, not a long document's.
QUERY_VECTORS = 32
#: Candidate counts tried, in this order, until one reaches :data:`TARGET_RECALL`.
CANDIDATE_COUNTS = tuple(round(16 * 2 ** (step / 2)) for step in range(19))   # 16, 23, 32, 45, ... 8192
#: Search efforts tried where the retriever names none, the usual one first (FAISS's flat index has no effort).
SEARCH_EFFORTS = (32, 16, 8, 4, 64)
#: The search effort where the candidate count is given and the effort is not, or where nothing was calibrated.
DEFAULT_SEARCH_EFFORT = 32
#: The candidate count where nothing was calibrated on this machine.
DEFAULT_CANDIDATES = 256
#: Timed repeats of the exact and the approximate search at each effort's count (interleaved; medians compared).
REPEATS = 3
#: Bumped when the self-test changes, so that calibrations made by an older one are redone.
VERSION = 2
#: The deepest ranking a calibration measures recall at (a retriever asking for more is calibrated at this depth).
MAX_DEPTH = 1000


@dataclass(frozen=True)
class Calibration:
    """What the self-test found for one index build and ANN setting.

    Attributes:
        candidates: The candidate count to search with; None where exact search is the faster way (or no count
            tried reached the target recall).
        search_effort: The search effort to search with (the fastest reaching the target; where none did, the
            last tried).
        recall: Recall at that effort and its last count tried, on the sampled documents.
        approx_s: Median seconds of the approximate search of the sample there.
        exact_s: Median seconds of the exact search of the sample.
        tried: ``{effort: {count: recall}}`` of every effort and count tried.
    """
    candidates: Optional[int]
    search_effort: int
    recall: float
    approx_s: float
    exact_s: float
    tried: dict


def calibration_dir() -> Path:
    """Where this machine keeps its calibrations: ``$PYTERRIER_MULTIQUERY_CALIBRATIONS``, else
    ``~/.cache/pyterrier_multiquery/calibrations``."""
    return Path(os.environ.get('PYTERRIER_MULTIQUERY_CALIBRATIONS',
                               Path.home() / '.cache' / 'pyterrier_multiquery' / 'calibrations'))


@functools.lru_cache(maxsize=None)
def machine(device: str) -> str:
    """What a calibration's timings hold for: the host, its processor and, on a GPU, the card (read once per
    process and device: every search asks)."""
    parts = [platform.node(), platform.machine(), platform.processor(), str(os.cpu_count())]
    if device.startswith('cuda'):
        with requires('dense'):
            import torch
        parts.append(torch.cuda.get_device_name(torch.device(device)))
    return hashlib.sha256('|'.join(parts).encode()).hexdigest()[:16]


def calibration_file(retriever) -> Path:
    """Where the calibration of an approximate retriever's index build and ANN setting is kept on this machine, one
    per kind of device (``cpu`` or ``cuda``: which search is faster depends on it); a retriever that names no search
    effort has the efforts calibrated."""
    build_id = retriever.index.payload()[0]['build_id']
    effort = 'auto' if retriever.search_effort is None else retriever.search_effort
    device = retriever.device.split(':')[0]
    return calibration_dir() / build_id / (f'{retriever.ann}_{retriever.quantizer}_e{effort}_{retriever.aggregate}_'
                                           f'k{depth(retriever)}_{device}_{machine(retriever.device)}.json')


def depth(retriever) -> int:
    """The ranking depth a retriever is calibrated at: its ``num_results``, up to :data:`MAX_DEPTH`."""
    return min(retriever.num_results, MAX_DEPTH)


def stored(retriever) -> Optional[Calibration]:
    """This machine's calibration of the retriever's index build and ANN setting, if one was made.

    Raises:
        CorruptIndexError: If the calibration file changed since it was written (named).
    """
    return _read(calibration_file(retriever))


def _read(path: Path) -> Optional[Calibration]:
    """The calibration kept at ``path`` by this version of the self-test, if any (:func:`stored`)."""
    if not path.exists():
        return None
    found = read_calibration_file(path)
    return _from_json(found['calibration']) if found['version'] == VERSION else None


_WARNED = set()


def stored_setting(retriever) -> tuple:
    """The candidate count (None: exact search) and search effort of this machine's calibration for the retriever,
    else :data:`DEFAULT_CANDIDATES` and its search effort or :data:`DEFAULT_SEARCH_EFFORT`, with a warning (once per
    index and setting) that names ``calibrate()``."""
    path = calibration_file(retriever)
    found = _read(path)
    if found is not None:
        return found.candidates, found.search_effort
    if path not in _WARNED:
        _WARNED.add(path)
        warnings.warn(f'{retriever!r} is not calibrated on this machine: searching with {DEFAULT_CANDIDATES} '
                      'candidates a query vector; call its calibrate() once to measure the candidates and search '
                      'effort this index needs here (or give candidates=)', stacklevel=3)
    return DEFAULT_CANDIDATES, retriever.search_effort or DEFAULT_SEARCH_EFFORT


def calibrated(retriever, remeasure: bool = False) -> Calibration:
    """This machine's calibration of an approximate retriever's index and ANN setting: the one kept, unless
    ``remeasure``, else made (:func:`calibrate`) and kept (through a temporary name).

    Raises:
        CorruptIndexError: If the calibration file changed since it was written (named).
    """
    index = retriever.index
    build_id = index.payload()[0]['build_id']
    found = None if remeasure else stored(retriever)
    if found is not None:
        return found
    found = calibrate(retriever)
    if index.payload()[0]['build_id'] == build_id:   # not when the index was replaced meanwhile
        body = {'build_id': build_id, 'version': VERSION, 'target_recall': TARGET_RECALL,
                'sample_documents': SAMPLE_DOCUMENTS, 'machine': machine(retriever.device),
                'calibration': _to_json(found)}
        path = calibration_file(retriever)
        path.parent.mkdir(parents=True, exist_ok=True)
        with building(path) as tmp:
            tmp.write_text(json.dumps({**body, 'sha256': _digest(body)}, indent=2))
    return found


def read_calibration_file(path: Path) -> dict:
    """The content of a calibration file, checked against the checksum written with it.

    Raises:
        CorruptIndexError: If the file is not the JSON written, or changed since (named).
    """
    try:
        stored = json.loads(path.read_text())
        if isinstance(stored, dict) and stored.get('sha256') == _digest(
                {k: v for k, v in stored.items() if k != 'sha256'}):
            return stored
    except (ValueError, UnicodeDecodeError):
        pass
    raise CorruptIndexError(f'calibration file {str(path)!r} changed since it was written (delete it to calibrate '
                            f'again)')


def _to_json(found: Calibration) -> dict:
    """A calibration as JSON, its counts as strings (as they read back)."""
    return {**asdict(found), 'tried': {str(e): {str(c): r for c, r in counts.items()}
                                       for e, counts in found.tried.items()}}


def _from_json(found: dict) -> Calibration:
    """The calibration of :func:`_to_json`."""
    return Calibration(**{**found, 'tried': {int(e): {int(c): r for c, r in counts.items()}
                                             for e, counts in found['tried'].items()}})


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def calibrate(retriever) -> Calibration:
    """Runs the self-test of an approximate retriever's index and ANN setting
    (:class:`~.ann_retriever.ApproxMaxSimRetriever`): up to
    :data:`SAMPLE_DOCUMENTS` documents of the index (drawn with a fixed seed) search it with their own vectors (at
    most :data:`QUERY_VECTORS` of them), exactly and, at each search effort (the retriever's, or each of
    :data:`SEARCH_EFFORTS`), over ANN candidates at each of :data:`CANDIDATE_COUNTS` in turn.

    At each effort the first count whose recall (at the retriever's depth) reaches :data:`TARGET_RECALL` is its
    candidate; its counts stop early once a search is no faster than exact search or than the fastest candidate so far
    (larger counts are slower still). The candidates and exact search are then timed in :data:`REPEATS` interleaved
    rounds; the fastest candidate (by median) is kept if it is faster than exact search. Each document is left out of
    its own rankings.
    """
    from pyterrier_multiquery.index.checks import ScoreCheck
    index = retriever.index
    payload = index.payload()
    _, vectors, offsets, docnos = payload
    doc_count = len(offsets) - 1
    sample = np.sort(np.random.default_rng(0).choice(doc_count, min(SAMPLE_DOCUMENTS, doc_count), replace=False))
    ScoreCheck([], payload, index.path).stored_vectors(sample)   # a damaged document is named, not used as a query
    rng = np.random.default_rng(1)
    queries = pd.DataFrame({'qid': [str(docnos.fwd[i]) for i in sample],
                            'query_embs': [np.asarray(vectors[offsets[i] + np.sort(rng.permutation(
                                offsets[i + 1] - offsets[i])[:QUERY_VECTORS])], dtype=np.float32) for i in sample]})
    if retriever.search_effort is not None:
        efforts = (retriever.search_effort,)
    else:
        efforts = (DEFAULT_SEARCH_EFFORT,) if retriever.ann == 'flat' else SEARCH_EFFORTS

    from pyterrier_multiquery.index.maxsim import MaxSimRetriever
    top = depth(retriever)
    common = dict(num_results=top + 1, aggregate=retriever.aggregate, device=retriever.device,
                  verbose=retriever.verbose)

    def approximate(count: int, effort: int):
        """The retriever's search of the sample, its top ``depth`` + 1, at a candidate count and search effort."""
        return type(retriever)(index, ann=retriever.ann, quantizer=retriever.quantizer, candidates=count,
                               search_effort=effort, **common)
    exact = MaxSimRetriever(index, **common)
    truth = _top_others(exact(queries), top)
    exact_times = [_seconds(exact, queries)]
    if doc_count <= top + 1:   # every document is in every ranking
        return Calibration(None, efforts[0], 1., float('nan'), exact_times[0], {})
    tried, reached, last = {}, {}, None
    bar = pt.tqdm(total=len(efforts) * len(CANDIDATE_COUNTS) + REPEATS - 1, unit='setting',
                  desc=f'calibrating the {retriever.ann} search of {index.path} on this machine')
    for effort in efforts:
        tried[effort] = {}
        for count in CANDIDATE_COUNTS:
            bar.update()
            approx = approximate(count, effort)
            found = _top_others(approx(queries), top)   # the first search also loads (or builds) the FAISS index
            recall = float(np.mean([len(set(found.get(qid, ())) & set(ranking)) / len(ranking)
                                    for qid, ranking in truth.items()]))
            tried[effort][count] = recall
            seconds = _seconds(approx, queries)
            last = (effort, recall, seconds)
            if seconds >= min([*exact_times, *(times[0] for _, _, times in reached.values())]):
                break
            if recall >= TARGET_RECALL:
                reached[effort] = (approx, recall, [seconds])
                break
    bar.total = bar.n + (REPEATS - 1 if reached else 0)   # the counts left untried once one sufficed
    if not reached:
        bar.close()
        effort, recall, seconds = last
        return Calibration(None, effort, recall, seconds, min(exact_times), tried)
    for _ in range(REPEATS - 1):
        bar.update()
        exact_times.append(_seconds(exact, queries))
        for approx, _, times in reached.values():
            times.append(_seconds(approx, queries))
    bar.close()
    effort = min(reached, key=lambda e: np.median(reached[e][2]))
    approx, recall, times = reached[effort]
    approx_s, exact_s = float(np.median(times)), float(np.median(exact_times))
    return Calibration(approx.candidates if approx_s < exact_s else None, effort, recall, approx_s, exact_s, tried)


def _top_others(run: pd.DataFrame, top: int) -> dict:
    """Each query's ``top`` documents other than the document the query was made from, by qid."""
    run = run[run['docno'] != run['qid']].sort_values(['qid', 'rank'])
    return {qid: group['docno'].tolist()[:top] for qid, group in run.groupby('qid', sort=False)}


def _seconds(retriever, queries: pd.DataFrame) -> float:
    """Wall-clock seconds of one search of ``queries``."""
    start = time.perf_counter()
    retriever(queries)
    return time.perf_counter() - start
