"""dlscale's measured training loop vs a minimal hand-written PyTorch loop, side by side.

Both loops train the same model (same init), batch, precision and memory format, in one process,
alternating A/B then B/A round by round so drift on the machine hits both. Prints, per config,
the ratio dlscale throughput / hand-written throughput (median over rounds, and pooled).

    python benchmarks/overhead.py                      # the four configs of docs/PERFORMANCE.md
    python benchmarks/overhead.py --quick              # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

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
    """The loop a person would write: no harness, one perf_counter around the block."""
    w = workloads.get(model_name)
    torch.manual_seed(seed)
    model = w.build().to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x, y = w.image_batch(batch, image_size, "cpu", seed=seed)
    x = x.contiguous(memory_format=torch.channels_last)
    dtype = torch.bfloat16 if precision == "bf16" else None

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=8, help="steps per block")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="resnet18 fp32 only, 2 rounds of 3 steps")
    p.add_argument("--only", help="run only configs whose 'model/precision' contains this, e.g. bf16")
    p.add_argument("--hand-first", action="store_true", help="build the hand-written model first")
    args = p.parse_args()
    configs = CONFIGS[:1] if args.quick else CONFIGS
    if args.only:
        configs = [c for c in configs if args.only in f"{c[0]}/{c[3]}"]
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 3, 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.rounds} alternating rounds x {args.steps} steps each")
    print(f"{'model':10} {'size':>5} {'batch':>5} {'prec':>5} {'median ratio':>13} {'pooled ratio':>13} {'min':>6} {'max':>6}")
    for cfg in configs:
        med, pooled, lo, hi = measure(*cfg, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                                      hand_first=args.hand_first)
        print(f"{cfg[0]:10} {cfg[1]:5d} {cfg[2]:5d} {cfg[3]:>5} {med:13.4f} {pooled:13.4f} {lo:6.3f} {hi:6.3f}", flush=True)


if __name__ == "__main__":
    main()
