"""Real input pipelines: a synthetic JPEG dataset maker, the training loader and the staged bench.

Python modules live directly in this package; the ``deepbench/`` and ``reference/`` subfolders
hold package data files owned by other components.
"""
