"""The microbenchmark harness: time every case of a microbenchmark, derive its rates, record the run.

For each case: build its inputs, run ``warmup`` uncounted calls, synchronise, then time ``reps``
calls one by one. On CUDA each call sits between two CUDA events and the L2 cache is flushed
(a buffer twice its size is overwritten) before every call, outside the timed interval, so no
call finds its operands left in cache by the one before; the device is synchronised once after
the window to read the events. On CPU ``time.perf_counter`` brackets each call (CPU kernels are
synchronous). Rates come from the mean time; the best time is kept beside it (docs/METRICS.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dlscale import stats
from dlscale.format import fmt_count
from dlscale.harness.runner import Outcome, execute
from dlscale.micro.base import MIN_REPS, Microbench, MicroOptions, case_budget
from dlscale.harness.device import device_name
from dlscale.peaks import Peak, resolve_peak

ROW_UNITS = {"time_us": "us", "time_us_best": "us", "cv": "fraction", "tflops": "TFLOP/s",
             "tflops_best": "TFLOP/s", "gbps": "GB/s", "gbps_best": "GB/s", "pct_peak": "fraction",
             "energy_j": "J", "avg_power_w": "W", "gflops_per_j": "GFLOP/J"}


def timed_reps(op: Callable[[], Any], warmup: int, reps: int, device: Any,
               flush: Callable[[], None] | None = None, budget_s: float | None = None, meter: Any = None) -> list[float]:
    """Seconds per call for ``reps`` calls of ``op`` after ``warmup`` uncounted ones.

    ``budget_s`` (CPUs): where the last warm-up call says ``reps`` calls would take longer than
    this, fewer are timed, never fewer than ``MIN_REPS`` (nor more than asked). ``meter`` (an
    EnergyMeter) is read where the timed calls start and after they end.
    """
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        with torch.cuda.device(device):
            return _cuda_reps(op, warmup, reps, device, flush, meter)
    t_call = None
    for _ in range(warmup):
        t0 = time.perf_counter()
        op()
        t_call = time.perf_counter() - t0
    if budget_s is not None and t_call:
        reps = min(reps, max(MIN_REPS, int(budget_s / t_call)))
    times = []
    if meter is not None:
        meter.begin()
    for _ in range(reps):
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    if meter is not None:
        meter.end()
    return times


def _cuda_reps(op: Callable[[], Any], warmup: int, reps: int, device: Any,
               flush: Callable[[], None] | None, meter: Any = None) -> list[float]:
    """Each call between two CUDA events on the current stream, the L2 flushed before it."""
    import torch

    for _ in range(warmup):
        op()
    torch.cuda.synchronize(device)
    if meter is not None:
        meter.begin()
    pairs = []
    for _ in range(reps):
        if flush is not None:
            flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        op()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(device)
    if meter is not None:
        meter.end()
    return [s.elapsed_time(e) / 1e3 for s, e in pairs]


def l2_flusher(device: Any) -> Callable[[], None] | None:
    """A callable that evicts the GPU's L2 (writes twice its size); None on CPUs."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
    buf = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return buf.zero_


def rates(times: list[float], flops: float | None, nbytes: float | None, peak: float | None) -> dict[str, Any]:
    """One row's timing figures: mean/best time, CV, TFLOP/s and GB/s (1e9), fraction of peak."""
    mean_t, best_t = stats.mean(times), min(times)
    row: dict[str, Any] = {"time_us": mean_t * 1e6, "time_us_best": best_t * 1e6, "cv": stats.cv(times)}
    if flops is not None:
        row["tflops"] = flops / mean_t / 1e12
        row["tflops_best"] = flops / best_t / 1e12
        row["pct_peak"] = flops / mean_t / peak if peak else None
    if nbytes is not None:
        row["gbps"] = nbytes / mean_t / 1e9
        row["gbps_best"] = nbytes / best_t / 1e9
    return row


def device_peak(device: Any, precision: str, system: dict[str, Any], cpu_ghz: float | None) -> tuple[Peak | None, str]:
    """The device's dense peak for a precision (datasheet on GPUs, ISA x clock on CPUs) or why none."""
    r = resolve_peak(device, precision, system, cpu_ghz=cpu_ghz, measure=False)
    return r.peak, r.source


