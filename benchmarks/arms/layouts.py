"""`predict_validation.py layouts`: scale-up vs scale-out on one machine: 1x1, 1x2 and 2x1 on emulated nodes at two link rates, interleaved.

On a shared machine the load drifts between runs, so a ladder run once point after point
compares different machines. This script runs every layout once per round, in a rotated order,
for --rounds rounds, all under one tag; `dlscale scale --from-store` then averages the runs at each
point (analysis/scaling.py) and prints the efficiency and layout tables.

    .venv/bin/python benchmarks/predict_validation.py layouts --model resnet18 --image-size 64 --steps 20 --rounds 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--links", default="1gbit,10gbit")
    ap.add_argument("--db", default=None, help="results database (default: a temporary one)")


def run(a: argparse.Namespace) -> None:
    db = a.db or str(Path(tempfile.mkdtemp()) / "scale.db")
    tag = "scale-layouts"
    base = [sys.executable, "-m", "dlscale.cli.app", "train", a.model, "--image-size", str(a.image_size),
            "--batch-size", str(a.batch_size), "--warmup-steps", str(a.warmup_steps), "--steps", str(a.steps),
            "--device", "cpu", "--threads-per-rank", "1", "--breakdown-steps", "0", "--tag", tag, "--db", db,
            "--format", "json"]
    layouts = [["--nproc-per-node", "1"], ["--nproc-per-node", "2"]]
    layouts += [["--nproc-per-node", "1", "--emulate-nodes", "2", "--link-bandwidth", bw] for bw in a.links.split(",")]
    from arms import say_arms

    say_arms({" ".join(x): f"dlscale train {a.model} {' '.join(x)}, eager, one thread a rank" for x in layouts})
    for r in range(a.rounds):
        k = r % len(layouts)
        for extra in layouts[k:] + layouts[:k]:
            print(f"round {r + 1}: {' '.join(extra)}", file=sys.stderr, flush=True)
            subprocess.run(base + extra, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "dlscale.cli.app", "scale", "--from-store", "--tag", tag, "--db", db], check=True)
    print(f"runs in {db}, tag {tag}", file=sys.stderr)

