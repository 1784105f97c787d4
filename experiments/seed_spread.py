"""Several seeds' runs of one experiment in one report: each figure's mean and spread over the seeds.

    python experiments/seed_spread.py experiments/results/amer_ramdocs_seed{0,1,2}.json \
        --out experiments/results/amer_ramdocs_seeds

Each input is the JSON report an experiment wrote with ``--seed N --out PATH`` (``amer_ramdocs.py``,
``jpr_ramdocs.py``, ``transfer.py``, ...). Every table present in all of them is combined row by row. The text and
whole-number columns equal in every seed name the rows (``system``, ``dataset``, ``trained on``, ``fold``, ...). Each
other numeric column becomes its mean and sample standard deviation over the seeds, and the columns matching
``--per-seed`` (default: ``MRecall@10``, its differences and p-values, and the verdict ``floor held``) also keep each
seed's value. Other text columns that differ between seeds (intervals, settings chosen) are left out. Writes
``--out`` .md/.json.
"""
import argparse
import json
import re
from pathlib import Path
from typing import Dict, List

import pandas as pd

from pyterrier_multiquery.experiment.evaluation import write_report


def seed_tables(reports: List[dict]) -> Dict[str, List[pd.DataFrame]]:
    """The tables present in every report, each as one frame per report (in the reports' order)."""
    titles = [title for title in reports[0]['tables'] if all(title in r['tables'] for r in reports[1:])]
    return {title: [pd.DataFrame(r['tables'][title]) for r in reports] for title in titles}


def spread(frames: List[pd.DataFrame], seeds: List[str], per_seed: str) -> pd.DataFrame:
    """One table's rows over the seeds: the naming columns, each numeric column's mean and standard deviation, and
    the seeds' values of the columns matching ``per_seed`` (a text column only where the seeds differ in it).

    Raises:
        ValueError: If the seeds' tables differ in their rows (count, or the columns that name them).
    """
    first = frames[0]
    if any(len(frame) != len(first) for frame in frames[1:]):
        raise ValueError(f'the seeds\' tables have {[len(f) for f in frames]} rows: they are not of one experiment')
    numeric = [c for c in first.columns if all(c in f.columns and pd.api.types.is_numeric_dtype(f[c]) and
                                               not pd.api.types.is_bool_dtype(f[c]) for f in frames)]
    # whole numbers equal in every seed (a fold, a question count) name the rows too
    numeric = [c for c in numeric if not all(pd.api.types.is_integer_dtype(f[c]) and
                                             (f[c].to_numpy() == first[c].to_numpy()).all() for f in frames)]
    naming = [c for c in first.columns if c not in numeric and
              all(c in f.columns and f[c].astype(str).equals(first[c].astype(str)) for f in frames[1:])]
    if not naming:
        raise ValueError('no column names the rows alike in every seed (a system column): the tables do not match')
    out = first[naming].copy()
    for column in [c for c in first.columns if c not in numeric and c not in naming and re.search(per_seed, c)]:
        for seed, frame in zip(seeds, frames):   # a verdict that differs: each seed's
            out[f'{column} seed {seed}'] = frame[column].to_numpy() if column in frame.columns else None
    for column in numeric:
        values = pd.concat([f[column].reset_index(drop=True) for f in frames], axis=1, ignore_index=True)
        out[f'{column} mean'] = values.mean(axis=1).to_numpy()
        out[f'{column} sd'] = values.std(axis=1, ddof=1).to_numpy()
        if re.search(per_seed, column):
            for position, seed in enumerate(seeds):
                out[f'{column} seed {seed}'] = values[position].to_numpy()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('reports', type=Path, nargs='+', help='one JSON report a seed')
    parser.add_argument('--out', type=Path, required=True, help='report path without extension')
    parser.add_argument('--per-seed', default=r'^MRecall@10\b|^floor held$',
                        help="regular expression of the columns whose every seed's value is kept "
                             '(default: %(default)s)')
    args = parser.parse_args(argv)
    if len(args.reports) < 2:
        parser.error('give the reports of two seeds or more')
    reports = [json.loads(path.read_text()) for path in args.reports]
    seeds = [str(r.get('seed', (r.get('settings') or {}).get('seed', path.stem)))
             for r, path in zip(reports, args.reports)]
    if len(set(seeds)) < len(seeds):
        parser.error(f'the reports are of seeds {", ".join(seeds)}: one report a seed')
    tables = {title: spread(frames, seeds, args.per_seed) for title, frames in seed_tables(reports).items()}
    if not tables:
        raise SystemExit('the reports share no table: they are not of one experiment')
    write_report(args.out, f'{reports[0]["title"]}, over seeds {", ".join(seeds)}',
                 __doc__.split('\n\n', 2)[2] + '\n\nReports: ' + ', '.join(str(p) for p in args.reports) + '.',
                 tables, extra={'seeds': seeds})
    print(args.out.with_suffix('.md').read_text())


if __name__ == '__main__':
    main()
