"""BM25 on Vaswani through pyterrier-anserini, through the project's pyserini wrapper and through PISA: effectiveness,
indexing and retrieval time (median, min and max of interleaved repeats). A system that cannot run here is reported
with the error that stopped it.

    JAVA_HOME=/usr/lib/jvm/temurin-25-jdk-amd64 python experiments/ecosystem/lucene.py --data-root ../shared/data
    # offline, with Terrier's initialiser off and the OpenAI key that pyserini 1.6's search module asks for at import:
    OPENAI_API_KEY=unused JAVA_HOME=... python experiments/ecosystem/lucene.py --no-terrier
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pyterrier as pt


def anserini_bm25(path: Path, corpus):
    """pyterrier-anserini's BM25 over an index of ``corpus`` it builds at ``path``."""
    import pyterrier_anserini
    pyterrier_anserini.AnseriniIndex(str(path)).indexer(fields=['text']).index(corpus())
    return pyterrier_anserini.AnseriniIndex(str(path)).bm25()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--data-root', default='../shared/data')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--no-terrier', action='store_true',
                        help="switch PyTerrier's Terrier initialiser off (it looks Terrier's jars up on Maven Central "
                             'at every start), to see what pyterrier-anserini needs next')
    args = parser.parse_args()
    if args.no_terrier:
        import pyterrier.terrier.java
        pyterrier.terrier.java.TerrierJavaInit.condition = lambda self: False
    from ir_measures import AP, nDCG

    from pyterrier_multiquery.baselines import bm25
    from pyterrier_multiquery.loaders import load_dataset
    dataset = load_dataset(str(Path(args.data_root) / 'vaswani'))
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    corpus = lambda: dataset.get_corpus_iter(verbose=False)  # noqa: E731
    # pyterrier-anserini first: it starts Java through PyTerrier, which cannot join a JVM pyserini started
    builders = {'pyterrier-anserini': lambda path: anserini_bm25(path, corpus),
                'PISA': lambda path: bm25(path, corpus),
                'project LuceneIndex': lambda path: bm25(path, corpus, engine='lucene')}
    with tempfile.TemporaryDirectory() as tmp:
        systems, built, failed = {}, {}, {}
        for name, build in builders.items():
            start = time.perf_counter()
            try:
                systems[name] = build(Path(tmp) / name.replace(' ', '-'))
                systems[name](topics.head(2))  # warm: the JVM and the searchers start
            except Exception as e:  # reported, not hidden: the point is which ones run
                failed[name] = f'{type(e).__name__}: {str(e).splitlines()[0][:200]}'
                systems.pop(name, None)
                continue
            built[name] = time.perf_counter() - start
        times = {name: [] for name in systems}
        for _ in range(args.repeats):
            for name, system in systems.items():
                start = time.perf_counter()
                system(topics)
                times[name].append(time.perf_counter() - start)
        table = pt.Experiment(list(systems.values()), topics, qrels, eval_metrics=[AP, nDCG @ 10],
                              names=list(systems))
    print(f'Vaswani: {len(topics)} queries; retrieval of all of them, {args.repeats} interleaved repeats')
    print('| system | AP | nDCG@10 | index + first search s | retrieval s (median [min, max]) |')
    print('|---|---|---|---|---|')
    for i, name in enumerate(systems):
        t = times[name]
        print(f'| {name} | {table["AP"].iloc[i]:.4f} | {table["nDCG@10"].iloc[i]:.4f} | {built[name]:.1f} | '
              f'{statistics.median(t):.3f} [{min(t):.3f}, {max(t):.3f}] |')
    for name, error in failed.items():
        print(f'| {name} | did not run: {error} | | | |')


if __name__ == '__main__':
    main()
