"""The project's min-max hybrid (``HybridRetriever``) against the same fusion written with PyTerrier's operators
(pyterrier_alpha's ``PerQueryMaxMinScore``, ``*`` and ``+``), BM25 and MiniLM over RAMDocs: rankings, effectiveness
and time (median, min and max of interleaved repeats), the rows left without their query text; then both on two
lists where one holds a single document.

    python experiments/ecosystem/fusion.py --data-root ../shared/data
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyterrier as pt


def per_query_max_min() -> pt.Transformer:
    """pyterrier_alpha's ``PerQueryMaxMinScore`` where it runs; else its computation (scikit-learn's
    ``minmax_scale`` of each query's scores) as a ``pt.apply`` (pyterrier-alpha 0.16.5's class fails on its first
    frame, importing a ``validate`` its module no longer has)."""
    from pyterrier_alpha.fusion import PerQueryMaxMinScore
    from sklearn.preprocessing import minmax_scale
    try:
        PerQueryMaxMinScore()(pd.DataFrame({'qid': ['q'], 'docno': ['d'], 'score': [1.]}))
        return PerQueryMaxMinScore()
    except ImportError as e:
        print(f'pyterrier_alpha.fusion.PerQueryMaxMinScore does not run: {type(e).__name__}: {e}')
    return pt.apply.generic(lambda frame: frame.assign(score=frame.groupby('qid')['score'].transform(minmax_scale)))


def pyterrier_hybrid(first, second, weight: float, num_results: int) -> pt.Transformer:
    """``HybridRetriever``'s fusion in PyTerrier's operators."""
    return (weight * (first % num_results >> per_query_max_min())
            + (1 - weight) * (second % num_results >> per_query_max_min())) % num_results


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--data-root', default='../shared/data')
    parser.add_argument('--num-results', type=int, default=100)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    from ir_measures import nDCG

    from pyterrier_multiquery.baselines import bm25, flex_index, minilm
    from pyterrier_multiquery.diffretriever import HybridRetriever
    from pyterrier_multiquery.experiment.evaluation import per_query
    from pyterrier_multiquery.loaders import load_dataset
    from pyterrier_multiquery.measures import MRecall
    dataset = load_dataset(str(Path(args.data_root) / 'ramdocs'))
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    corpus = lambda: dataset.get_corpus_iter(verbose=False)  # noqa: E731
    encoder = minilm(batch_size=64)
    n = args.num_results
    with tempfile.TemporaryDirectory() as tmp:
        sparse = bm25(Path(tmp) / 'bm25.pisa', corpus, num_results=n)
        dense = encoder.query_encoder() >> flex_index(Path(tmp) / 'minilm.flex', encoder, corpus,
                                                      verbose=False).retriever(num_results=n)
        # both fusions read the same two runs, so that only the fusion is timed
        first, second = sparse(topics), dense(topics)
        first_stage, second_stage = pt.Transformer.from_df(first), pt.Transformer.from_df(second)
        systems = {'project HybridRetriever': HybridRetriever(first_stage, second_stage, num_results=n),
                   'PyTerrier operators': pyterrier_hybrid(first_stage, second_stage, 0.5, n)}
        times, runs = {name: [] for name in systems}, {}
        for _ in range(args.repeats):
            for name, system in systems.items():
                start = time.perf_counter()
                runs[name] = system(topics)
                times[name].append(time.perf_counter() - start)
    ours, theirs = runs['project HybridRetriever'], runs['PyTerrier operators']
    joined = ours.merge(theirs, on=['qid', 'docno'], suffixes=('', '_pt'))
    top = {name: run[run['rank'] < 10].sort_values(['qid', 'rank']).groupby('qid')['docno'].agg(tuple)
           for name, run in runs.items()}
    print(f'RAMDocs: {len(topics)} queries, BM25 and MiniLM top {n} each, weight 0.5; {args.repeats} interleaved '
          'repeats')
    same = int((top['project HybridRetriever'] == top['PyTerrier operators']).sum())
    print(f'results: {len(ours)} vs {len(theirs)} in all; largest score difference '
          f'{(joined["score"] - joined["score_pt"]).abs().max():.2e}; same top 10 for {same}/{len(topics)} queries')
    missing = [int(run['query'].isna().sum()) for run in (ours, theirs)]
    print(f'rows without their query text (a later stage reading `query` fails on them): {missing[0]} vs '
          f'{missing[1]} (the documents only the second list found)')
    print('| fusion | MRecall@10 | nDCG@10 | s (median [min, max]) |')
    print('|---|---|---|---|')
    for name, run in runs.items():
        scores = per_query({name: run}, qrels, [MRecall @ 10, nDCG @ 10]).groupby('measure')['value'].mean()
        print(f'| {name} | {scores["MRecall@10"]:.3f} | {scores["nDCG@10"]:.3f} | '
              f'{statistics.median(times[name]):.3f} [{min(times[name]):.3f}, {max(times[name]):.3f}] |')
    one = pd.DataFrame({'qid': ['q'], 'query': ['x'], 'docno': ['a'], 'score': [3.], 'rank': [0]})
    two = pd.DataFrame({'qid': ['q', 'q'], 'query': ['x', 'x'], 'docno': ['b', 'a'], 'score': [2., 1.], 'rank': [0, 1]})
    query = pd.DataFrame({'qid': ['q'], 'query': ['x']})
    for name, system in (('project HybridRetriever', HybridRetriever(pt.Transformer.from_df(one),
                                                                     pt.Transformer.from_df(two), num_results=2)),
                         ('PyTerrier operators', pyterrier_hybrid(pt.Transformer.from_df(one),
                                                                  pt.Transformer.from_df(two), 0.5, 2))):
        run = system(query).sort_values('rank')
        print(f'{name}, first list [a: 3], second [b: 2, a: 1]: '
              + ', '.join(f'{d} {s:.2f}' for d, s in zip(run['docno'], run['score'])))


if __name__ == '__main__':
    main()
