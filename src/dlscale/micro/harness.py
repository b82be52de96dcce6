"""The microbenchmark harness: time every case of a microbenchmark, derive its rates, record the run.

For each case: build its inputs, run ``warmup`` uncounted calls, synchronise, then time it.
On CUDA (``micro.gputiming``): ``reps`` windows of K back-to-back calls (K calibrated so that a
window lasts at least 1 ms), or one replay of a CUDA graph of the K calls where the case can be
captured, between CUDA events made once before the loop; hot cache by default, or ``--cache
cold``: the calls rotate through operand copies larger than the L2 together; the row reports the
median time per call, K, the method, the cache, and the SM clock and throttle reasons NVML saw
while the windows ran. On CPU ``time.perf_counter`` brackets each call (CPU kernels are
synchronous) and rates come from the mean time. The best time is kept beside either
(docs/METRICS.md). A case's energy is given only when its timed window spans at least
``energy.MIN_UPDATE_PERIODS`` updates of the counters; else the row says why it has none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dlscale import stats
from dlscale.errors import UsageError
from dlscale.format import fmt_count
from dlscale.harness.runner import Outcome, execute
from dlscale.micro.base import MIN_REPS, Microbench, MicroOptions, case_budget
from dlscale.harness.device import device_name
from dlscale.peaks import Peak, resolve_peak

ROW_UNITS = {"time_us": "us", "time_us_best": "us", "cv": "fraction", "tflops": "TFLOP/s",
             "tflops_best": "TFLOP/s", "gbps": "GB/s", "gbps_best": "GB/s", "pct_peak": "fraction",
             "energy_j": "J", "avg_power_w": "W", "gflops_per_j": "GFLOP/J"}
# the units of the columns GPU rows add
GPU_ROW_UNITS = {"calls_per_window": "calls", "window_us": "us", "operand_copies": "copies", "rotation_bytes": "B",
                 "l2_bytes": "B", "sm_clock_mhz": "MHz", "at_once": "devices"}


def timed_reps(op: Callable[[], Any], warmup: int, reps: int, device: Any, budget_s: float | None = None,
               meter: Any = None, window: Any = None) -> list[float]:
    """Seconds per call for ``reps`` calls of ``op`` after ``warmup`` uncounted ones.

    ``budget_s`` (CPUs): where the last warm-up call says ``reps`` calls would take longer than
    this, fewer are timed, never fewer than ``MIN_REPS`` (nor more than asked). ``window``
    (harness.window.Window) with a target duration: as many calls as the last warm-up call (the probe;
    one more uncounted call without warm-up) says the target needs, never fewer than the budget leaves.
    ``meter`` (an EnergyMeter) is read where the timed calls start and after they end. On CUDA: one
    sample per window of K calls (hot cache, no graph; ``micro.gputiming``).
    """
    if getattr(device, "type", "cpu") == "cuda":
        from dlscale.micro import gputiming

        return gputiming.time_case(lambda: op, device, warmup, reps, meter=meter, window=window).per_call_s
    t_call = None
    for _ in range(max(warmup, 1 if window is not None else 0)):
        t0 = time.perf_counter()
        op()
        t_call = time.perf_counter() - t0
    if budget_s is not None and t_call:
        reps = min(reps, max(MIN_REPS, int(budget_s / t_call)))
    if window is not None:
        reps = window.size(reps, t_call or 0.0)
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


def rates(times: list[float], flops: float | None, nbytes: float | None, peak: float | None,
          center: str = "mean") -> dict[str, Any]:
    """One row's timing figures: the ``center`` time (mean on CPUs, median on GPUs) and the best,
    CV, TFLOP/s and GB/s (1e9) from each, fraction of peak."""
    mid_t = stats.percentile(times, 50) if center == "median" else stats.mean(times)
    best_t = min(times)
    row: dict[str, Any] = {"time_us": mid_t * 1e6, "time_us_best": best_t * 1e6, "cv": stats.cv(times)}
    if flops is not None:
        row["tflops"] = flops / mid_t / 1e12
        row["tflops_best"] = flops / best_t / 1e12
        row["pct_peak"] = flops / mid_t / peak if peak else None
    if nbytes is not None:
        row["gbps"] = nbytes / mid_t / 1e9
        row["gbps_best"] = nbytes / best_t / 1e9
    return row


def device_peak(device: Any, precision: str, system: dict[str, Any], cpu_ghz: float | None) -> tuple[Peak | None, str]:
    """The device's dense peak for a precision (datasheet on GPUs, ISA x clock on CPUs) or why none."""
    r = resolve_peak(device, precision, system, cpu_ghz=cpu_ghz, measure=False)
    return r.peak, r.source


