"""Time to accuracy (``dlscale tta``): train to a target of a domain's quality metric and record the curve.

repeats.py (``--runs``, the olympic mean, the speed-up over one node) runs classifier.py (image classifiers to a
top-1 target) or domain.py (every other domain's ``tasks.Task`` to its metric) in epochs.py's epoch loop,
here or on every rank (worker.py); beside them: the LR schedules, LARS, checkpoints and resume, MLPerf logs.
"""
