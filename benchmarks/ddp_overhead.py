"""dlscale's 2-rank gloo data-parallel throughput vs a hand-written torchrun + DDP loop, side by side.

Alternates A (``dlscale train MODEL --nproc-per-node 2``) and B (benchmarks/ddp_baseline_worker.py
under torchrun) for --rounds rounds with the same model, batch, image size, steps and threads per
rank, and prints each pair's ratio A/B and their median. Target: >= 0.98.

    .venv/bin/python benchmarks/ddp_overhead.py --model resnet18 --image-size 32 --batch-size 16 --steps 30 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_dlscale(a, db: str) -> float:
    cmd = [sys.executable, "-m", "dlscale.cli.app", "train", a.model, "--image-size", str(a.image_size),
           "--batch-size", str(a.batch_size), "--warmup-steps", str(a.warmup_steps), "--steps", str(a.steps),
           "--device", "cpu", "--nproc-per-node", "2", "--threads-per-rank", str(a.threads), "--format", "json",
           "--db", db, "--tag", "ddp-overhead"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout)["metrics"]["throughput"]


def run_baseline(a) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(HERE / "ddp_baseline_worker.py"), a.model, str(a.image_size), str(a.batch_size),
           str(a.warmup_steps), str(a.steps)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    line = [x for x in p.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)["throughput"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="threads per rank")
    a = ap.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as d:
        db = str(Path(d) / "bench.db")
        for r in range(a.rounds):
            # Alternate which goes first, so a drift in machine load does not favour one side.
            if r % 2 == 0:
                x, y = run_dlscale(a, db), run_baseline(a)
            else:
                y, x = run_baseline(a), run_dlscale(a, db)
            ratios.append(x / y)
            print(f"round {r + 1}: dlscale {x:.1f} samples/s, hand-written {y:.1f} samples/s, ratio {x / y:.3f}",
                  flush=True)
    print(f"median ratio dlscale / hand-written over {a.rounds} rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
