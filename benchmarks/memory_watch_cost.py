"""CPU cost of one look of tune's --max-memory watch: the trial's whole tree vs its direct children only.

``dlscale tune`` looks at its running trial every 0.2 s (``tune.trials.MemoryWatch``), on the same
cores the trial is being timed on, so a look must stay cheap. "tree": the watch as it is, the
trial's tree found through /proc/PID/task/*/children and weighed by the sum of its resident sets
(/proc/PID/statm), which never falls below the sum of proportional set sizes, so PSS
(/proc/PID/smaps_rollup, several ms a process) is read only past the limit ("tree+pss": a look
there). "scan": the watch before it, which read /proc/*/stat of every process on the machine for
the direct children of the tune and their resident sets. The trial here is a Python
process with torch imported and two workers below it (torch imported too), as a trial with
data-loader workers is. Rounds alternate the order; each times ``--looks`` looks with
``time.thread_time`` (CPU time of this thread, which other users' load does not inflate).

    python benchmarks/memory_watch_cost.py
    python benchmarks/memory_watch_cost.py --rounds 10 --looks 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dlscale import procs

LIMIT = 2**50  # never reached: only the cost of looking is measured
TRIAL = ("import subprocess, sys, time, torch\n"
         "ws = [subprocess.Popen([sys.executable, '-c', 'import time, torch; time.sleep(600)']) for _ in range(2)]\n"
         "print(' '.join(str(w.pid) for w in ws), flush=True)\n"
         "time.sleep(600)\n")


def look_tree(me: int, limit: int = LIMIT) -> int:
    """A: what MemoryWatch does each look now (the PSS sum only once the resident sum passes ``limit``)."""
    over = 0
    for child in procs.children(me):
        members = procs.tree(child)
        over += procs.resident_bytes(members) > limit and procs.proportional_bytes(members) > limit
    return over


def look_scan(me: int, page: int) -> int:
    """B: what MemoryWatch did each look before (every process's stat, the tune's children's RSS)."""
    over = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            over += int(fields[1]) == me and int(fields[21]) * page > LIMIT
        except (OSError, ValueError, IndexError):
            continue
    return over


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--looks", type=int, default=100, help="looks per timed window")
    a = ap.parse_args()
    trial = subprocess.Popen([sys.executable, "-c", TRIAL], stdout=subprocess.PIPE, text=True)
    workers = [int(p) for p in trial.stdout.readline().split()]
    try:
        time.sleep(2.0)
        me, page = os.getpid(), os.sysconf("SC_PAGE_SIZE")
        print(f"trial tree: {procs.tree(trial.pid)}; processes on the machine: "
              f"{sum(1 for _ in Path('/proc').glob('[0-9]*/stat'))}", flush=True)
        looks = {"tree": lambda: look_tree(me), "scan": lambda: look_scan(me, page),
                 "tree+pss": lambda: look_tree(me, limit=0)}  # near the limit: the PSS sum is read too
        ms: dict[str, list[float]] = {k: [] for k in looks}
        for r in range(a.rounds):
            order = list(looks) if r % 2 == 0 else list(reversed(looks))
            for name in order:
                t0 = time.thread_time()
                for _ in range(a.looks):
                    looks[name]()
                ms[name].append((time.thread_time() - t0) / a.looks * 1e3)
            print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.3f} ms" for k, v in ms.items()), flush=True)
        for name, v in ms.items():
            med = statistics.median(v)
            print(f"{name}: median {med:.3f} ms a look = {med / 200 * 100:.2f}% of one core at one look per 0.2 s")
        print(f"ratio tree / scan (median of rounds): "
              f"{statistics.median(x / y for x, y in zip(ms['tree'], ms['scan'])):.2f}")
    finally:
        procs.kill([trial.pid, *workers])
        trial.wait()


if __name__ == "__main__":
    main()
