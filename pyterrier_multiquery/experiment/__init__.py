"""The research harness: the main job, the systems it assembles, the evaluation protocol, reports and synthetic data.

The library (every other module of the package) never imports it; the main job, ``experiments/`` and the notebooks do.
"""