def row_energy(reading: dict[str, Any], flops: float | None, reps: int) -> dict[str, Any]:
    """A case's energy over its timed calls: joules, average power and GFLOP per joule (``flops · reps / E``)."""
    from dlscale.harness import energy

    m, _, _ = energy.figures(reading, reps, "calls")
    if not m:
        return {}
    row = {"energy_j": m["energy_j"], "avg_power_w": m["avg_power_w"]}
    if flops is not None:
        row["gflops_per_j"] = flops * reps / m["energy_j"] / 1e9
    return row


def measure(bench: Microbench, opts: MicroOptions, device: Any, system: dict[str, Any], record: Any) -> Outcome:
    """The body of a microbenchmark run: plan, time every case, rows, summary, warnings."""
    from dlscale.harness.energy import EnergyMeter

    with EnergyMeter(device) as meter:
        return _measure(bench, opts, device, system, record, meter)


def _measure(bench: Microbench, opts: MicroOptions, device: Any, system: dict[str, Any], record: Any,
             meter: Any) -> Outcome:
    import torch

    from dlscale.harness.device import set_matmul_precision

    torch.manual_seed(opts.seed)
    plan = bench.plan(opts, device)
    flushers = {device: l2_flusher(device)}  # one per GPU the cases run on (every_device)
    peaks: dict[tuple[Any, str], tuple[Peak | None, str]] = {}
    rows: list[dict[str, Any]] = []
    record.raw["rows"] = rows  # kept on the record if a case fails part-way
    times_all: list[list[float]] = []
    for case in plan.cases:
        prec = case.precision or "fp32"
        where = case.device or device
        if case.flops is not None and (where, prec) not in peaks:
            peaks[(where, prec)] = device_peak(where, prec, system, opts.cpu_ghz)
        set_matmul_precision(prec, where)
        if where not in flushers:  # every case on a GPU finds its L2 flushed, whichever GPU it runs on
            flushers[where] = l2_flusher(where)
        op = case.build()
        times = timed_reps(op, opts.warmup, opts.reps, where, flushers.get(where), case_budget(opts, where),
                           meter if where == device else None)
        del op
        peak = peaks.get((where, prec), (None, ""))[0]
        rows.append({**case.labels, **rates(times, case.flops, case.bytes, peak.flops if peak else None),
                     "reps": len(times), "flops": case.flops, "bytes": case.bytes,
                     **row_energy(meter.take(), case.flops, len(times))})
        times_all.append(times)
    metrics, units = bench.summarize(rows)
    peak_sources = {p: src for (_, p), (_, src) in peaks.items()}
    metrics["peak_sources"] = peak_sources
    metrics["cases"] = len(rows)
    units["cases"] = "cases"
    warnings = list(plan.notes)
    noisy = [r for r in rows if r["cv"] > 0.1]
    if noisy:
        warnings.append(f"{len(noisy)} of {fmt_count(len(rows), 'case')} {'varies' if len(noisy) == 1 else 'vary'} "
                        "by more than 10% (CV) between reps: "
                        "use more --reps or a quieter machine")
    energy = {"source": meter.found.source if not meter.reason else None,
              "domains": sorted({c.domain for c in meter.counters}), "reason": meter.reason}
    return Outcome(metrics=metrics, units={**units, **{f"row.{k}": v for k, v in ROW_UNITS.items()}},
                   raw={"rows": rows, "times_s": times_all, "energy": energy}, warnings=warnings)


def run_recorded(bench: Microbench, opts: MicroOptions, store: Any, system: dict[str, Any] | None = None,
                 price: Any = None) -> Any:
    """Select the device, check the precisions, run ``bench`` as a recorded ``micro`` run."""
    from dlscale.harness import device as dev
    from dlscale.system import collect_cached

    device = dev.select_device(opts.device)
    for p in opts.precisions:
        dev.check_precision(p, device)
    system = system or collect_cached()
    config = {**_opts_dict(opts), "device": device.type, "device_name": device_name(device)}
    return execute(kind="micro", workload=bench.name, config=config, tag=opts.tag, store=store, system=system,
                   price=price, body=lambda rec: measure(bench, opts, device, system, rec))


def _opts_dict(opts: MicroOptions) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(opts)
    d["precisions"] = list(opts.precisions)
    return d
