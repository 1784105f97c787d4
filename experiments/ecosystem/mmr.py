"""The project's MMR against pyterrier_dr's ``MmrScorer`` on MiniLM's top 100 over RAMDocs: how many queries get
the same top 10, MRecall@10 of each, and the time of each (median, min and max of interleaved repeats).

    python experiments/ecosystem/mmr.py --data-root ../shared/data
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--data-root', default='../shared/data')
    parser.add_argument('--depth', type=int, default=100)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    from pyterrier_dr import MmrScorer

    from pyterrier_multiquery.baselines import MMR, flex_index, minilm
    from pyterrier_multiquery.experiment.evaluation import per_query
    from pyterrier_multiquery.loaders import load_dataset
    from pyterrier_multiquery.measures import MRecall
    dataset = load_dataset(str(Path(args.data_root) / 'ramdocs'))
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    encoder = minilm(batch_size=64)
    with tempfile.TemporaryDirectory() as tmp:
        index = flex_index(Path(tmp) / 'minilm.flex', encoder, lambda: dataset.get_corpus_iter(verbose=False),
                           verbose=False)
        candidates = (encoder.query_encoder() >> index.retriever(num_results=args.depth) >> index.vec_loader())(topics)
    print(f'RAMDocs: {len(topics)} queries, MiniLM top {args.depth} re-ranked; {args.repeats} interleaved repeats')
    print('| Lambda | same top 10 (queries) | MRecall@10 project | MRecall@10 pyterrier_dr | NaN scores pyterrier_dr '
          '| repeated docnos pyterrier_dr | s project (median [min, max]) | s pyterrier_dr |')
    print('|---|---|---|---|---|---|---|---|')
    for Lambda in (0.5, 0.9, 1.0):
        systems = {'project': MMR(Lambda, depth=args.depth), 'pyterrier_dr': MmrScorer(Lambda=Lambda)}
        times, runs = {name: [] for name in systems}, {}
        for _ in range(args.repeats):
            for name, system in systems.items():
                start = time.perf_counter()
                runs[name] = system(candidates)
                times[name].append(time.perf_counter() - start)
        top = {name: run[run['rank'] < 10].groupby('qid')['docno'].agg(tuple) for name, run in runs.items()}
        same = int((top['project'] == top['pyterrier_dr'].reindex(top['project'].index)).sum())
        recall = {name: float(per_query({name: run[run['rank'] < 10]}, qrels, [MRecall @ 10])['value'].mean())
                  for name, run in runs.items()}
        theirs = runs['pyterrier_dr']
        nan = int(np.isnan(theirs['score'].to_numpy(dtype=float)).sum())
        repeated = int(theirs.duplicated(['qid', 'docno']).sum())
        t = {name: f'{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]' for name, v in times.items()}
        print(f'| {Lambda} | {same}/{len(top["project"])} | {recall["project"]:.3f} | {recall["pyterrier_dr"]:.3f} '
              f'| {nan} | {repeated} | {t["project"]} | {t["pyterrier_dr"]} |')


if __name__ == '__main__':
    main()
