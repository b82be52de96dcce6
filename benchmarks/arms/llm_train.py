"""`overhead.py llm-train`: dlscale's LLM short test vs the plain training loop of the same Llama model, side by side.

B is the loop a person would write with transformers and PyTorch alone (gpu_peers.llama_step): the same
``LlamaForCausalLM`` config (random init from the same seed), the same random-token batch shape,
next-token cross-entropy in fp32, AdamW, autocast for bf16, timed with one perf_counter around its
measured steps. A is dlscale, in one of two modes:

- ``--mode loop`` (default): the short test's own step (``build_setup``) timed by the harness's
  ``timed_loop``, both models built once, alternating blocks of ``--steps`` steps A/B then B/A:
  short blocks keep drift on a shared machine out of the ratio;
- ``--mode api``: ``dlscale.api.train`` exactly as a user calls it (monitor on, record written to a
  scratch database, a fresh model each round) against a fresh plain loop each round: the
  whole short test, but each round is long, so drift between A and B enters the ratio.

Prints each round's ratio A/B (tokens/s), the median (target >= 0.98) and the pooled ratio, then
one JSON line.

    .venv/bin/python benchmarks/overhead.py llm-train                               # llama_tiny, fp32 and bf16
    .venv/bin/python benchmarks/overhead.py llm-train --mode api --rounds 5 --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

os.environ.setdefault("DLSCALE_QUIET", "1")

import gpu_peers  # noqa: E402
from arms import say_arms  # noqa: E402
from dlscale import api, workloads  # noqa: E402
from dlscale.config import TrainConfig  # noqa: E402
from dlscale.harness.device import set_matmul_precision  # noqa: E402
from dlscale.harness.timing import timed_loop  # noqa: E402
from dlscale.train.shorttest import build_setup  # noqa: E402


def hand_written(model: str, batch: int, seq_len: int, precision: str, lr: float) -> Callable[[int], float]:
    """The plain arm: gpu_peers.llama_step (eager, AdamW) on the same Llama; returns run(n) -> tokens/s over n steps."""
    from transformers import LlamaForCausalLM

    conf = workloads.get(model).llama_config(TrainConfig(model=model, seq_len=seq_len))
    torch.manual_seed(0)
    net = LlamaForCausalLM(conf).train()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, conf.vocab_size, (batch, seq_len + 1), generator=g)
    step = gpu_peers.llama_step(net, tokens, precision, weight_decay=1e-4)

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        return batch * seq_len * n / (time.perf_counter() - t0)

    return run


def dlscale_loop(model: str, batch: int, seq_len: int, precision: str, lr: float) -> Callable[[int], float]:
    """The short test's step under the harness's timed_loop; returns run(n) -> tokens/s over n steps."""
    cfg = TrainConfig(model=model, batch_size=batch, seq_len=seq_len, precision=precision, optimizer="adamw",
                      lr=lr, device="cpu").resolve("cpu")
    device = torch.device("cpu")
    set_matmul_precision(cfg.precision, device)
    setup = build_setup(cfg, device, seed=0)

    def run(n: int) -> float:
        times, _ = timed_loop(setup.step, 0, n, device)
        return batch * seq_len * n / sum(times)

    return run


def api_round(a: argparse.Namespace, precision: str, db: str) -> tuple[float, object]:
    """One api.train run: its record's tokens/s and the record."""
    rec = api.train(model=a.model, batch_size=a.batch_size, seq_len=a.seq_len, precision=precision,
                    optimizer="adamw", lr=a.lr, warmup_steps=a.warmup, steps=a.steps, breakdown_steps=0,
                    device="cpu", db=db)
    assert rec.config["units_per_batch"] == a.batch_size * a.seq_len
    return rec.metrics["throughput"], rec


def measure(a: argparse.Namespace, precision: str, db: str) -> dict:
    """Alternating rounds of A (dlscale) and B (the plain loop); the per-round ratios A/B."""
    shape = (a.model, a.batch_size, a.seq_len, precision, a.lr)
    if a.mode == "loop":
        run_a, run_b = dlscale_loop(*shape), hand_written(*shape)
        run_a(a.warmup)
        run_b(a.warmup)
    ra, rb = [], []
    for r in range(a.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for which in order:
            if a.mode == "loop":
                (ra if which == "A" else rb).append((run_a if which == "A" else run_b)(a.steps))
            elif which == "A":
                ra.append(api_round(a, precision, db)[0])
            else:
                run = hand_written(*shape)
                run(a.warmup)
                rb.append(run(a.steps))
        print(f"  {precision} round {r + 1} ({'/'.join(order)}): dlscale {ra[-1]:.1f}  plain {rb[-1]:.1f} "
              f"tokens/s  ratio {ra[-1] / rb[-1]:.4f}", flush=True)
    ratios = [x / y for x, y in zip(ra, rb)]
    return {"model": a.model, "mode": a.mode, "precision": precision, "batch_size": a.batch_size,
            "seq_len": a.seq_len, "steps": a.steps, "rounds": a.rounds, "dlscale_tokens_s": ra, "hand_tokens_s": rb,
            "median_ratio": statistics.median(ratios), "pooled_ratio": statistics.mean(ra) / statistics.mean(rb),
            "min_ratio": min(ratios), "max_ratio": max(ratios)}


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--mode", choices=("loop", "api"), default="loop")
    ap.add_argument("--model", default="llama_tiny")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=4, help="measured steps per block (per round and side)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-3)


def run(a: argparse.Namespace) -> None:
    ours = ("dlscale.api.train as a user calls it (monitor on, a record written), eager, AdamW" if a.mode == "api" else
            "dlscale's LLM short-test step (build_setup), eager, AdamW, timed by the harness's timed_loop")
    say_arms({"dlscale": ours, "plain": gpu_peers.llama_label("each precision's", False, False)})
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {a.model} batch {a.batch_size} x seq "
          f"{a.seq_len}, AdamW; mode {a.mode}, {a.rounds} alternating rounds x {a.steps} steps (+{a.warmup} warm-up)", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in a.precisions.split(","):
            results.append(measure(a, precision, os.path.join(tmp, "r.db")))
    print(f"{'model':12} {'prec':>5} {'median ratio':>13} {'pooled ratio':>13} {'min':>6} {'max':>6}")
    for r in results:
        print(f"{r['model']:12} {r['precision']:>5} {r['median_ratio']:13.4f} {r['pooled_ratio']:13.4f} "
              f"{r['min_ratio']:6.3f} {r['max_ratio']:6.3f}")
    print(json.dumps({"benchmark": "overhead.py llm-train", "results": results}))
