"""LoadGen offline against the raw batch rate at the same batch: what the LoadGen harness costs.

A is ``dlscale.infer.loadgen.run_scenario`` in the offline scenario (LoadGen's samples/s, MLPerf's
offline figure) with batches of ``--batch-size``. Against it two raw rates of the same session,
samples and forward:

- the raw rate as LoadGen times it (``infer.loadgen_sut.wall_rate``: full batches through the SUT's
  own feed, the same slots in flight and completion thread, on the wall clock from the first launch
  to the last completion), measured just before the LoadGen test (the run records it) and again just
  after it; A over their mean is the offline ratio (target >= 0.95), LoadGen and its completions
  against the same pipeline without them;
- the batch sweep's timing (``infer.probe.time_batch``, the sweep's and LoadGen's probe: each forward timed alone, on device events on a
  GPU, where the host runs ahead) repeated until it has run as long as A's LoadGen test; A over it is
  the record's old comparison, what the device could do.

Rounds alternate A/B and B/A so drift in the machine's load hits both; prints each round's rates and
ratios, the load average, then the medians. Beside them, the process's CPU seconds per sample of A
(over the whole scenario run: its probe's batches and the SUT's, LoadGen's own work included) and of
the sweep's raw rate, and their ratio raw / A: what the harness adds per sample, which time slices
lost to other processes on a busy machine do not blur (as they blur the rates).

``--per-batch-ms MS`` picks the batch size whose forward takes about MS milliseconds (the sweep's
median at batch 1, 2, 4, ..., the closest): an H200 runs ResNet-50 bf16 at batch 64 in about 5 ms, so
``--model tinycnn --per-batch-ms 5`` (and 1) puts this CPU's harness under the same pressure per batch.
``--synthetic-ms MS`` keeps the session's samples, store and gathers but makes its forward a sleep of
MS ms: the device's time per batch with the host free meanwhile, as on a GPU (a CPU forward burns the
host's own cores, so on a busy machine its time is whatever the scheduler gives it), leaving the
harness's own cost per batch as the only difference between the rates. ``--threads N`` sets torch's
threads (1: no OpenMP team to wait on a busy machine).

Run it from a checkout's root: ``PYTHONPATH=src`` picks that checkout's dlscale.

    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_offline.py --model tinycnn --threads 1 --per-batch-ms 5
    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_offline.py --model tinycnn --threads 1 --per-batch-ms 1
    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_offline.py --device cuda --model resnet50 --image-size 224 \
        --precision bf16 --batch-size 64 --rounds 2
    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_offline.py --per-batch 400

``--per-batch REPS`` measures what the SUT itself costs per batch instead, free of the machine's
load: its CPU time on the issuing thread with the forward left out, now and as the SUT it replaced
did it (reproduced in ``per_batch``). ``--completion`` compares LoadGen offline with the CPU's batches
completed on the issuing thread against a completion thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from dlscale.infer.config import InferConfig
from dlscale.infer.loadgen import run_scenario
from dlscale.infer.loadgen_settings import ScenarioSettings
from dlscale.infer.loadgen_sut import wall_rate
from dlscale.infer.probe import time_batch
from dlscale.infer.session import open_session

SAMPLES = ScenarioSettings("offline").samples  # LoadGen's sample library: the raw rates gather from as many


def raw_rate(session, batch: int, seconds: float) -> tuple[float, float]:
    """The batch sweep's rate at ``batch`` (the shared probe's timed forwards, ``infer.probe.time_batch``,
    summed until they last ``seconds``) and the process's CPU seconds per sample over those blocks (their
    warm-up forwards counted)."""
    done, spent, ran = 0, 0.0, 0
    c0 = time.process_time()
    while spent < seconds:
        times = time_batch(session, batch, 2, 20)
        done += session.units(batch) * len(times)
        ran += batch * (len(times) + 2)
        spent += sum(times)
    return done / spent, (time.process_time() - c0) / ran


PROBE_BATCHES = 4  # the offline probe that sizes LoadGen's query: a warm-up batch and 3 timed ones (both trees)


def loadgen_rate(session, batch: int, seconds: float) -> tuple[float, float, float]:
    """LoadGen's offline samples/s, the wall-clock raw rate the run measured just before its test, and
    the process's CPU seconds per sample over the whole scenario run (the samples the SUT ran and the
    probe's and the wall-clock raw rate's, LoadGen's set-up and log reading counted against them)."""
    c0 = time.process_time()
    m = run_scenario(session, ScenarioSettings("offline", max_batch=batch, duration_s=seconds)).metrics
    raw_samples = m["raw_wall_samples_per_s"] * seconds + batch  # its window (about) and its warm-up batch
    ran = m["sut_batches"] * m["sut_mean_batch"] + PROBE_BATCHES * min(batch, 64) + raw_samples
    return float(m["scenario_metric"]), float(m["raw_wall_samples_per_s"]), (time.process_time() - c0) / ran


