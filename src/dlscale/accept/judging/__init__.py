"""The verdicts and their statistics: figure and expectation to PASS / WARN / FAIL / NO EXPECTATION / ERROR
(``verdict.py``), the significance tests (``significance.py``), the spread between runs (``noise.py``), the
verdicts that explain each other and those that are not comparisons (``explain.py``)."""
