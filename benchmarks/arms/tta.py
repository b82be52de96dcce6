"""`overhead.py tta`: what dlscale's time-to-accuracy training loop costs: its epoch throughput against the plain loop.

A: ``dlscale.tta.loop.train_epoch`` (LR set from the schedule every step, the loss summed on
the device, read and checked once per epoch). B: the plain loop over the same batches
(gpu_peers.sgd_step: forward, cross-entropy, backward, SGD step, eager; nothing else). Both train tinycnn on the
same in-memory batches of the digits (decoded once, so the data pipeline is out of the
comparison) from the same initial weights, one thread. A/B alternate, the first of each round
alternating; the ratio A/B of epoch throughputs is reported per round with the median.
Target: ratio >= 0.97.

    .venv/bin/python benchmarks/overhead.py tta [--rounds 7] [--data /tmp/digits]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--data", default=None, help="a digits tree (default: made in a temporary directory)")


def run(args: argparse.Namespace) -> None:
    import torch

    import gpu_peers
    from arms import say_arms
    from dlscale import workloads
    from dlscale.data.loader import build_loader
    from dlscale.domains.classification.digits import make_digits
    from dlscale.tta.loop import train_epoch
    from dlscale.tta.schedules import Schedule

    torch.set_num_threads(1)
    root = args.data or make_digits(tempfile.mkdtemp(prefix="digits-"), size=16)["root"]
    batches = list(build_loader(root, "train", 32, 16, 0, train=True, distributed=(0, 1), plain_resize=True))
    batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]
    n = sum(len(y) for _, y in batches)
    sched = Schedule("cosine", peak=0.05, total_epochs=args.rounds * 2)
    cpu = torch.device("cpu")

    def fresh():
        torch.manual_seed(0)
        m = workloads.get("tinycnn").builder(10).to(memory_format=torch.channels_last)
        return m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

    def ours() -> float:
        m, opt = fresh()
        t = time.perf_counter()
        train_epoch(m, opt, batches, cpu, lambda s: sched.lr(s, len(batches)), 0, 0.0, None, True)
        return n / (time.perf_counter() - t)

    def bare() -> float:
        torch.manual_seed(0)
        m = workloads.get("tinycnn").builder(10).to(memory_format=torch.channels_last).train()
        step = gpu_peers.sgd_step(m, *batches[0], "fp32", cpu, lr=0.05)
        t = time.perf_counter()
        for x, y in batches:
            step(x, y)
        return n / (time.perf_counter() - t)

    say_arms({"dlscale": "tta.loop.train_epoch: tinycnn fp32, eager, SGD, the LR from the schedule every step",
              "plain": gpu_peers.sgd_label("fp32") + " over the same batches, tinycnn"})
    ours(), bare()  # warm-up: first-call allocations and oneDNN primitive creation
    ratios = []
    for r in range(args.rounds):
        a, b = (ours(), bare()) if r % 2 == 0 else tuple(reversed((bare(), ours())))
        ratios.append(a / b)
        print(f"round {r + 1}: dlscale {a:8.1f} samples/s  plain {b:8.1f} samples/s  ratio {a / b:.3f}")
    print(f"median ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) "
          f"over {args.rounds} rounds, {len(batches)} steps of 32 per epoch")

