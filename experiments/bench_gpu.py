"""The index's exact search on a GPU against plain torch and fast-plaid, in one run on a lent card (issue 46).

    python experiments/bench_gpu.py [--workloads clustered-20k ...] [--peers [--peer-workloads ...]] [--repeats 3]
                                    [--minilm-model DIR] [--data-root DIR] [--work-dir DIR] [--out PREFIX]

Workloads (bench_index.py's distributions; 200 queries of 8 vectors, top 10): clustered-20k, -100k, -1000k and
-10000k (8 vectors of 128 dimensions a document around 2,000 topic centres, noise 0.5, unit-normalised), ragged-20k
and -100k (4 to 64 vectors a document), dim96-20k (96 dimensions), and minilm-scifact (all-MiniLM-L6-v2's token
vectors of SciFact's abstracts, from the model folder ``--minilm-model``, on a lent machine the 8-bit copy that
``gpu/prepare.sh`` carries, and ``--data-root``/scifact; queries: the first 8 tokens of the test queries). The
synthetic collections are drawn on the GPU, a chunk of documents at a time, and written by ``index_arrays`` in
float16 (the 'build s' column); the first search groups them by length on the GPU ('first search s').

Systems, each called on all queries at once:
- reference: plain torch with every stored vector resident on the GPU in float32: one matmul of all query vectors
  against a block of stored vectors (2^20, or fewer where their similarities would pass 2 GiB), each document's
  maximum by a reshape (equal lengths) or ``scatter_reduce`` (ragged), each query's mean by a reshape, a running
  ``topk``. Made first, so that the index plans its GPU memory around what it leaves (at 10M documents on an 80 GB
  card the index took 40 GiB before the reference, which then ran out of memory).
- index exact (cuda): ``index.retriever(device='cuda')``: documents grouped by length on the GPU in float16 (bfloat16
  where a norm reaches 2^15), the fused Triton kernel (products, maxima and sums in registers), the survivors of its
  error bound scored in float64.
- index exact (cuda, arrays: no frames): the same retriever's ``search`` of the queries' vectors, which returns each
  query's top scores and docids as the reference does: the search without the query frame's checks and the result
  frame (docnos looked up, query columns repeated).
- index exact (cpu): ``index.retriever(device='cpu')`` on every CPU thread, the rankings the others are held to.
- fast-plaid (with ``--peers``, on the 100k and 1M workloads or those of ``--peer-workloads``): fast-plaid 1.7 on
  the same GPU, 4- and 8-bit codes, a grid of ``n_ivf_probe`` x ``n_full_scores``; build seconds, index MiB, peak
  GPU MiB of the build.
- index approximate (cuda) (with ``--approximate``, up to ``--approximate-docs`` documents, where FAISS is
  installed): ``index.ann_retriever(device='cuda')`` after its ``calibrate()`` on the card (FAISS on the GPU where
  it has code for the card, else FAISS's IVF lists searched in torch on the GPU); 'build s' is the FAISS build and
  the calibration, 'setting' what the calibration chose and where the candidate stage searched; with
  ``--approximate-candidates``, also at those candidate counts, at the calibrated search effort.

At matched recall (workloads with fast-plaid): for recall@10 0.95 and 0.99, the fastest search of the index on the
GPU (exact or approximate) and of fast-plaid that reaches it, and the ratio of their queries/s.

Rankings beyond ``--cpu-check-docs`` documents (2M: the 10M row) are held to the reference's top 10 instead.
Timing: one untimed search each, then ``--repeats`` rounds in which every system searches once (the order rotated
a system a round); queries/s from the median, with min and max. 'x reference' divides the reference's median by the
system's; 'TFLOP/s' counts useful products only (2 x query vectors x stored vectors x dims) and '% bf16 peak' divides
it by the bfloat16 matmul peak of an 8192^3 product measured at the start and end of the run (the higher). Rankings:
each system's top 10 against index exact on the CPU: the share of queries in the same order, recall@10, and the
largest score difference on shared docnos. Writes ``--out`` .md/.json after each workload.

Profile: one more search of the index on the GPU under ``torch.profiler``, its phases labelled and timed (checks: the
query frame's columns and qids; queries: the query tensors; bound: each query's error bound; screen: the kernel
launches; bookkeeping: the running top k and survivors; rescore: the survivors' float64 scores; merge: the shards'
tops merged; frame: the result frame; other: the rest of the search, each query's vectors checked and converted among
it; each to the device's end of its work, which the profile's own overhead inflates), written to
``--out``_profile.txt with the kernels that took the most device time.
"""
import argparse
import platform
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pyterrier_multiquery.experiment.evaluation import write_report
from pyterrier_multiquery.index import MultiVectorIndex, exact, grouped, maxsim

