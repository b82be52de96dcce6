"""LoadGen offline against the raw batch rate at the same batch: what the LoadGen harness costs.

A is ``dlscale.infer.loadgen.run_scenario`` in the offline scenario (LoadGen's samples/s, MLPerf's
offline figure) with batches of ``--batch-size``; B is the batch sweep's timing at the same batch
size (``infer.run.time_batch``: the same session, samples and forward) repeated until it has run
as long as A's LoadGen test, its rate = samples / the sum of the timed forwards. Both run on the
main thread, as LoadGen issues offline queries there (benchmarks/loadgen_threads.py: the thread
matters on a busy CPU). Rounds alternate A/B and B/A so drift in the machine's load hits both;
prints each round's rates and ratio A/B, the load average, then the median ratio. Target: >= 0.9.
Beside it, the process's CPU seconds per sample of each (B's over its forwards and their warm-ups,
A's over the whole scenario run: its probe's batches and the SUT's, LoadGen's own work included) and
their ratio B/A: what the harness adds per sample, which time slices
lost to other processes on a busy machine do not blur (as they blur the rates).

Run it from a checkout's root: ``PYTHONPATH=src`` picks that checkout's dlscale, so the same script
measures an older tree (``PYTHONPATH=/path/to/old/src``) side by side.

    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_offline.py --model tinycnn --image-size 32 --batch-size 64
    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_offline.py --model resnet18 --image-size 64 --batch-size 64
    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_offline.py --per-batch 400

``--per-batch REPS`` (this tree only) measures what the SUT itself costs per batch instead, free of
the machine's load: its CPU time on the issuing thread with the forward left out, now and as the
SUT it replaced did it (reproduced in ``per_batch``). ``--completion`` (this tree only) compares
LoadGen offline with the CPU's batches completed on the issuing thread against a completion thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from dlscale.infer.config import InferConfig
try:  # where the tree keeps it
    from dlscale.infer.loadgen_settings import ScenarioSettings
except ImportError:
    from dlscale.infer.loadgen import ScenarioSettings
from dlscale.infer.loadgen import run_scenario
from dlscale.infer.run import time_batch
from dlscale.infer.session import open_session


def raw_rate(session, batch: int, seconds: float) -> tuple[float, float]:
    """The batch sweep's rate at ``batch`` (timed forwards summed until they last ``seconds``) and the
    process's CPU seconds per sample over those blocks (their warm-up forwards counted)."""
    done, spent, ran = 0, 0.0, 0
    c0 = time.process_time()
    while spent < seconds:
        times = time_batch(session, batch, 2, 20)
        done += session.units(batch) * len(times)
        ran += batch * (len(times) + 2)
        spent += sum(times)
    return done / spent, (time.process_time() - c0) / ran


PROBE_BATCHES = 4  # the offline probe that sizes LoadGen's query: a warm-up batch and 3 timed ones (both trees)


def loadgen_rate(session, batch: int, seconds: float) -> tuple[float, float]:
    """LoadGen's offline samples/s, and the process's CPU seconds per sample over the whole scenario
    run: the samples the SUT ran and the probe's, LoadGen's set-up and log reading counted against them."""
    c0 = time.process_time()
    m = run_scenario(session, ScenarioSettings("offline", max_batch=batch, duration_s=seconds)).metrics
    ran = m["sut_batches"] * m["sut_mean_batch"] + PROBE_BATCHES * min(batch, 64)
    return float(m["scenario_metric"]), (time.process_time() - c0) / ran


