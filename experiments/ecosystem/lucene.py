"""BM25 on Vaswani through pyterrier-anserini, through the project's pyserini wrapper and through PISA: effectiveness,
indexing and retrieval time (median, min and max of interleaved repeats), and whether each indexes ``toks``.

    JAVA_HOME=/usr/lib/jvm/temurin-25-jdk-amd64 python experiments/ecosystem/lucene.py --data-root ../shared/data
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pyterrier as pt


def timed(function):
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--data-root', default='../shared/data')
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    import pyterrier.terrier.java
    import pyterrier_anserini
    # pyterrier-anserini starts Java through PyTerrier's initialisers, and Terrier's looks its newest jar up on Maven
    # Central at every start: without network (this machine) the JVM does not start unless Terrier's is switched off
    pyterrier.terrier.java.TerrierJavaInit.condition = lambda self: False
    from ir_measures import AP, nDCG

    from pyterrier_multiquery.baselines import pisa_bm25
    from pyterrier_multiquery.loaders import load_dataset
    from pyterrier_multiquery.lucene import LuceneIndex
    dataset = load_dataset(str(Path(args.data_root) / 'vaswani'))
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    corpus = lambda: dataset.get_corpus_iter(verbose=False)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        built = {}
        _, built['PISA'] = timed(lambda: pisa_bm25(tmp / 'pisa', corpus))
        _, built['project LuceneIndex'] = timed(lambda: LuceneIndex(tmp / 'own').indexer().index(corpus()))
        _, built['pyterrier-anserini'] = timed(
            lambda: pyterrier_anserini.AnseriniIndex(str(tmp / 'anserini')).indexer(fields=['text']).index(corpus()))
        systems = {'PISA': pisa_bm25(tmp / 'pisa', corpus),
                   'project LuceneIndex': LuceneIndex(tmp / 'own').bm25(),
                   'pyterrier-anserini': pyterrier_anserini.AnseriniIndex(str(tmp / 'anserini')).bm25()}
        for system in systems.values():  # warm: the JVM and the searchers start
            system(topics.head(2))
        times = {name: [] for name in systems}
        for _ in range(args.repeats):
            for name, system in systems.items():
                times[name].append(timed(lambda: system(topics))[1])
        table = pt.Experiment(list(systems.values()), topics, qrels, eval_metrics=[AP, nDCG @ 10],
                              names=list(systems))
    print(f'Vaswani: {len(topics)} queries; retrieval of all of them, {args.repeats} interleaved repeats')
    print('| system | AP | nDCG@10 | index s | retrieval s (median [min, max]) |')
    print('|---|---|---|---|---|')
    for i, name in enumerate(systems):
        t = times[name]
        print(f'| {name} | {table["AP"].iloc[i]:.4f} | {table["nDCG@10"].iloc[i]:.4f} | {built[name]:.1f} | '
              f'{statistics.median(t):.3f} [{min(t):.3f}, {max(t):.3f}] |')


if __name__ == '__main__':
    main()