def per_batch_for(session, target_ms: float) -> tuple[int, float]:
    """(the batch size whose forward's median time is closest to ``target_ms``, that time in ms), over
    batches of 1, 2, 4, ... up to the first past it (at most 1024)."""
    best, b = (1, float("inf")), 1
    while b <= 1024:
        times = sorted(time_batch(session, b, 3, 15))
        ms = times[len(times) // 2] * 1e3
        if abs(ms - target_ms) < abs(best[1] - target_ms):
            best = (b, ms)
        if ms > target_ms:
            break
        b *= 2
    return best


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


def one_round(session, batch: int, seconds: float, loadgen_first: bool) -> dict[str, float]:
    """A: LoadGen (its wall-clock raw rate before it) and the wall-clock raw rate after it; B: the
    sweep's raw rate; A then B, or B then A."""
    def a() -> dict[str, float]:
        lg, before, cpu = loadgen_rate(session, batch, seconds)
        return {"lg": lg, "before": before, "after": wall_rate(session, batch, SAMPLES, seconds), "lg_cpu": cpu}

    def b() -> dict[str, float]:
        raw, cpu = raw_rate(session, batch, seconds)
        return {"raw": raw, "raw_cpu": cpu}

    first, second = (a, b) if loadgen_first else (b, a)
    return {**first(), **second()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tinycnn")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--per-batch-ms", type=float, default=None, metavar="MS",
                    help="instead of --batch-size: the batch whose forward takes about MS ms")
    ap.add_argument("--synthetic-ms", type=float, default=None, metavar="MS",
                    help="the forward is a sleep of MS ms (the host free meanwhile, as on a GPU)")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: torch's)")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of each LoadGen test (and of each raw block)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-batch", type=int, default=0, metavar="REPS",
                    help="instead: the SUT's own CPU time per batch now and before, over REPS batches")
    ap.add_argument("--completion", action="store_true",
                    help="instead: CPU batches completed on the issuing thread against a completion thread")
    a = ap.parse_args()
    os.environ.setdefault("DLSCALE_QUIET", "1")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    cfg = InferConfig(a.model, batch_sizes=str(a.batch_size), image_size=a.image_size, precision=a.precision,
                      device=a.device).resolve(a.device)
    from dlscale.harness.device import run_flags

    with run_flags(a.precision, device):
        session = open_session(cfg, device)
        if a.synthetic_ms:
            session.forward = lambda batch, s=a.synthetic_ms / 1e3: time.sleep(s)
        compare(session, a)


def compare(session, a) -> None:
    import dlscale

    batch = a.batch_size
    if a.per_batch_ms:
        batch, ms = per_batch_for(session, a.per_batch_ms)
        print(f"batch {batch}: its forward takes {ms:.2f} ms (median; asked for about {a.per_batch_ms:g} ms)")
    forward = f"a {a.synthetic_ms:g} ms sleep as the forward of " if a.synthetic_ms else ""
    print(f"{forward}{a.model} {a.image_size} px batch {batch} {a.precision} on {a.device}, torch threads "
          f"{torch.get_num_threads()}, dlscale from {os.path.dirname(dlscale.__file__)}", flush=True)
    if a.per_batch:
        per_batch(session, batch, a.per_batch)
        return
    if a.completion:
        completion(session, batch, a.duration, a.rounds)
        return
    raw_rate(session, batch, 0.2)  # warm: the first forwards allocate
    walls, sweeps, cpus, loads = [], [], [], []
    for r in range(a.rounds):
        t0 = time.monotonic()
        x = one_round(session, batch, a.duration, loadgen_first=r % 2 == 0)
        walls.append(x["lg"] / ((x["before"] + x["after"]) / 2))
        sweeps.append(x["lg"] / x["raw"])
        cpus.append(x["raw_cpu"] / x["lg_cpu"])
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}: LoadGen offline {x['lg']:,.1f}/s; raw as LoadGen times it {x['before']:,.1f} before, "
              f"{x['after']:,.1f} after: ratio {walls[-1]:.3f}; the sweep's raw {x['raw']:,.1f}/s: ratio "
              f"{sweeps[-1]:.3f}; CPU per sample LoadGen {x['lg_cpu'] * 1e6:.1f} us, sweep {x['raw_cpu'] * 1e6:.1f} us "
              f"({time.monotonic() - t0:.0f} s, load {loads[-1]:.1f})", flush=True)

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.3f} (min {min(xs):.3f}, max {max(xs):.3f})"

    print(f"median over {a.rounds} rounds: LoadGen offline / raw as LoadGen times it {med(walls)}; "
          f"LoadGen offline / the sweep's raw {med(sweeps)}; CPU per sample sweep / LoadGen {med(cpus)}; "
          f"load average {min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