def per_batch(session, batch: int, reps: int) -> None:
    """The SUT's own CPU time per batch on the issuing thread, the forward left out (a no-op), as the
    10th percentile of ``reps`` batches of that thread's CPU time (time slices lost to other processes
    are not in a thread's CPU time): now, ``infer.feed``'s launch and finish of a gathered batch plus
    LoadGen's responses; before (the SUT this replaced, reproduced), the lookup of each sample in a
    dict of host samples, the stack into a new batch with its layout conversion, and the responses
    built from LoadGen's QuerySample objects."""
    import random

    import mlperf_loadgen as lg

    from dlscale.infer.feed import Feed, SampleStore

    ids, idx = list(range(batch)), [random.randrange(64) for _ in range(batch)]
    queries = [lg.QuerySample(i, x) for i, x in zip(ids, idx)]
    held = {i: session.sample(i) for i in range(64)}
    store = SampleStore(session, 64)
    store.load(range(64))
    feed = Feed(session, store, batch)
    forward, session.forward = session.forward, (lambda b: None)

    def p10(f, n: int = reps) -> float:
        f()
        spent = []
        for _ in range(n):
            t0 = time.thread_time()
            f()
            spent.append(time.thread_time() - t0)
        return sorted(spent)[n // 10]

    before = p10(lambda: (session.collate([held[q.index] for q in queries]),
                          [lg.QuerySampleResponse(q.id, 0, 0) for q in queries]))
    now = p10(lambda: (feed.finish(feed.launch(idx)), [lg.QuerySampleResponse(i, 0, 0) for i in ids]))
    session.forward = forward
    x = session.collate([held[i] for i in idx])
    fwd = p10(lambda: forward(x), 20)
    print(f"SUT CPU per batch of {batch} on the issuing thread (p10 of {reps}): before {before * 1e6:.0f} us, "
          f"now {now * 1e6:.0f} us ({before / now:.1f}x less); the forward itself {fwd * 1e6:.0f} us "
          f"(issuing thread's CPU; load average {os.getloadavg()[0]:.1f})")


def completion(session, batch: int, seconds: float, rounds: int) -> None:
    """LoadGen offline with the CPU's batches completed on the issuing thread against the completion
    thread (dlscale's choice on a CPU for offline and server), alternating; prints each round's ratio
    inline / thread and the median."""
    from dlscale.infer import loadgen_sut

    chosen = loadgen_sut.completes_inline
    ratios = []
    for r in range(rounds):
        got = {}
        for on_thread in ((False, True) if r % 2 == 0 else (True, False)):
            loadgen_sut.completes_inline = lambda session, scenario, inline=not on_thread: inline
            try:
                got[on_thread] = loadgen_rate(session, batch, seconds)[0]
            finally:
                loadgen_sut.completes_inline = chosen
        ratios.append(got[False] / got[True])
        print(f"round {r + 1}: inline {got[False]:,.1f}/s, completion thread {got[True]:,.1f}/s, "
              f"inline / thread {ratios[-1]:.3f} (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"median inline / completion thread over {rounds} rounds: {statistics.median(ratios):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tinycnn")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of each LoadGen test (and of each raw block)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-batch", type=int, default=0, metavar="REPS",
                    help="instead: the SUT's own CPU time per batch now and before, over REPS batches")
    ap.add_argument("--completion", action="store_true",
                    help="instead: CPU batches completed on the issuing thread against a completion thread")
    a = ap.parse_args()
    os.environ.setdefault("DLSCALE_QUIET", "1")
    cfg = InferConfig(a.model, batch_sizes=str(a.batch_size), image_size=a.image_size, precision=a.precision,
                      device="cpu").resolve("cpu")
    session = open_session(cfg, torch.device("cpu"))
    import dlscale

    print(f"{a.model} {a.image_size} px batch {a.batch_size} {a.precision}, torch threads {torch.get_num_threads()}, "
          f"dlscale from {os.path.dirname(dlscale.__file__)}", flush=True)
    if a.per_batch:
        per_batch(session, a.batch_size, a.per_batch)
        return
    if a.completion:
        completion(session, a.batch_size, a.duration, a.rounds)
        return
    raw_rate(session, a.batch_size, 0.2)  # warm: the first forwards allocate
    ratios, cpu_ratios, loads = [], [], []
    for r in range(a.rounds):
        t0 = time.monotonic()
        if r % 2 == 0:
            (lg_r, lg_c), (raw_r, raw_c) = loadgen_rate(session, a.batch_size, a.duration), \
                raw_rate(session, a.batch_size, a.duration)
        else:
            (raw_r, raw_c), (lg_r, lg_c) = raw_rate(session, a.batch_size, a.duration), \
                loadgen_rate(session, a.batch_size, a.duration)
        ratios.append(lg_r / raw_r)
        cpu_ratios.append(raw_c / lg_c)
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}: LoadGen offline {lg_r:,.1f}/s, raw {raw_r:,.1f}/s, ratio {ratios[-1]:.3f}; CPU per "
              f"sample LoadGen {lg_c * 1e6:.1f} us, raw {raw_c * 1e6:.1f} us, raw/LoadGen {cpu_ratios[-1]:.3f} "
              f"({time.monotonic() - t0:.0f} s, load {loads[-1]:.1f})", flush=True)
    print(f"median LoadGen offline / raw over {a.rounds} rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); CPU per sample raw / LoadGen: "
          f"{statistics.median(cpu_ratios):.3f} (min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f}); "
          f"load average {min(loads):.1f}-{max(loads):.1f}")

if __name__ == "__main__":
    main()
