"""Sphinx configuration of the API reference (``pyterrier_multiquery/pt_docs``, pyterrier_dr's layout), built in CI
with warnings as errors::

    sphinx-build -W -c docs/sphinx -b html pyterrier_multiquery/pt_docs build/api
"""
project = 'pyterrier-multiquery'
extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon']
autodoc_class_signature = 'separated'
autodoc_typehints = 'none'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
exclude_patterns = []
html_theme = 'alabaster'
