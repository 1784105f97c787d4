"""The project's generation cache (``TextGenerator.cached``) against pyterrier-caching's ``Sqlite3KeyValueCache``
around the same ``QueryGenerator``, with a generator that answers instantly and counts its calls: what a changed
prompt returns from a filled cache, the time of a pass that hits on every document (median, min and max of
interleaved repeats), and a pass over more documents than SQLite takes parameters in one statement.

    python experiments/ecosystem/caching.py
"""
import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--documents', type=int, default=20000)
    parser.add_argument('--large', type=int, default=40000)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    from pyterrier_caching import Sqlite3KeyValueCache

    from pyterrier_multiquery.generation import QueryGenerator, TextGenerator

    class Counting(TextGenerator):
        """Answers each prompt with a one-item list naming a hash of the prompt; counts the prompts it was given."""
        model_id = 'counting'
        calls = 0

        def _generate(self, prompts):
            Counting.calls += len(prompts)
            return [f'1. query {hashlib.sha1(p[-1]["content"].encode()).hexdigest()[:12]}' for p in prompts]

    def documents(count: int) -> pd.DataFrame:
        return pd.DataFrame({'docno': [f'd{i}' for i in range(count)], 'text': [f'passage {i}' for i in range(count)]})

    docs = documents(args.documents)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        caches = {
            'project .cached()': lambda prompt, name='ours': QueryGenerator(Counting().cached(tmp / f'{name}.sqlite'),
                                                                            prompt),
            'pyterrier-caching': lambda prompt, name='theirs': Sqlite3KeyValueCache(
                str(tmp / f'{name}.cache'), QueryGenerator(Counting(), prompt), key='text', value='querygen'),
        }
        print(f'{args.documents} documents; {args.repeats} interleaved repeats of a pass that hits on all of them')
        print('| cache | fill s | hit pass s (median [min, max]) | prompt changed: generated | prompt changed: '
              'answers of the old prompt | one pass over ' f'{args.large} documents |')
        print('|---|---|---|---|---|---|')
        rows = {}
        for name, make in caches.items():
            start = time.perf_counter()
            filled = make('5w1h')(docs)
            rows[name] = {'fill': time.perf_counter() - start, 'hits': [], 'first': filled}
        for _ in range(args.repeats):
            for name, make in caches.items():
                cache = make('5w1h')
                start = time.perf_counter()
                cache(docs)
                rows[name]['hits'].append(time.perf_counter() - start)
        for name, make in caches.items():
            before = Counting.calls
            changed = make('paraphrase')(docs)
            rows[name]['generated'] = Counting.calls - before
            old = rows[name]['first']['querygen'].map(tuple)
            rows[name]['stale'] = int((changed['querygen'].map(tuple) == old).sum())
            try:
                make('5w1h', name=f'{name}-large'.replace(' ', '_'))(documents(args.large))
                rows[name]['large'] = 'ran'
            except Exception as e:  # reported: whether a large pass runs is the point
                rows[name]['large'] = f'{type(e).__name__}: {str(e)[:80]}'
        for name, row in rows.items():
            hits = row['hits']
            print(f'| {name} | {row["fill"]:.2f} | {statistics.median(hits):.3f} [{min(hits):.3f}, {max(hits):.3f}] | '
                  f'{row["generated"]} | {row["stale"]} | {row["large"]} |')


if __name__ == '__main__':
    main()
