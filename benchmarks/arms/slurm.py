"""`predict_validation.py slurm`: the same layouts through Slurm and emulated without it: 2x1 and 3x1 side by side, interleaved.

Starts a rehearsal Slurm of three nodes (dlscale.cluster: each node in its own network namespace, its
links shaped at --link), then per round runs every layout both ways in a rotated order:

- slurm: a one-point sweep file (`nnodes: N`) through `dlscale sweep --executor slurm`: one job, one
  task per node, torchrun on every node with c10d rendezvous on the first, a rank per node;
- emulated: `dlscale train ... --nproc-per-node 1 --emulate-nodes N --link-bandwidth LINK`: dlscale's
  own launcher, one torchrun per emulated node, static rendezvous.

Both are the same short test on the same kind of node and link, so their throughputs should agree;
what differs is who starts the ranks (Slurm's srun and slurmstepd, or dlscale) and how they meet.
Prints each layout's median throughput both ways and the ratio slurm / emulated, and every run's
figure. Needs root, slurm-wlm, munge and iproute2.

    .venv/bin/python benchmarks/predict_validation.py slurm --rounds 3
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


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--link", default="1gbit")
    ap.add_argument("--nodes", default="2,3", help="the layouts' node counts (one rank per node)")


def run(a: argparse.Namespace) -> None:
    from arms import say_arms
    from dlscale.cluster import SlurmCluster

    say_arms({"slurm": "a one-point `dlscale sweep --executor slurm` job: srun, torchrun per node, c10d rendezvous",
              "emulated": "`dlscale train --emulate-nodes N`: dlscale's launcher, static rendezvous"})

    work = Path(tempfile.mkdtemp(prefix="slurm-nodes-"))
    db = str(work / "runs.db")
    test = {"model": a.model, "image_size": a.image_size, "batch_size": a.batch_size, "warmup_steps": a.warmup_steps,
            "steps": a.steps, "device": "cpu", "threads_per_rank": 1, "breakdown_steps": 0, "nproc_per_node": 1}
    layouts = [(way, int(n)) for n in a.nodes.split(",") for way in ("slurm", "emulated")]
    figures: dict[tuple[str, int], list[float]] = {k: [] for k in layouts}
    with SlurmCluster(nodes=max(n for _, n in layouts), link_bandwidth=a.link) as cluster:
        env = {**os.environ, **cluster.env(), "DLSCALE_SLURM_POLL_S": "1", "OMP_NUM_THREADS": "1"}
        for r in range(a.rounds):
            k = r % len(layouts)
            for way, n in layouts[k:] + layouts[:k]:
                print(f"round {r + 1}: {n}x1 {way}", file=sys.stderr, flush=True)
                figures[(way, n)].append(run(way, n, test, a.link, db, work, env))
    print(f"{a.model} {a.image_size}px batch {a.batch_size}, one rank per node, {a.link} links, {a.rounds} rounds")
    print(f"{'layout':8} {'slurm (/s)':>12} {'emulated (/s)':>14} {'slurm/emulated':>15}")
    for n in sorted({n for _, n in layouts}):
        s, e = statistics.median(figures[("slurm", n)]), statistics.median(figures[("emulated", n)])
        print(f"{n}x1{'':5} {s:12.1f} {e:14.1f} {s / e:15.3f}")
    print(json.dumps({f"{n}x1 {way}": v for (way, n), v in figures.items()}))
    print(f"runs in {db}", file=sys.stderr)


def run(way: str, nodes: int, test: dict, link: str, db: str, work: Path, env: dict[str, str]) -> float:
    """One run of the layout, the given way; its throughput."""
    if way == "slurm":
        f = work / f"sweep-{nodes}.yaml"
        f.write_text(json.dumps({"name": f"slurm-{nodes}x1", "tag": "slurm-nodes", "timeout_per_run": 900,
                                 "slurm": {"time": 20}, "fixed": test, "matrix": {"nnodes": [nodes]}}))
        p = subprocess.run([sys.executable, "-m", "dlscale.cli.app", "sweep", str(f), "--executor", "slurm", "--db", db,
                            "--format", "json"], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise SystemExit(f"the Slurm point failed: {p.stderr[-2000:]}")
        return float(json.loads(p.stdout)[0]["throughput"])
    cmd = [sys.executable, "-m", "dlscale.cli.app", "train", test["model"], "--tag", "emulated-nodes", "--db", db,
           "--format", "json", "--emulate-nodes", str(nodes), "--link-bandwidth", link]
    for key in ("image_size", "batch_size", "warmup_steps", "steps", "device", "threads_per_rank", "breakdown_steps",
                "nproc_per_node"):
        cmd += [f"--{key.replace('_', '-')}", str(test[key])]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"the emulated run failed: {p.stderr[-2000:]}")
    return float(json.loads(p.stdout)["metrics"]["throughput"])

