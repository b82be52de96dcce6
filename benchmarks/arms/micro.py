"""`overhead.py micro`: what dlscale's microbenchmark harness costs: its figures against raw timing loops.

Two comparisons, each A/B alternating in the same process(es), ``--rounds`` times:

- GEMM: dlscale's TFLOP/s (``micro.gemm.build_gemm`` timed by ``micro.harness.timed_reps``,
  rate by ``micro.harness.rates``: the mean on CPUs, the median window on GPUs) against a raw
  loop of ``torch.matmul(a, b, out=c)`` timed with ``time.perf_counter`` around the whole loop.
  Target: ratio >= 0.98.
- all_reduce: dlscale's busbw (``micro.coll_worker.time_collective`` over ``collectives.Buffers``)
  against a raw ``dist.all_reduce`` loop (warm-up, barrier, N calls, perf_counter) of the same
  size and iterations, 2 ranks (gloo on CPU, NCCL on GPUs) under torchrun. Target: >= 0.95.

A ratio is dlscale / raw per round (which runs first alternates by round); the median over
rounds is reported with the min and max.

    .venv/bin/python benchmarks/overhead.py micro [--gemm 1024] [--size 4M] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def gemm_rounds(n: int, iters: int, rounds: int) -> list[tuple[float, float]]:
    import torch

    from dlscale.micro import gemm, harness

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    flops = gemm.gemm_flops(n, n, n)
    op = gemm.build_gemm(n, n, n, False, False, "fp32", dev)
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    c = torch.empty(n, n, device=dev)
    def ours() -> float:
        times = harness.timed_reps(op, warmup=2, reps=iters, device=dev, budget_s=None)
        return harness.rates(times, flops, None, None, "median" if dev.type == "cuda" else "mean")["tflops"]

    def raw() -> float:
        for _ in range(2):
            torch.matmul(a, b, out=c)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return flops * iters / (time.perf_counter() - t0) / 1e12

    return [alternate(ours, raw, r) for r in range(rounds)]


def alternate(ours, raw, r: int) -> tuple[float, float]:
    """A/B in alternating order: dlscale first in even rounds, the raw loop first in odd ones."""
    if r % 2 == 0:
        a = ours()
        return a, raw()
    b = raw()
    return ours(), b


def allreduce_worker(size: int, iters: int, rounds: int) -> None:
    """One rank: alternate dlscale's timing and a raw loop; rank 0 prints the ratios."""
    import torch
    import torch.distributed as dist

    from dlscale.distributed import env as dist_env
    from dlscale.micro.coll_worker import time_collective
    from dlscale.micro.collectives import COLLECTIVES, Buffers

    env = dist_env.detect()
    use_cuda = torch.cuda.is_available()
    backend = dist_env.init_process_group(env, device_type="cuda" if use_cuda else "cpu")
    dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    n, count = env.world_size, size // 4
    coll = COLLECTIVES["all_reduce"]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def reduce_max(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    bufs = Buffers(coll, count, "in-place", env.rank, n, dev)
    raw_buf = torch.ones(count, device=dev)
    def ours() -> float:
        times, _ = time_collective(bufs, 5, iters, 1e9, sync, reduce_max, dev)
        return coll.busbw(size / reduce_max(statistics.median(times)) / 1e9, n)

    def raw() -> float:
        for _ in range(5):
            dist.all_reduce(raw_buf)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(raw_buf)
        sync()
        return coll.busbw(size / reduce_max((time.perf_counter() - t0) / iters) / 1e9, n)

    ratios = [alternate(ours, raw, r) for r in range(rounds)]
    if env.rank == 0:
        report(f"all_reduce {size} B, {n} ranks ({backend}), {iters} iterations, busbw GB/s", ratios, 0.95)
    dist.destroy_process_group()


def report(what: str, pairs: list[tuple[float, float]], target: float) -> None:
    r = [o / w for o, w in pairs]
    print(f"{what}: dlscale {statistics.median(p[0] for p in pairs):.4g} vs raw "
          f"{statistics.median(p[1] for p in pairs):.4g}; ratio median {statistics.median(r):.3f} "
          f"(min {min(r):.3f}, max {max(r):.3f}, {len(r)} rounds; target >= {target})", flush=True)


ARMS = {"dlscale gemm": "micro.gemm.build_gemm fp32 (eager) timed by micro.harness.timed_reps, its rate by harness.rates",
        "raw gemm": "torch.matmul(a, b, out=c) fp32, eager, one perf_counter around the loop",
        "dlscale all_reduce": "micro.coll_worker.time_collective over collectives.Buffers, in-place, 2 ranks",
        "raw all_reduce": "dist.all_reduce loop: warm-up, barrier, N calls, one perf_counter, 2 ranks"}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gemm", type=int, default=1024, help="square GEMM size")
    p.add_argument("--gemm-iters", type=int, default=10)
    p.add_argument("--size", default="4M", help="all_reduce bytes (8, 64K, 4M)")
    p.add_argument("--iters", type=int, default=20, help="all_reduce iterations per round")
    p.add_argument("--rounds", type=int, default=5)


def run(a: argparse.Namespace) -> int:
    from arms import say_arms
    from dlscale.distributed.launch import run_torchrun
    from dlscale.layout import Layout

    say_arms(ARMS)
    report(f"GEMM {a.gemm}^3 fp32, {a.gemm_iters} iterations, TFLOP/s",
           gemm_rounds(a.gemm, a.gemm_iters, a.rounds), 0.98)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: arms.micro's ranks import it
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    return run_torchrun("arms.micro", ["--worker", "--size", a.size, "--iters", str(a.iters),
                                       "--rounds", str(a.rounds)], Layout(nproc_per_node=2), timeout_s=900)


def worker() -> None:
    """One rank of the all_reduce A/B (``python -m arms.micro --worker ...`` under torchrun)."""
    from dlscale.micro.collectives import parse_size

    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    add_args(p)
    a = p.parse_args()
    allreduce_worker(parse_size(a.size), a.iters, a.rounds)


if __name__ == "__main__":
    worker()
