"""`overhead.py ddp` and `ddp-ops`: dlscale's data-parallel short test beside a plain DDP loop (gloo, 1 and 2 ranks).

For each rank count, starts one job through dlscale's own launcher running benchmarks/arms/ddp_worker.py,
which rotates, round by round in the same processes, dlscale's per-rank data-parallel short test, the plain
DDP loop of benchmarks/gpu_peers.py with the same DDP options, the plain loop with torch's DDP defaults and,
on one rank, the plain loop without DDP, so a drift in machine load hits every variant alike. Prints each
round's figures, then per rank count the medians of the per-round ratios:

- dlscale / plain (same model, batch, optimizer, DDP options): dlscale's own overhead; target >= 0.98;
- plain / plain-torch: what dlscale's DDP defaults (gradients as bucket views, no per-step buffer broadcast)
  gain over torch's;
- plain / alone and plain-torch / alone (one rank): the plain loop's data-parallel efficiency at one rank.

    .venv/bin/python benchmarks/overhead.py ddp --model resnet18 --image-size 32 --batch-size 16 --steps 30 --rounds 8

``ddp-ops`` looks inside one rank instead (this process, gloo, one thread): per DDP variant (no DDP,
torch's DDP defaults, dlscale's, dlscale's own training step under them, and DDP's batched gradient copy where
the installed torch has it) the operators one training step dispatches (top-level aten ops, each a kernel
launch on a GPU) and what DDP adds to them, and images per CPU-second of this process over ``--steps`` steps,
the variants rotated over ``--rounds`` rounds (CPU time, not wall time: other tenants' load on a shared
machine moves it much less):

    .venv/bin/python benchmarks/overhead.py ddp-ops --model resnet18 --image-size 32 --batch-size 16 --steps 15 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from arms import say_arms

HERE = Path(__file__).resolve().parents[1]  # benchmarks/: gpu_peers and arms import from there
NO_DDP = "plain, no DDP"
RATIOS = (("dlscale", "plain", "target >= 0.98"), ("plain", "plain-torch", "dlscale's DDP defaults over torch's"),
          ("plain", "alone", "DP efficiency at one rank, dlscale's DDP options"),
          ("plain-torch", "alone", "DP efficiency at one rank, torch's DDP defaults"))


ARMS = {  # the worker's variants (arms/ddp_worker.py), each as it runs: all eager, SGD, channels_last, gloo
    "dlscale": "dlscale's data-parallel short test (distributed.worker.data_parallel_short_test), DDP "
               "broadcast_buffers=False gradient_as_bucket_view=True",
    "plain": "gpu_peers train (sgd_step), DDP broadcast_buffers=False gradient_as_bucket_view=True (dlscale's options)",
    "plain-torch": "gpu_peers train (sgd_step), DDP broadcast_buffers=True gradient_as_bucket_view=False (torch's)",
    "alone": "gpu_peers train (sgd_step), no DDP (one rank only)",
}


def job(a: argparse.Namespace, ranks: int) -> list[dict]:
    """One job of ``ranks`` ranks running the A/B worker: its rounds (rank 0's JSON lines)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    argv = [a.model, str(a.image_size), str(a.batch_size), str(a.warmup_steps), str(a.steps), str(a.rounds)]
    cmd = [sys.executable, "-c", (
        "import sys; from dlscale.distributed.launch import run_torchrun; from dlscale.layout import Layout; "
        f"sys.exit(run_torchrun('arms.ddp_worker', {argv!r}, Layout(nproc_per_node={ranks})))")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = [json.loads(x) for x in (p.stdout + p.stderr).splitlines() if x.startswith('{"round"')]
    if p.returncode != 0 or not rows:
        sys.exit(f"benchmark failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return rows


def variants(a: argparse.Namespace) -> dict:
    """Each one-rank variant: a function that builds a fresh model and returns its training step. The plain
    ones are written as a user would (torchvision's model, SGD, channels_last); ``dlscale's step`` is the step
    `dlscale train --nproc-per-node 1` times (``train.shorttest.build_setup`` under DDP with
    ``worker.ddp_options``: its defaults)."""
    import inspect

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gpu_peers
    from dlscale.config import TrainConfig
    from dlscale.distributed.worker import ddp_options
    from dlscale.train.shorttest import build_setup

    cpu = torch.device("cpu")
    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch_size,))
    ours = {"broadcast_buffers": False, "gradient_as_bucket_view": True}

    def plain(opts: dict | None):
        def make():
            torch.manual_seed(0)
            m = gpu_peers.vision_model(a.model, cpu, channels_last=True)
            return gpu_peers.sgd_step(m if opts is None else DDP(m, **opts), x, y, "fp32", cpu, lr=0.01)
        return make

    cfg = TrainConfig(model=a.model, image_size=a.image_size, batch_size=a.batch_size, device="cpu").resolve("cpu")
    out = {"plain, no DDP": plain(None), "plain, torch's DDP defaults": plain({}),
           "plain, DDP broadcast_buffers=False gradient_as_bucket_view=True (dlscale's defaults)": plain(ours),
           "dlscale's short-test step under DDP with its defaults": lambda: build_setup(cfg, cpu, 0,
                                                 wrap_model=lambda m: DDP(m, **ddp_options(cfg))).step}
    if "batched_grad_copy" in inspect.signature(DDP.__init__).parameters:
        out["plain, dlscale's DDP defaults + batched_grad_copy"] = plain({**ours, "batched_grad_copy": True})
    return out


def run_ddp_ops(a: argparse.Namespace) -> None:
    """Operators per step and images per CPU-second by DDP variant, in this process (see the module doc)."""
    import collections
    import socket
    import time
    import warnings

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers= is deprecated from torch 2.13
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.set_num_threads(1)
    makers = variants(a)
    names = list(makers)
    say_arms({n: n for n in names})
    rates: dict[str, list[float]] = {k: [] for k in names}
    ops: dict[str, collections.Counter] = {}
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            step = makers[name]()
            for _ in range(a.warmup_steps):  # past DDP's bucket rebuild
                step()
            if r == 0:
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    step()
                ops[name] = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::") and (
                    e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
            t0 = time.process_time()
            for _ in range(a.steps):
                step()
            rates[name].append(a.batch_size * a.steps / (time.process_time() - t0))
    dist.destroy_process_group()
    for name in names:
        added = {k: ops[name][k] - ops[NO_DDP].get(k, 0) for k in sorted(ops[name])
                 if ops[name][k] != ops[NO_DDP].get(k, 0)}
        ratio = statistics.median(x / y for x, y in zip(rates[name], rates[NO_DDP]))
        print(f"{a.model}, {name}: {sum(ops[name].values())} operators per step, {statistics.median(rates[name]):.1f} "
              f"images per CPU-second (median over {a.rounds} rounds; {ratio:.3f} of no DDP, median of the rounds' "
              f"ratios); added by DDP: {added or 'none'}")
    ours = [x / y for x, y in zip(rates[names[3]], rates[names[2]])]
    print(f"{a.model}: dlscale's step / the plain DDP loop's with the same options, per CPU-second: median "
          f"{statistics.median(ours):.3f} (min {min(ours):.3f}, max {max(ours):.3f}, {len(ours)} rounds)")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--ranks", default="1,2", help="rank counts, one job each")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")


add_ddp_ops_args = add_args


def run(a: argparse.Namespace) -> None:
    say_arms(ARMS)
    for ranks in (int(x) for x in a.ranks.split(",")):
        rows = job(a, ranks)
        for r in rows:
            print(f"{ranks} rank(s), round {r['round']}: " + ", ".join(
                f"{k} {v:.1f}" for k, v in r.items() if k not in ("round", "ranks")) + " images/s")
        for num, den, what in RATIOS:
            if den in rows[0]:
                got = [r[num] / r[den] for r in rows]
                print(f"{ranks} rank(s): median {num} / {den} {statistics.median(got):.3f} (min {min(got):.3f}, "
                      f"max {max(got):.3f}, {len(got)} rounds; {what})")
