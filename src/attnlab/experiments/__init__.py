"""Training experiments too long for a notebook, run from the command line; each writes its
results into ``attnlab/data/`` for the chapters to load (``python -m attnlab.experiments.NAME --help``)."""
