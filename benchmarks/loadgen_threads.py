"""The same forward timed on the main thread and on a fresh thread: why LoadGen's probes use the SUT's thread.

LoadGen issues single-stream, multi-stream and offline queries on the thread that called
``StartTest`` (the main one); dlscale's server SUT runs them on a worker thread. On a CPU shared
with other busy processes the two can differ by far more than noise, so each probe that sizes a
LoadGen run (``infer.loadgen_settings.probe``) times a batch where the SUT will run it.

A is one ``session.run`` of a stacked batch on the main thread, B the same call on a new
``threading.Thread``; each round times ``iters`` calls of each, alternating A/B and B/A so drift in
the machine's load hits both. Prints each round's milliseconds per call and the ratio A/B, then
the median ratio.

    .venv/bin/python benchmarks/loadgen_threads.py --model tinycnn --batch-size 8 --iters 10 --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch

from dlscale.infer.config import InferConfig
from dlscale.infer.session import open_session


def per_call(session, samples: list, iters: int, on_thread: bool) -> float:
    """Seconds per ``session.run`` over ``iters`` calls (after one warm-up), here or on a new thread."""
    out: list[float] = []

    def timed() -> None:
        session.run(samples)
        t0 = time.perf_counter()
        for _ in range(iters):
            session.run(samples)
        out.append((time.perf_counter() - t0) / iters)

    if on_thread:
        t = threading.Thread(target=timed)
        t.start()
        t.join()
    else:
        timed()
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tinycnn")
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    cfg = InferConfig(a.model, batch_sizes=str(a.batch_size), image_size=a.image_size, device="cpu").resolve("cpu")
    session = open_session(cfg, torch.device("cpu"))
    samples = [session.sample(i) for i in range(a.batch_size)]
    print(f"{a.model} batch {a.batch_size}, torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    ratios = []
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        t = {on: per_call(session, samples, a.iters, on) for on in order}
        ratios.append(t[False] / t[True])
        print(f"round {r}: main {t[False] * 1e3:.2f} ms, thread {t[True] * 1e3:.2f} ms, main/thread {ratios[-1]:.2f}")
    print(f"median main/thread {statistics.median(ratios):.2f} over {a.rounds} rounds "
          f"(load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