def row_energy(reading: dict[str, Any], flops: float | None, calls: int, update_s: float = 0.0) -> dict[str, Any]:
    """A case's energy over its timed calls: joules, average power and GFLOP per joule (``flops · calls / E``).

    None where the window is shorter than ``energy.MIN_UPDATE_PERIODS`` counter updates (``update_s``
    each) or the counters did not move: then ``energy_reason`` says why, where a counter exists."""
    from dlscale.harness import energy_meter as energy

    if reading.get("reason"):
        return {}  # no counter here: the run's raw["energy"] says why
    m, _, raw = energy.figures(energy.short_window(reading, update_s), calls, "calls")
    if not m:
        return {"energy_reason": raw["energy"]["reason"]}
    row = {"energy_j": m["energy_j"], "avg_power_w": m["avg_power_w"]}
    if flops is not None:
        row["gflops_per_j"] = flops * calls / m["energy_j"] / 1e9
    return row


def measure(bench: Microbench, opts: MicroOptions, device: Any, system: dict[str, Any], record: Any) -> Outcome:
    """The body of a microbenchmark run: plan, time every case, rows, summary, warnings."""
    from dlscale.harness.device import flags_kept
    from dlscale.harness.energy_meter import EnergyMeter

    with flags_kept(), EnergyMeter(device) as meter:  # each case sets its precision's flags; restored after the run
        return _measure(bench, opts, device, system, record, meter)


def _measure(bench: Microbench, opts: MicroOptions, device: Any, system: dict[str, Any], record: Any,
             meter: Any) -> Outcome:
    import torch

    from dlscale.harness.device import set_matmul_precision
    from dlscale.micro.node import Node, schedule

    torch.manual_seed(opts.seed)
    plan = bench.plan(opts, device)
    clocks: dict[Any, Any] = {}  # one NVML reader per GPU the cases run on (every_device)
    peaks: dict[tuple[Any, str], tuple[Peak | None, str]] = {}
    rows: list[dict[str, Any]] = []
    record.raw["rows"] = rows  # kept on the record if a case fails part-way
    times_all: list[list[float]] = []
    flags: dict[str, Any] = {}  # each precision's TF32 and cuDNN flags, for the run's config
    node = Node(plan.cases)  # the cases run on every device at once, and the node's energy over them
    try:
        for group in schedule(plan.cases):
            for case in group:
                prec = case.precision or "fp32"
                where = case.device or device
                if case.flops is not None and (where, prec) not in peaks:
                    peaks[(where, prec)] = device_peak(where, prec, system, opts.cpu_ghz)
                _clocks_of(where, clocks)
            prec = group[0].precision or "fp32"  # every device's case of a group: one precision, global flags
            flags[prec] = set_matmul_precision(prec, group[0].device or device)
            if node.runs(group):
                timed = node.time(group, lambda c, gate: _time_case(c, opts, c.device, gate, clocks))
                energy = [row_energy(r, c.flops, n, node.meter.update_s)
                          for r, c, (_, _, n) in zip(node.readings(group), group, timed)]
            else:
                where = group[0].device or device
                metered = meter if where == device else None
                timed = [_time_case(group[0], opts, where, metered, clocks)]
                energy = [row_energy(meter.take(), group[0].flops, timed[0][2], meter.update_s) if metered else {}]
            for case, (times, gpu, _), e in zip(group, timed, energy):
                peak = peaks.get((case.device or device, case.precision or "fp32"), (None, ""))[0]
                rows.append({**case.labels, **rates(times, case.flops, case.bytes, peak.flops if peak else None,
                                                    "median" if gpu else "mean"),
                             "reps": len(times), "flops": case.flops, "bytes": case.bytes, **gpu, **e,
                             **({"at_once": len(group)} if node.runs(group) else {})})
                times_all.append(times)
    finally:
        for c in clocks.values():
            c.close()
        node.close()
    metrics, units = bench.summarize(rows)
    metrics["peak_sources"] = {p: src for (_, p), (_, src) in peaks.items()}
    metrics["cases"] = len(rows)
    units["cases"] = "cases"
    n_metrics, n_units, n_raw = node.figures()
    metrics.update(n_metrics)
    units.update(n_units)
    energy = {"source": meter.found.source if not meter.reason else None,
              "domains": sorted({c.domain for c in meter.counters}), "reason": meter.reason}
    row_units = {**ROW_UNITS, **{k: u for k, u in GPU_ROW_UNITS.items() if any(k in r for r in rows)}}
    return Outcome(metrics=metrics, units={**units, **{f"row.{k}": v for k, v in row_units.items()}},
                   raw={"rows": rows, "times_s": times_all, "energy": energy, **n_raw},
                   warnings=_warnings(plan, rows), config={"backend_flags": flags})


