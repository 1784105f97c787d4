"""Command line of the main job: ``python -m pyterrier_multiquery [--dataset PATH|irds:ID] [--save table.csv]``."""
import argparse
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    """Runs BM25, MiniLM and MiniLM >> MMR on a dataset and prints the multi-answer evaluation table."""
    parser = argparse.ArgumentParser(prog='python -m pyterrier_multiquery', description=main.__doc__)
    parser.add_argument('--dataset', help='a BEIR, TREC, RAMDocs or MuSiQue path, or an irds: identifier '
                                          '(default: RAMDocs from the shared data folder beside the checkout)')
    parser.add_argument('--variant', help='topics/qrels variant, e.g. the BEIR split (default: the dataset\'s own)')
    parser.add_argument('--cache-dir', default=str(Path.home() / '.cache' / 'pyterrier_multiquery'),
                        help='where indexes are built once and reused (default: %(default)s)')
    parser.add_argument('--mmr-lambda', type=float, default=0.5, help='MMR relevance weight (default: %(default)s)')
    parser.add_argument('--mmr-depth', type=int, default=500, help='dense results MMR re-ranks (default: %(default)s)')
    parser.add_argument('--batch-size', type=int, default=64, help='encoder batch size (default: %(default)s)')
    parser.add_argument('--amer', metavar='MODEL', help='also run AMER with this trained model (a folder written by '
                                                       'AMER.save_pretrained) over the MiniLM index')
    parser.add_argument('--jpr', metavar='MODEL', help='also run MiniLM >> JPR (TreeDecode) with this trained model '
                                                      '(a folder written by JPRModel.save_pretrained)')
    parser.add_argument('--save', help='write the table as CSV to this path')
    args = parser.parse_args(argv)

    from pyterrier_multiquery.datasets import load_dataset
    from pyterrier_multiquery.experiment import cache_dir_for, default_data_dir, run_experiment
    from pyterrier_multiquery.systems import amer_system, baseline_systems, jpr_system

    spec = args.dataset
    if spec is None:
        data_dir = default_data_dir()
        if data_dir is None or not (data_dir / 'ramdocs').is_dir():
            parser.error('no shared data folder with ramdocs/ found: give --dataset with a path or an irds: identifier')
        spec = str(data_dir / 'ramdocs')
    try:
        dataset = load_dataset(spec)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))

    start = time.perf_counter()
    cache_dir = cache_dir_for(spec, args.cache_dir)
    systems = baseline_systems(dataset, cache_dir, mmr_lambda=args.mmr_lambda, mmr_depth=args.mmr_depth,
                               batch_size=args.batch_size)
    if args.amer:
        systems['AMER'] = amer_system(args.amer, dataset, cache_dir, batch_size=args.batch_size)
    if args.jpr:
        systems['MiniLM >> JPR'] = jpr_system(args.jpr, dataset, cache_dir, batch_size=args.batch_size)
    table = run_experiment(systems, dataset.get_topics(args.variant), dataset.get_qrels(args.variant))
    print(f'dataset: {spec}')
    print(table.to_string(index=False, float_format='%.4f'))
    print(f'took {time.perf_counter() - start:.1f}s')
    if args.save:
        table.to_csv(args.save, index=False)
        print(f'saved to {args.save}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
