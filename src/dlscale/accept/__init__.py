"""``dlscale accept``: does this server (or cluster) perform as it should, and if not, which part is wrong?

The suite (``suite.py``) is a thin list of ``dlscale.api`` calls: each check makes ordinary recorded
runs, all tagged with one acceptance id, in a process of its own within its time limit and its
level's budget (``bounded.py``, ``run.py``; levels and limits in ``spec.py``). Judging only reads
records: ``figures.py`` reads each check's figures (with their raw samples) from its records,
``expect.py`` finds an expectation for each (datasheet x typical fraction, the system's own
baseline, a reference figure, or the median of its peers), and ``verdict.py`` turns figure and
expectation into PASS / WARN / FAIL / NO EXPECTATION, or ERROR where nothing sound was measured
(verdicts fail closed), with measured, expected, ratio, threshold, confidence interval and
significance, pure functions that can re-judge old records with new thresholds; ``inventory.py``
judges the node's counts; ``explain.py`` links verdicts that explain each other. ``run.py`` runs
the suite, judges it and records a run of kind ``accept``; ``outputs.py`` writes the verdicts as
JSON, JUnit XML, an HTML report and a manifest of sha256 sums that ``verify`` checks; ``slurm.py``
runs the suite as one Slurm job and judges it where it was submitted; ``nodehealth.py`` drains or
resumes the Slurm node an acceptance ran on. docs/METRICS.md ("Acceptance") derives every figure.
"""