def _clocks_of(where: Any, clocks: dict[Any, Any]) -> None:
    """An NVML clock reader for a GPU the cases run on, made here (before any device's thread starts)."""
    if getattr(where, "type", "cpu") == "cuda" and where not in clocks:
        from dlscale.monitor.clocks import GpuClocks

        clocks[where] = GpuClocks(where.index or 0)


def _time_case(case: Any, opts: MicroOptions, where: Any, meter: Any, clocks: dict[Any, Any]
               ) -> tuple[list[float], dict[str, Any], int]:
    """(seconds per call, one per sample; the GPU columns of the row, none on CPUs; calls timed).
    ``meter``: an EnergyMeter, or a ``concurrent.Gate`` where the case runs on every device at once."""
    from dlscale.harness.window import MOST, Window
    from dlscale.micro import gputiming

    gpu = getattr(where, "type", "cpu") == "cuda"
    window = Window(opts.min_duration_s, most=gputiming.MAX_WINDOWS if gpu else MOST) \
        if opts.min_duration_s is not None else None
    if gpu:
        w = gputiming.time_case(case.build, where, opts.warmup, opts.reps, opts.cache, case.capture, meter,
                                clocks.get(where), window=window)
        return w.per_call_s, w.row(), w.total_calls
    op = case.build()
    times = timed_reps(op, opts.warmup, opts.reps, where, case_budget(opts, where), meter, window)
    return times, ({"sizing": window.last} if window is not None else {}), len(times)


def _warnings(plan: Any, rows: list[dict[str, Any]]) -> list[str]:
    from dlscale.monitor.health import ALARMING

    warnings = list(plan.notes)
    noisy = [r for r in rows if r["cv"] > 0.1]
    if noisy:
        warnings.append(f"{len(noisy)} of {fmt_count(len(rows), 'case')} {'varies' if len(noisy) == 1 else 'vary'} "
                        "by more than 10% (CV) between reps: "
                        "use more --reps or a quieter machine")
    slowed = sorted({x for r in rows for x in r.get("throttle_reasons") or [] if x in ALARMING})
    if slowed:
        n = sum(1 for r in rows if set(r.get("throttle_reasons") or []) & ALARMING)
        warnings.append(f"{n} of {fmt_count(len(rows), 'case')} ran while the GPU slowed its clocks "
                        f"({', '.join(slowed)}): their figures are below a healthy GPU's")
    return warnings


def run_recorded(bench: Microbench, opts: MicroOptions, store: Any, system: dict[str, Any] | None = None,
                 price: Any = None) -> Any:
    """Select the device, check the precisions, run ``bench`` as a recorded ``micro`` run."""
    from dlscale.harness import device as dev
    from dlscale.system import collect_cached

    device = dev.select_device(opts.device)
    for p in opts.precisions:
        dev.check_precision(p, device)
    check_cache(opts, device)
    system = system or collect_cached()
    config = {**_opts_dict(opts), "device": device.type, "device_name": device_name(device)}
    return execute(kind="micro", workload=bench.name, config=config, tag=opts.tag, store=store, system=system,
                   price=price, body=lambda rec: measure(bench, opts, device, system, rec))


def check_cache(opts: MicroOptions, device: Any) -> None:
    """``--cache cold`` needs a GPU: its operand copies are sized by the GPU's L2 and its device memory."""
    if opts.cache == "cold" and getattr(device, "type", "cpu") != "cuda":
        raise UsageError("--cache cold rotates operand copies past a GPU's L2 cache; it needs a CUDA device "
                         "(--device cuda)")


def _opts_dict(opts: MicroOptions) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(opts)
    d["precisions"] = list(opts.precisions)
    return d
