"""The plan and its levels: the spec (checks, levels, budgets, time limits, thresholds: ``spec.py``) resolved
against this machine into the checks that run here, with the api call of each (``suite.py``)."""
