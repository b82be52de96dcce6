"""`overhead.py infer`, `infer-floor`, `infer-speedups`: dlscale infer's offline throughput vs the plain inference loop;
and precision/runtime speed-ups.

Overhead (``infer``): A is the batch sweep's timing at one batch size (``infer.run.time_batch``:
the session's forward, each timed by the harness's step clock); B is the loop a person would
write (gpu_peers.forward_loop): the same model (same seed, eval, channels_last on CPU) and the same stacked
batch, one ``perf_counter`` around ``iters`` forwards under ``torch.inference_mode``. Rounds alternate A/B and
B/A in one process so drift in machine load hits both; prints each round's ratio A/B and the
median. Target: >= 0.98.

Speed-ups (``infer-speedups``): throughput of fp32, bf16 (autocast), int8 (PT2E x86 inductor,
compiled) and fp32 compiled on torch, and fp32 on onnxruntime at each batch size, sessions opened once and measured
in alternating rounds; prints each figure and the ratios over torch fp32 (median over rounds).

    .venv/bin/python benchmarks/overhead.py infer --model resnet18 --image-size 64 --batch-size 8 --iters 30 --rounds 6
    .venv/bin/python benchmarks/overhead.py infer-floor
    .venv/bin/python benchmarks/overhead.py infer-speedups --model resnet50 --image-size 224 --batch-sizes 1,8 --iters 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gpu_peers
from arms import say_arms
from dlscale.infer.config import InferConfig
from dlscale.infer.run import time_batch
from dlscale.infer.session import open_session

CPU = torch.device("cpu")


def session_of(model: str, image_size: int, precision: str = "fp32", runtime: str = "torch", compile: bool = False):
    cfg = InferConfig(model, batch_sizes="1", image_size=image_size, precision=precision, runtime=runtime,
                      compile=compile, device="cpu").resolve("cpu")
    return open_session(cfg, CPU)


def hand_written(model: str, image_size: int, batch: int, seed: int = 0):
    """The plain arm: build, eval, channels_last, gpu_peers.forward_loop (eager, inference_mode); run -> images/s."""
    from dlscale import workloads

    w = workloads.get(model)
    torch.manual_seed(seed)
    net = w.build().eval().to(memory_format=torch.channels_last)
    s = session_of(model, image_size)  # only for the same samples as A
    x = torch.stack([s.sample(i) for i in range(batch)]).contiguous(memory_format=torch.channels_last)
    loop = gpu_peers.forward_loop(net, x)

    def run(warmup: int, iters: int) -> float:
        loop(warmup)
        return batch * iters / loop(iters)

    return run


def run_infer(a: argparse.Namespace) -> None:
    say_arms({"dlscale": "infer.run.time_batch: the session's forward (torch fp32, eager), timed by the harness",
              "plain": "gpu_peers.forward_loop: fp32, eager, inference_mode, one perf_counter a block"})
    s = session_of(a.model, a.image_size)
    hand = hand_written(a.model, a.image_size, a.batch_size)

    def dl() -> float:
        times = time_batch(s, a.batch_size, a.warmup, a.iters)
        return s.units(a.batch_size) * len(times) / sum(times)

    ratios = []
    for r in range(a.rounds):
        if r % 2 == 0:
            x, y = dl(), hand(a.warmup, a.iters)
        else:
            y, x = hand(a.warmup, a.iters), dl()
        ratios.append(x / y)
        print(f"round {r + 1}: dlscale {x:.1f} images/s, plain {y:.1f} images/s, ratio {ratios[-1]:.3f}",
              flush=True)
    print(f"median ratio dlscale / plain over {len(ratios)} rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


def run_infer_floor(a: argparse.Namespace) -> None:
    """What dlscale adds per forward, free of load noise: time_batch's per-forward time on tinycnn at
    batch 1 minus the plain loop's (gpu_peers.forward_loop), both best of 5 blocks of 2,000 forwards, eager fp32."""
    s = session_of("tinycnn", 8)
    from dlscale import workloads

    torch.manual_seed(0)
    net = workloads.get("tinycnn").build().eval().to(memory_format=torch.channels_last)
    bare = gpu_peers.forward_loop(net, s.collate([s.sample(0)]))
    dl = min(statistics.mean(time_batch(s, 1, 50, 2000)) for _ in range(5))
    hand = min(bare(2000) / 2000 for _ in range(5))
    print(f"per forward: dlscale {dl * 1e6:.1f} us, plain loop {hand * 1e6:.1f} us, "
          f"added {(dl - hand) * 1e6:.1f} us")


def run_infer_speedups(a: argparse.Namespace) -> None:
    configs = [("fp32", "torch"), ("bf16", "torch"), ("int8", "torch"), ("fp32", "onnxruntime"),
               ("fp32", "torch", True)]  # the last: fp32 with --compile, the fair baseline of int8 (always compiled)
    say_arms({_name(c): _label(c) for c in configs})
    t0 = time.perf_counter()
    sessions = {c: session_of(a.model, a.image_size, *c) for c in configs}
    print(f"sessions opened (export, quantisation) in {time.perf_counter() - t0:.0f} s", flush=True)
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    thr: dict[tuple, list[float]] = {(c, b): [] for c in configs for b in sizes}
    for r in range(a.rounds):
        for b in sizes:
            for c in (configs if r % 2 == 0 else configs[::-1]):
                s = sessions[c]
                times = time_batch(s, b, a.warmup, a.iters)
                thr[(c, b)].append(s.units(b) * len(times) / sum(times))
                print(f"round {r + 1} batch {b} {_name(c)}: {thr[(c, b)][-1]:.2f} images/s", flush=True)
    for b in sizes:
        base = statistics.median(thr[(configs[0], b)])
        for c in configs:
            med = statistics.median(thr[(c, b)])
            print(f"batch {b:>3} {_name(c):<22} {med:8.2f} images/s  x{med / base:.2f} vs torch fp32 eager")


def _name(c: tuple) -> str:
    return f"{c[0]}/{c[1]}" + ("/compiled" if (len(c) > 2 and c[2]) or c[0] == "int8" else "")  # int8 always is


def _label(c: tuple) -> str:
    """What a speed-up arm runs: int8 is PT2E-quantised and always compiled; the others as their name says."""
    if c[0] == "int8":
        return "int8 (PT2E x86 inductor), compiled"
    if c[1] == "onnxruntime":
        return "fp32 on onnxruntime's CPU session"
    how = "compiled (torch.compile)" if len(c) > 2 and c[2] else "eager"
    return f"{c[0]}{' autocast' if c[0] == 'bf16' else ''} on torch, {how}"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--batch-sizes", default="1,8", help="infer-speedups: batch sizes")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=6)
