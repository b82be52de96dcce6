"""Running a check: each in a process of its own within its time limit (``check_process.py``), one acceptance
at a time on a host (``host_lock.py``)."""
