"""dlscale's 2-rank gloo data-parallel throughput vs a hand-written torchrun + DDP loop, side by side.

Starts one 2-rank job with torchrun (through dlscale's own launcher) running
benchmarks/ddp_ab_worker.py, which alternates A (dlscale's per-rank data-parallel short test) and
B (a hand-written DDP loop of the same model, batch, image size and steps) in the same two
processes, so a drift in machine load hits both. Prints each round's ratio A/B and the median.
Target: >= 0.98.

    .venv/bin/python benchmarks/ddp_overhead.py --model resnet18 --image-size 32 --batch-size 16 --steps 30 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="threads per rank")
    a = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-c", (
        "import sys; from dlscale.distributed.launch import run_torchrun; from dlscale.layout import Layout; "
        f"sys.exit(run_torchrun('ddp_ab_worker', {[a.model, str(a.image_size), str(a.batch_size), str(a.warmup_steps), str(a.steps), str(a.rounds)]!r}, Layout(nproc_per_node=2)))")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = [json.loads(x) for x in (p.stdout + p.stderr).splitlines() if x.startswith('{"round"')]
    if p.returncode != 0 or not rows:
        sys.exit(f"benchmark failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    ratios = []
    for r in rows:
        ratios.append(r["dlscale"] / r["hand_written"])
        print(f"round {r['round']}: dlscale {r['dlscale']:.1f} samples/s, hand-written {r['hand_written']:.1f} "
              f"samples/s, ratio {ratios[-1]:.3f}")
    print(f"median ratio dlscale / hand-written over {len(ratios)} rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
