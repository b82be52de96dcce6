"""`overhead.py train`: dlscale's measured training loop vs the plain PyTorch loop, side by side.

Both loops train the same model (same init), batch, precision and memory format, in one process,
alternating A/B then B/A round by round so drift on the machine hits both. Prints, per config,
the ratio dlscale throughput / plain throughput (median over rounds, and pooled).

    python benchmarks/overhead.py train                # the four configs of docs/PERFORMANCE.md
    python benchmarks/overhead.py train --quick        # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gpu_peers
from arms import say_arms
from dlscale import workloads
from dlscale.config import TrainConfig
from dlscale.harness.timing import timed_loop
from dlscale.train.shorttest import build_setup

CONFIGS = [
    ("resnet18", 64, 32, "fp32"),
    ("resnet18", 64, 32, "bf16"),
    ("resnet50", 224, 8, "fp32"),
    ("resnet50", 224, 8, "bf16"),
]


def hand_written(model_name: str, image_size: int, batch: int, precision: str, seed: int):
    """The plain arm: gpu_peers.sgd_step (eager) on the same model and batch, one perf_counter around the block."""
    w = workloads.get(model_name)
    torch.manual_seed(seed)
    model = w.build().to(memory_format=torch.channels_last).train()
    x, y = w.image_batch(batch, image_size, "cpu", seed=seed)
    step = gpu_peers.sgd_step(model, x.contiguous(memory_format=torch.channels_last), y, precision,
                              torch.device("cpu"), lr=0.01)

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        return time.perf_counter() - t0

    return run


def dlscale_loop(model_name: str, image_size: int, batch: int, precision: str, seed: int):
    cfg = TrainConfig(model=model_name, batch_size=batch, image_size=image_size, precision=precision,
                      device="cpu").resolve("cpu")
    device = torch.device("cpu")
    setup = build_setup(cfg, device, seed=seed)

    def run(n: int) -> float:
        times, _ = timed_loop(setup.step, 0, n, device)
        return sum(times)

    return run


def measure(model_name, image_size, batch, precision, rounds, steps, warmup, hand_first=False):
    if hand_first:  # build order changes where each model's memory lands: check it is not the effect
        b = hand_written(model_name, image_size, batch, precision, seed=0)
        a = dlscale_loop(model_name, image_size, batch, precision, seed=0)
    else:
        a = dlscale_loop(model_name, image_size, batch, precision, seed=0)
        b = hand_written(model_name, image_size, batch, precision, seed=0)
    a(warmup)
    b(warmup)
    ratios, ta, tb = [], 0.0, 0.0
    for r in range(rounds):
        order = (a, b) if r % 2 == 0 else (b, a)
        t = {id(f): f(steps) for f in order}
        ta += t[id(a)]
        tb += t[id(b)]
        ratios.append(t[id(b)] / t[id(a)])  # throughput ratio = time(hand) / time(dlscale)
    return statistics.median(ratios), tb / ta, min(ratios), max(ratios)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=8, help="steps per block")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="resnet18 fp32 only, 2 rounds of 3 steps")
    p.add_argument("--only", help="run only configs whose 'model/precision' contains this, e.g. bf16")
    p.add_argument("--hand-first", action="store_true", help="build the plain arm's model first")


def run(args: argparse.Namespace) -> None:
    configs = CONFIGS[:1] if args.quick else CONFIGS
    if args.only:
        configs = [c for c in configs if args.only in f"{c[0]}/{c[3]}"]
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 3, 1
    say_arms({"dlscale": "dlscale's short-test step (train.shorttest.build_setup), eager, SGD, channels_last, "
                         "timed by the harness's timed_loop",
              "plain": gpu_peers.sgd_label("the config's precision") + ", channels_last, one perf_counter a block"})
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.rounds} alternating rounds x {args.steps} steps each; ratio = dlscale / plain throughput")
    print(f"{'model':10} {'size':>5} {'batch':>5} {'prec':>5} {'median ratio':>13} {'pooled ratio':>13} {'min':>6} {'max':>6}")
    for cfg in configs:
        med, pooled, lo, hi = measure(*cfg, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                                      hand_first=args.hand_first)
        print(f"{cfg[0]:10} {cfg[1]:5d} {cfg[2]:5d} {cfg[3]:>5} {med:13.4f} {pooled:13.4f} {lo:6.3f} {hi:6.3f}", flush=True)
