"""The short test's CPU GEMM peak probe: bounded by its time budget against the old fixed 2048^3.

Each round runs, in fresh processes alternating in order, the probe as the short test calls it
(``peaks.measured_cpu_gemm_peak(precision)``, which grows n from 256 while the next size fits its
budget) and the probe with an unbounded budget (always n = 2048: what every short test did before),
and prints each one's wall time, the size it measured at and the rate. Run it once as this
machine is and once capped at AVX2, where bf16 has no native kernels:

    .venv/bin/python benchmarks/peak_probe.py --precision bf16 --rounds 2
    DLSCALE_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 \\
        .venv/bin/python benchmarks/peak_probe.py --precision bf16 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = """
import json, sys, time
from dlscale import peaks
budget = float(sys.argv[2])
t0 = time.perf_counter()
p = peaks.measured_cpu_gemm_peak(sys.argv[1], budget_s=budget)
print(json.dumps({"seconds": time.perf_counter() - t0, "gflops": p.flops / 1e9, "source": p.source}))
"""


def probe(precision: str, budget: float) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, precision, str(budget)], capture_output=True, text=True,
                         check=True, env=os.environ)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from dlscale import peaks

    caps = {k: os.environ[k] for k in ("DLSCALE_CPU_ISA", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA") if k in os.environ}
    print(f"precision {args.precision}, caps {caps or 'none'}, load average {os.getloadavg()[0]:.2f}")
    ratios = []
    for r in range(args.rounds):
        order = [("bounded", peaks.PROBE_BUDGET_S), ("fixed 2048", 1e9)]
        if r % 2:
            order.reverse()
        got = {name: probe(args.precision, budget) for name, budget in order}
        for name, g in got.items():
            print(f"round {r + 1} {name:>10}: {g['seconds']:8.2f} s, {g['gflops']:9.2f} GFLOP/s  ({g['source']})")
        ratios.append(got["fixed 2048"]["seconds"] / got["bounded"]["seconds"])
    print(f"fixed / bounded wall time, median of {args.rounds}: {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
