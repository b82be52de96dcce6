"""`overhead.py monitor`: training throughput with dlscale's resource monitor on vs off, side by side.

One model, optimizer and batch (dlscale's own training step); rounds alternate on/off then
off/on so drift on the machine hits both. Each window times ``--steps`` steps with the harness's
``timed_loop``; "on" runs the monitor (default 1 s interval, as in every run) around the window.
Prints the ratio on/off (median over rounds and pooled; the target is >= 0.99) and the sampler's
own cost (CPU time of one sample over the interval), which noise on a shared machine cannot hide.

    python benchmarks/overhead.py monitor
    python benchmarks/overhead.py monitor --model tinycnn --image-size 32 --steps 400 --rounds 10 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dlscale.config import TrainConfig
from dlscale.harness.timing import timed_loop
from dlscale.monitor import Monitor
from dlscale.train.shorttest import build_setup


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30, help="steps per window")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def run(a: argparse.Namespace) -> None:
    from arms import say_arms

    say_arms({"on": f"dlscale's short-test step (eager) under timed_loop, the Monitor sampling every {a.interval} s",
              "off": "the same step and loop, no Monitor"})
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = TrainConfig(model=a.model, batch_size=a.batch_size, image_size=a.image_size, device="cpu").resolve("cpu")
    device = torch.device("cpu")
    setup = build_setup(cfg, device, seed=0)
    for _ in range(5):
        setup.step()

    def window(monitor: bool) -> float:
        if monitor:
            with Monitor(a.interval):
                times, _ = timed_loop(setup.step, 0, a.steps, device)
        else:
            times, _ = timed_loop(setup.step, 0, a.steps, device)
        return a.batch_size * len(times) / sum(times)

    on, off = [], []
    for r in range(a.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for m in order:
            (on if m else off).append(window(m))
        print(f"round {r + 1}: on {on[-1]:.1f}  off {off[-1]:.1f} samples/s  ratio {on[-1] / off[-1]:.4f}", flush=True)
    ratios = [x / y for x, y in zip(on, off)]
    probe = Monitor(a.interval)  # the sampler's own cost: thread CPU time of one sample
    c0 = time.thread_time()
    for _ in range(50):
        probe._sample()
    per_sample = (time.thread_time() - c0) / 50
    print(f"{a.model} {a.image_size}px batch {a.batch_size}, {a.steps} steps x {a.rounds} rounds, interval {a.interval} s, "
          f"{torch.get_num_threads()} threads")
    print(f"monitor on/off throughput ratio: median {statistics.median(ratios):.4f}, "
          f"pooled {statistics.mean(on) / statistics.mean(off):.4f} (target >= 0.99)")
    print(f"one sample costs {per_sample * 1e3:.2f} ms of CPU: {per_sample / a.interval:.3%} of one core at a "
          f"{a.interval} s interval")

