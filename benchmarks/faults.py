"""Injected faults: does `dlscale accept` catch them and pass a healthy machine (false alarms and misses, counted),
and how large each fault looks to dlscale's measurements, healthy and faulty runs alternating. Needs root,
iproute2 and a cgroup cpu controller for the faults. benchmarks/README.md lists the entry points.

    python benchmarks/faults.py accept --only a --healthy 1 --spec quick   # healthy runs only, the built-in --quick
    python benchmarks/faults.py accept --healthy 10 --rounds 3             # the whole proof, (a)-(d)
    python benchmarks/faults.py magnitudes --rounds 1                      # each fault's size: quota, node, link
"""

from __future__ import annotations

import sys

from arms import dispatch

SUBCOMMANDS = {  # name -> (module under arms/, one line of help)
    "accept": ("accept", "dlscale accept on healthy runs and with a fault injected: false alarms and misses"),
    "magnitudes": ("magnitudes", "each injected fault's size as dlscale measures it, faulty beside healthy"),
}

if __name__ == "__main__":
    sys.exit(dispatch(SUBCOMMANDS, __doc__))
