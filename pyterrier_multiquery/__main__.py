"""The main job: ``python -m pyterrier_multiquery`` (see :mod:`pyterrier_multiquery.experiment.main`)."""
import sys

from pyterrier_multiquery.experiment.main import main

if __name__ == '__main__':
    sys.exit(main())