K = 10
#: The search device: cuda, or cpu for a dry run of the script (the index then screens by length groups there too).
DEVICE = 'cuda'
QUERIES, QUERY_VECTORS = 200, 8
WORKLOADS = ['clustered-20k', 'ragged-20k', 'dim96-20k', 'clustered-100k', 'ragged-100k', 'clustered-1000k',
             'minilm-scifact', 'clustered-10000k']
PEER_WORKLOADS = ('clustered-100k', 'clustered-1000k')
PLAID_BUILDS = [{'nbits': 4}, {'nbits': 8}]
PLAID_SEARCHES = [{'n_ivf_probe': p, 'n_full_scores': f} for p, f in ((8, 1024), (8, 4096), (32, 8192), (64, 16384))]
#: The recall@10 targets at which the index and fast-plaid are compared (issue 46, item 3).
MATCHED_RECALL = (0.95, 0.99)


def synchronize():
    if DEVICE == 'cuda':
        torch.cuda.synchronize()


def bf16_peak(repeats: int = 10) -> float:
    """bfloat16 TFLOP/s of a square matmul (8192^3 on a GPU): the median of ``repeats`` after three warm-ups."""
    size = 8192 if DEVICE == 'cuda' else 1024
    a, b = (torch.randn(size, size, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    seconds = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        a @ b
        synchronize()
        seconds.append(time.perf_counter() - start)
    return 2 * size ** 3 / float(np.median(seconds)) / 1e12


def clustered_arrays(doc_count: int, dim: int = 128, min_vectors: int = 8, max_vectors: int = 8, topics: int = 2000,
                     spread: float = 0.5, seed: int = 0, chunk: int = 1 << 18):
    """(float16 vectors, lengths, queries): clustered_collection's distribution drawn on the GPU a chunk of documents
    at a time (each document two topics, each vector a topic centre plus noise, normalised; each query 8 vectors
    near a random document's topics)."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    centres = torch.randn(topics, dim, device=DEVICE, generator=generator)
    lengths = torch.randint(min_vectors, max_vectors + 1, (doc_count,), device=DEVICE, generator=generator)
    doc_topics = torch.randint(0, topics, (doc_count, 2), device=DEVICE, generator=generator)
    parts = []
    for start in range(0, doc_count, chunk):
        owner = torch.repeat_interleave(torch.arange(start, min(doc_count, start + chunk), device=DEVICE),
                                        lengths[start:start + chunk])
        picks = doc_topics[owner, torch.randint(0, 2, (len(owner),), device=DEVICE, generator=generator)]
        vectors = centres[picks] + spread * torch.randn(len(owner), dim, device=DEVICE, generator=generator)
        parts.append(torch.nn.functional.normalize(vectors, dim=1).half().cpu().numpy())
    near = torch.randint(0, doc_count, (QUERIES,), device=DEVICE, generator=generator)
    shape = (QUERIES, QUERY_VECTORS)
    picks = doc_topics[near[:, None], torch.randint(0, 2, shape, device=DEVICE, generator=generator)]
    queries = centres[picks] + spread * torch.randn(*shape, dim, device=DEVICE, generator=generator)
    queries = torch.nn.functional.normalize(queries, dim=2).cpu().numpy()
    return np.concatenate(parts), lengths.cpu().numpy(), list(queries)


def minilm_arrays(model: Path, data_root: Path, max_length: int = 256, batch_size: int = 128):
    """(float16 vectors, lengths, queries): all-MiniLM-L6-v2's normalised token vectors of SciFact's abstracts
    ([CLS], [SEP] and padding left out) and of its test queries' first 8 tokens, encoded on the GPU. ``model`` is a
    Hugging Face folder, or one with 8-bit weights (``experiments/gpu/minilm_int8.py``, as prepare.sh carries it)."""
    from gpu import minilm_int8   # experiments/gpu, beside this script
    from transformers import AutoModel, AutoTokenizer
    from pyterrier_multiquery.loaders import load_dataset
    tokenizer = AutoTokenizer.from_pretrained(model)
    if (model / minilm_int8.WEIGHTS).exists():
        encoder = minilm_int8.load(model).to(DEVICE)
    else:
        encoder = AutoModel.from_pretrained(model, dtype=torch.float32).to(DEVICE).eval()
    dataset = load_dataset(data_root / 'scifact')

    def encode(texts):
        out = []
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start:start + batch_size], truncation=True, max_length=max_length, padding=True,
                              return_tensors='pt', return_special_tokens_mask=True)
            keep = (batch.pop('special_tokens_mask') == 0) & (batch['attention_mask'] == 1)
            with torch.no_grad():
                hidden = torch.nn.functional.normalize(encoder(**batch.to(DEVICE)).last_hidden_state, dim=-1)
            out += [h[k].float().cpu().numpy() for h, k in zip(hidden, keep.to(DEVICE))]
        return out

    corpus = list(dataset.get_corpus_iter(verbose=False))
    docs = encode([d['text'] for d in corpus])
    queries = [np.resize(q, (QUERY_VECTORS, q.shape[1])) for q in encode(dataset.get_topics('test')['query'].tolist())]
    return np.concatenate(docs).astype(np.float16), np.array([len(d) for d in docs]), queries[:QUERIES]


def workload(name: str, args):
    """(vectors, lengths, queries) of a workload."""
    if name == 'minilm-scifact':
        return minilm_arrays(args.minilm_model, args.data_root)
    kind, size = name.rsplit('-', 1)
    settings = {'clustered': {}, 'ragged': {'min_vectors': 4, 'max_vectors': 64}, 'dim96': {'dim': 96}}[kind]
    return clustered_arrays(int(size[:-1]) * 1000, **settings)


class Reference:
    """Plain torch, the collection resident on the GPU in float32 (see the module's docstring)."""

    name = 'reference (torch, float32, resident)'

    def __init__(self, vectors, lengths, queries, block: int = 1 << 20):
        block = min(block, (1 << 31) // (4 * len(queries) * len(queries[0])))  # a block's similarities: 2 GiB at most
        self.docs = torch.empty(vectors.shape, device=DEVICE)
        for start in range(0, len(vectors), block):  # a block at a time: no float16 copy of the whole beside it
            self.docs[start:start + block] = torch.from_numpy(vectors[start:start + block]).to(DEVICE).float()
        self.lengths = torch.from_numpy(lengths).to(DEVICE)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.equal = bool((lengths == lengths[0]).all())
        self.queries = torch.from_numpy(np.stack(queries)).to(DEVICE)
        bounds = np.unique(np.append(np.searchsorted(self.offsets, np.arange(0, self.offsets[-1], block)),
                                     len(self.offsets) - 1))
        self.blocks = list(zip(bounds[:-1], bounds[1:]))

    def search(self):
        count, width, dim = self.queries.shape
        flat = self.queries.reshape(-1, dim)
        best = torch.full((count, 0), -torch.inf, device=DEVICE)
        best_ids = torch.zeros((count, 0), dtype=torch.int64, device=DEVICE)
        for first, last in self.blocks:
            rows = self.docs[self.offsets[first]:self.offsets[last]]
            sims = rows @ flat.T  # (stored vectors, query vectors)
            if self.equal:
                maxima = sims.view(last - first, -1, len(flat)).amax(dim=1)
            else:
                owner = torch.repeat_interleave(torch.arange(last - first, device=DEVICE), self.lengths[first:last])
                maxima = torch.full((last - first, len(flat)), -torch.inf, device=DEVICE)
                maxima.scatter_reduce_(0, owner[:, None].expand(-1, len(flat)), sims, 'amax')
            scores = maxima.view(last - first, count, width).mean(dim=2).T
            best = torch.cat([best, scores], dim=1)
            best_ids = torch.cat([best_ids, torch.arange(first, last, device=DEVICE).expand(count, -1)], dim=1)
            best, order = best.topk(min(K, best.shape[1]), dim=1)
            best_ids = best_ids.gather(1, order)
        synchronize()
        return best.cpu().numpy(), best_ids.cpu().numpy()


class IndexSearch:
    """One of the index's retrievers."""

    def __init__(self, name, retriever, topics):
        self.name, self.retriever, self.topics = name, retriever, topics

    def search(self):
        found = self.retriever(self.topics)
        synchronize()
        return found


class ArraySearch:
    """The index's exact search without its frames: the queries' vectors in, each query's top scores and docids out,
    as the reference takes and gives them (what the query checks and the result frame add to a search)."""

    def __init__(self, name, retriever, queries):
        self.name, self.retriever, self.queries = name, retriever, queries
        self.qids = [f'q{i}' for i in range(len(queries))]

    def search(self):
        batches = self.retriever.search(self.queries, self.retriever.index.searchers(), self.qids)
        synchronize()
        return tuple(np.concatenate(parts) for parts in list(zip(*batches))[:2])


class FastPlaid:
    """fast-plaid on the GPU at one build (nbits) and one search setting."""

    def __init__(self, engine, build, setting, queries):
        self.engine, self.setting, self.nbits = engine, setting, build['nbits']
        self.name = f'fast-plaid (nbits={self.nbits}, probe={setting["n_ivf_probe"]}, ' \
                    f'full={setting["n_full_scores"]})'
        self.queries = torch.from_numpy(np.stack(queries)).to(DEVICE)

    def search(self):
        found = self.engine.search(queries_embeddings=self.queries, top_k=K, show_progress=False, **self.setting)
        synchronize()
        return found


#: The phases of a search the profile labels: (label, owner, attribute).
PHASES = [('checks', maxsim, 'validate_frame'), ('checks', maxsim, 'check_unique_qids'),
          ('queries', grouped, 'padded_query_tensors'), ('bound', exact.ScreenedBatch, '__init__'),
          ('screen', grouped, 'screen'), ('bookkeeping', exact.ScreenedBatch, 'add'),
          ('rescore', grouped, 'scored_candidates'), ('merge', maxsim, 'merge_top'), ('frame', maxsim, 'result_frame')]
#: The phases' labels, each once.
LABELS = list(dict.fromkeys(label for label, _, _ in PHASES))


def labelled(function, label: str, seconds: dict):
    """``function`` inside a ``torch.profiler.record_function`` of ``label``, its wall time (to the device's end of
    its work) added to ``seconds[label]``."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        with torch.profiler.record_function(label):
            out = function(*args, **kwargs)
        synchronize()
        seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - start
        return out
    return wrapper


def profile(system, name: str) -> str:
    """A search of ``system`` under the profiler: the labelled phases' wall time (each to the device's end of its
    work) and the kernels that took the most device time."""
    seconds = {}
    originals = [(owner, attribute, getattr(owner, attribute)) for _, owner, attribute in PHASES]
    for (label, owner, attribute), (_, _, original) in zip(PHASES, originals):
        setattr(owner, attribute, labelled(original, label, seconds))
    activities = [torch.profiler.ProfilerActivity.CPU] + \
        ([torch.profiler.ProfilerActivity.CUDA] if DEVICE == 'cuda' else [])
    try:
        with torch.profiler.profile(activities=activities) as profiler:
            labelled(system.search, 'search', seconds)()
    finally:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)
    seconds['other'] = seconds['search'] - sum(seconds.get(label, 0.0) for label in LABELS)
    lines = [f'## {name}: {system.name}', '', 'wall ms by phase: ' + ', '.join(
        f'{key} {1e3 * seconds.get(key, 0):.2f}' for key in ['search', *LABELS, 'other']), '']
    sort = 'self_device_time_total' if DEVICE == 'cuda' else 'self_cpu_time_total'
    return '\n'.join(lines) + profiler.key_averages().table(sort_by=sort, row_limit=15) + '\n'


def tops(system, found, docnos) -> dict:
    """qid -> (docnos, scores) of a system's result."""
    if isinstance(found, pd.DataFrame):
        found = found.sort_values(['qid', 'rank'])
        return {qid: (list(g['docno']), g['score'].to_numpy()) for qid, g in found.groupby('qid')}
    if isinstance(system, FastPlaid):
        return {f'q{i}': ([docnos[int(d)] for d, _ in hits], np.array([s for _, s in hits]) / QUERY_VECTORS)
                for i, hits in enumerate(found)}  # fast-plaid sums the query vectors' maxima; the index averages
    scores, ids = found
    return {f'q{i}': (list(docnos[ids[i]]), scores[i]) for i in range(len(ids))}


def agreement(found: dict, exact: dict) -> dict:
    """Same order, recall@10 and the largest score difference on shared docnos, against ``exact``."""
    same, overlap, gap = [], [], 0.
    for qid, (docnos, scores) in exact.items():
        other, other_scores = found[qid]
        same.append(list(other) == list(docnos))
        overlap.append(len(set(other) & set(docnos)) / K)
        mine = dict(zip(docnos, scores))
        gap = max([gap] + [abs(float(mine[d]) - float(s)) for d, s in zip(other, other_scores) if d in mine])
    return {'same order': float(np.mean(same)), 'recall@10': float(np.mean(overlap)), 'max |Δscore|': gap}


def timed(systems: list, repeats: int) -> dict:
    """Each system's results (an untimed search) and its ``repeats`` seconds, in rotated interleaved rounds."""
    results = {s.name: s.search() for s in systems}
    seconds = {s.name: [] for s in systems}
    for round_ in range(repeats):
        for s in systems[round_ % len(systems):] + systems[:round_ % len(systems)]:
            start = time.perf_counter()
            s.search()
            seconds[s.name].append(time.perf_counter() - start)
    return results, seconds


def candidate_stage_place(index) -> str:
    """Where the approximate search's candidate stage searched on the run's device: torch, FAISS's GPU index or FAISS
    on the CPU."""
    stage = next(stage for key, (_, stage) in index.searchers().searchers[0]._stages.items() if key[-1] == DEVICE)
    if stage.in_torch:
        return f'torch IVF on {DEVICE}'
    return 'FAISS on the GPU' if 'Gpu' in type(stage.ann).__name__ else 'FAISS on the CPU'


def plaid_systems(vectors, offsets, queries, work: Path) -> tuple:
    """fast-plaid's systems (one per build and search setting) and each build's time, size and peak GPU memory."""
    from fast_plaid import search
    documents = [torch.from_numpy(vectors[offsets[i]:offsets[i + 1]].astype(np.float32))
                 for i in range(len(offsets) - 1)]
    systems, builds = [], {}
    for build in PLAID_BUILDS:
        folder = work / f'fast-plaid-{build["nbits"]}'
        shutil.rmtree(folder, ignore_errors=True)
        if DEVICE == 'cuda':
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        engine = search.FastPlaid(index=str(folder), device=DEVICE)
        engine.create(documents_embeddings=documents, **build)
        synchronize()
        builds[build['nbits']] = {'build s': time.perf_counter() - start,
                                  'index MiB': sum(f.stat().st_size for f in folder.rglob('*') if f.is_file()) / 2**20,
                                  'build GPU MiB': torch.cuda.max_memory_allocated() / 2**20 if DEVICE == 'cuda'
                                  else None}
        systems += [FastPlaid(engine, build, setting, queries) for setting in PLAID_SEARCHES]
    return systems, builds


def run_workload(name: str, args) -> list:
    """The rows of one workload."""
    vectors, lengths, queries = workload(name, args)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    path = args.work_dir / name
    start = time.perf_counter()
    index = MultiVectorIndex(path, verbose=False).indexer(dtype='float16', overwrite=True).index_arrays(
        [f'd{i}' for i in range(len(lengths))], vectors, lengths)
    build = time.perf_counter() - start
    docnos = np.asarray(index.docnos().fwd[np.arange(len(lengths))], dtype=object)
    topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})
    reference = Reference(vectors, lengths, queries)  # first: the index plans its memory around what it leaves
    if DEVICE == 'cuda':
        torch.cuda.empty_cache()
    cuda = IndexSearch(f'index exact ({DEVICE})', index.retriever(device=DEVICE, num_results=K), topics)
    start = time.perf_counter()
    cuda.search()  # groups the documents by length on the GPU, compiles and tunes the kernel
    first_search = time.perf_counter() - start
    groups = index.searchers().searchers[0]._resident[('groups', DEVICE)][1]
    systems = [reference, cuda, ArraySearch(f'index exact ({DEVICE}, arrays: no frames)', cuda.retriever, queries)]
    plaid_builds = {}
    if args.peers and name in args.peer_workloads:
        peers, plaid_builds = plaid_systems(vectors, offsets, queries, args.work_dir)
        systems += peers
    approximate = None
    if args.approximate and len(lengths) <= args.approximate_docs:
        approximate = IndexSearch(f'index approximate ({DEVICE})', index.ann_retriever(device=DEVICE, num_results=K),
                                  topics)
        start = time.perf_counter()
        found = approximate.retriever.calibrate()  # builds the FAISS stage too
        approximate.build_s = time.perf_counter() - start
        approximate.setting = ('exact search' if found.candidates is None else
                               f'{found.candidates} candidates, effort {found.search_effort}') + \
            f'; candidate stage: {candidate_stage_place(index)}'
        systems.append(approximate)
        systems += [IndexSearch(f'index approximate ({DEVICE}, {count} candidates, effort {found.search_effort})',
                                index.ann_retriever(device=DEVICE, num_results=K, candidates=count,
                                                    search_effort=found.search_effort), topics)
                    for count in args.approximate_candidates]
    results, seconds = timed(systems, args.repeats)
    with open(f'{args.out}_profile.txt', 'a') as f:
        f.write(profile(cuda, name))
    checked_on_cpu = len(lengths) <= args.cpu_check_docs
    if checked_on_cpu:
        cpu_start = time.perf_counter()
        exact = tops(None, index.retriever(device='cpu', num_results=K)(topics), docnos)
        cpu_seconds = time.perf_counter() - cpu_start
    else:  # held to the reference's top 10 (float32: near ties may differ)
        exact = tops(systems[0], results[systems[0].name], docnos)
    reference_s = float(np.median(seconds[systems[0].name]))
    flops = 2 * QUERIES * QUERY_VECTORS * len(vectors) * vectors.shape[1]
    rows = []
    for s in systems:
        median = float(np.median(seconds[s.name]))
        row = {'workload': name, 'docs': len(lengths), 'stored vectors': len(vectors), 'system': s.name,
               'queries/s': QUERIES / median, 'x reference': reference_s / median,
               'TFLOP/s': flops / median / 1e12,  # its share of the peak: report()
               'median s': median, 'min s': min(seconds[s.name]), 'max s': max(seconds[s.name]),
               **agreement(tops(s, results[s.name], docnos), exact)}
        if s is cuda:
            row.update({'build s': build, 'first search s': first_search, 'GPU GiB (groups)':
                        groups.resident_bytes / 2**30, 'host GiB (streamed)': groups.streamed_bytes / 2**30})
        if isinstance(s, FastPlaid):
            row.update(plaid_builds[s.nbits])
        if s is approximate:
            row.update({'build s': s.build_s, 'setting': s.setting})
        row['checked against'] = 'index exact (cpu)' if checked_on_cpu else 'reference'
        rows.append(row)
    if checked_on_cpu:
        rows.append({'workload': name, 'docs': len(lengths), 'stored vectors': len(vectors),
                     'system': 'index exact (cpu, every thread)', 'queries/s': QUERIES / cpu_seconds,
                     'x reference': reference_s / cpu_seconds, 'median s': cpu_seconds})
    shutil.rmtree(path, ignore_errors=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workloads', nargs='+', default=WORKLOADS)
    parser.add_argument('--peers', action='store_true', help='fast-plaid on the --peer-workloads')
    parser.add_argument('--peer-workloads', nargs='+', default=PEER_WORKLOADS,
                        help='the workloads fast-plaid runs on (gpu/rehearse.sh: a small one, on the CPU)')
    parser.add_argument('--approximate', action='store_true', help='the approximate search, calibrated on the card')
    parser.add_argument('--approximate-docs', type=int, default=100_000,
                        help='the approximate search on workloads of at most this many documents (its FAISS build and '
                             'calibration run on the CPU where FAISS has no GPU code for the card)')
    parser.add_argument('--approximate-candidates', type=int, nargs='*', default=[],
                        help='with --approximate, the approximate search also at these candidate counts, at the '
                             'calibrated search effort (the points of the matched-recall comparison)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--device', default='cuda', help='cpu: a dry run of the script on small workloads')
    parser.add_argument('--cpu-check-docs', type=int, default=2_000_000,
                        help='rankings checked against the CPU\'s exact search up to this many documents, against '
                             'the reference beyond (the 10M row: minutes on the CPU)')
    parser.add_argument('--minilm-model', type=Path, help='all-MiniLM-L6-v2 folder (minilm-scifact)')
    parser.add_argument('--data-root', type=Path, default=Path(__file__).resolve().parents[2] / 'shared' / 'data')
    parser.add_argument('--work-dir', type=Path, default=Path('/tmp/bench_gpu'))
    parser.add_argument('--out', type=Path, default=Path(__file__).parent / 'results' / 'bench_gpu')
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == 'cpu':
        from pyterrier_multiquery.index import shardwise
        shardwise.uses_length_groups = lambda device: True
    args.work_dir.mkdir(parents=True, exist_ok=True)
    Path(f'{args.out}_profile.txt').unlink(missing_ok=True)
    started = time.perf_counter()
    peaks, rows = [bf16_peak()], []
    machine = (f'{torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU dry run"}, '
               f'{platform.processor() or platform.machine()}, torch '
               f'{torch.__version__}, CUDA {torch.version.cuda}')
    for name in args.workloads:
        rows += run_workload(name, args)
        report(args, rows, peaks, machine, started)
    peaks.append(bf16_peak())
    table = report(args, rows, peaks, machine, started)
    print(table.to_string(index=False, float_format='%.4g'))
    print(f'bfloat16 peaks: {peaks} TFLOP/s; {time.perf_counter() - started:.0f} s in all')


def matched_recall(table: pd.DataFrame) -> pd.DataFrame:
    """For each workload with fast-plaid rows and each recall@10 target of :data:`MATCHED_RECALL`: the fastest search
    of the index on the run's device (exact or approximate) and of fast-plaid reaching the target, and the ratio of
    their queries/s (empty where neither reaches it). The index's searches are those that return a frame (the arrays
    row is a measure of the frames' cost, not a search a PyTerrier pipeline runs)."""
    rows = []
    for name, group in table.groupby('workload', sort=False):
        family = group['system'].map(lambda system: 'fast-plaid' if system.startswith('fast-plaid') else
                                     'index' if system.startswith('index') and 'every thread' not in system
                                     and 'no frames' not in system else '')
        if not (family == 'fast-plaid').any():
            continue
        for target in MATCHED_RECALL:
            row = {'workload': name, 'recall@10 at least': target}
            for kind in ('index', 'fast-plaid'):
                reaching = group[(family == kind) & (group['recall@10'] >= target)]
                best = reaching.loc[reaching['queries/s'].idxmax()] if len(reaching) else None
                row[kind] = None if best is None else best['system']
                row[f'{kind} q/s'] = None if best is None else best['queries/s']
            row['index / fast-plaid'] = row['index q/s'] / row['fast-plaid q/s'] \
                if row['index q/s'] and row['fast-plaid q/s'] else None
            rows.append(row)
    return pd.DataFrame(rows, columns=['workload', 'recall@10 at least', 'index', 'index q/s', 'fast-plaid',
                                       'fast-plaid q/s', 'index / fast-plaid'])


def report(args, rows: list, peaks: list, machine: str, started: float) -> pd.DataFrame:
    """Writes the report of the rows so far (a run cut short keeps its finished workloads); returns the table."""
    table = pd.DataFrame(rows)
    table['% bf16 peak'] = 100 * table['TFLOP/s'] / max(peaks)
    write_report(args.out, 'The index on a GPU against plain torch and fast-plaid', __doc__.split('\n\n', 2)[2] +
                 f'\n\nMachine: {machine}; bfloat16 peaks {", ".join(f"{p:.0f}" for p in peaks)} TFLOP/s.',
                 {'Exact search': table, 'At matched recall': matched_recall(table)},
                 extra={'machine': machine, 'bf16 peaks TFLOP/s': peaks, 'seconds': time.perf_counter() - started,
                        'args': {k: str(v) for k, v in vars(args).items()}})
    print(table[table['workload'] == rows[-1]['workload']].to_string(index=False, float_format='%.4g'), flush=True)
    return table


if __name__ == '__main__':
    main()
