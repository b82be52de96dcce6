"""MLPerf LoadGen scenarios (single-stream, multi-stream, server, offline) over an inference session.

LoadGen (``mlperf_loadgen``, the MLCommons library) owns the traffic: it decides when queries
are issued and measures each one from issue to completion; dlscale supplies the system under
test and the query sample library (``loadgen_sut``: the samples held once in one preallocated
tensor per input, on the device or in pinned host memory, batches gathered there by index, copied
on a side stream, completed from a thread that waits on each batch's event). The figures come
from LoadGen's own logs (``loadgen_log``), and each scenario's headline is the one MLPerf reports.

Batching in the SUT: single-stream runs its one sample; multi-stream runs the query's samples
(LoadGen's 8) in batches of up to ``max_batch``; offline runs the one big query in batches of
``max_batch``; server queues each query and a batcher thread launches the oldest waiting query
plus whatever arrives within the batch-fill timeout of it (``batch_timeout_s``; default 1/10 of
the latency bound), up to ``max_batch``, with four batches in flight on a GPU. On a GPU each batch
runs at one of the scenario's shapes, warmed before the window (``loadgen_sut.shapes_for``).

Offline also records the raw rate as LoadGen times it (``loadgen_sut.wall_rate``: full batches through
the same feed, slots and completion thread, on the wall clock, just before each LoadGen test) and
LoadGen's rate over it, ``raw_wall_ratio``: what LoadGen and the SUT's completions cost, beside the
sweep's device-timed ``throughput`` at the same batch.

Short runs (the default: 2 s, and the 64 or 662 queries LoadGen's early-stopping estimate needs)
cannot always satisfy LoadGen's early-stopping rule, so their ``valid`` is often False for that
reason alone; every reason LoadGen gives goes into ``warnings`` and the constraint flags
(``latency_bound_met`` ...) are reported on their own. A server run is bounded: LoadGen's max
query count (``server_query_cap``) stops one far above the SUT's probed throughput, which LoadGen
would otherwise wait on until every scheduled query completed. ``runs`` > 1 repeats the test and
keeps the median run, with every run's headline beside it (the scenario's own noise).
"""

from __future__ import annotations

import math
import re
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from dlscale.errors import RunFailure
from dlscale.format import fmt_num, fmt_seconds
from dlscale.infer.loadgen_log import parse_summary, read_logs
from dlscale.infer.loadgen_settings import (DEFAULT_LATENCY_BOUND_S, FIND_PEAK_START, MULTI_STREAM_SAMPLES,
                                            SERVER_QUERY_CAP, ScenarioSettings, batch_timeout, check_settings,
                                            latency_bound_source, probe_capacity, settings_for)

DETAIL_HEAD, DETAIL_TAIL = 20_000, 80_000  # characters of mlperf_log_detail.txt kept (start and end)
BISECT_REL_TOL, BISECT_MAX_RUNS = 0.05, 10
RAW_WALL_MAX_S = 2.0  # offline: the wall-clock raw rate's window, at most (LoadGen's short run: 2 s)
_LOCK = threading.Lock()  # LoadGen is one process-wide test at a time


@dataclass
class ScenarioResult:
    """LoadGen's verdict and figures for one scenario run (latencies in seconds)."""

    metrics: dict[str, Any]
    units: dict[str, str]
    valid: bool
    summary: str
    detail: str
    warnings: list[str] = field(default_factory=list)


@contextmanager
def _log_dir(log_dir: str | None) -> Iterator[Path]:
    """``log_dir`` (created, kept) or a temporary directory removed afterwards."""
    if log_dir is not None:
        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="dlscale-loadgen-") as tmp:
        yield Path(tmp)


# --- running --------------------------------------------------------------------------------

@dataclass
class _Run:
    """What one LoadGen test left behind."""

    summary: str
    detail: str
    batches: int
    ran: int
    energy: dict[str, Any] | None = None  # harness.energy_meter reading over LoadGen's test, samples loaded
    store_bytes: int = 0
    batch_timeout_s: float | None = None  # server: the batch-fill timeout used
    slots: int = 0  # batches the SUT had in flight at most
    shapes: tuple[int, ...] | None = None  # the batch shapes it ran (a GPU's), None: each batch at its size
    raw_wall: float | None = None  # offline: loadgen_sut.wall_rate just before this test


def _start_test(lg: Any, session: Any, s: ScenarioSettings, ts: Any, outdir: Path) -> _Run:
    """One LoadGen test of ``session`` under ``ts``; logs in ``outdir``; the session's error re-raised.
    The energy window is LoadGen's test with its samples loaded (the QSL opens and closes it)."""
    from dlscale.harness.energy_meter import EnergyMeter
    from dlscale.infer.loadgen_sut import Qsl, Sut, completes_inline, shapes_for, wall_rate

    raw_wall = None
    if s.scenario == "offline":  # the raw rate as LoadGen times it, beside this test (loadgen_sut.wall_rate)
        raw_wall = wall_rate(session, s.max_batch, s.samples, min(ts.min_duration_ms / 1000, RAW_WALL_MAX_S))
    meter = EnergyMeter(getattr(session, "device", None) if getattr(session, "runtime", "torch") == "torch" else None)
    timeout = batch_timeout(s, ts)[0] if s.scenario == "server" else None
    shapes = shapes_for(session, s.scenario, s.max_batch)
    qsl = Qsl(lg, session, s.samples, s.max_batch, completes_inline(session, s.scenario), meter, shapes)
    sut = Sut(qsl, s.scenario, s.max_batch, timeout)
    log = lg.LogSettings()
    out = lg.LogOutputSettings()
    out.outdir, out.copy_summary_to_stdout, out.copy_detail_to_stdout = str(outdir), False, False
    log.log_output = out
    log.enable_trace = False  # LoadGen's per-sample trace: not read, and work on the measured path
    sut_handle = lg.ConstructFastSUT(sut.issue, sut.flush)
    qsl_handle = lg.ConstructQSL(s.samples, s.samples, qsl.load, qsl.unload)
    sut.start()
    try:
        lg.StartTestWithLogSettings(sut_handle, qsl_handle, ts, log)
    finally:
        sut.stop()
        qsl.close()
        meter.close()
        lg.DestroyQSL(qsl_handle)
        lg.DestroySUT(sut_handle)
    if qsl.error is not None:
        raise RunFailure(f"--scenario {s.scenario}: the session failed during the LoadGen run: "
                         f"{type(qsl.error).__name__}: {qsl.error}") from qsl.error
    summary = (outdir / "mlperf_log_summary.txt").read_text()
    detail = (outdir / "mlperf_log_detail.txt").read_text()
    return _Run(summary, detail, qsl.batches, qsl.ran, meter.reading(), qsl.store_bytes, timeout, qsl.slots, shapes,
                raw_wall)


def run_scenario(session: Any, settings: ScenarioSettings) -> ScenarioResult:
    """Run one LoadGen scenario on ``session`` (``settings.runs`` times) and return LoadGen's figures
    and verdict: of several runs, the median one's, with every run's headline."""
    check_settings(settings)
    import mlperf_loadgen as lg

    with _LOCK, _log_dir(settings.log_dir) as outdir:
        capacity = probe_capacity(session, settings) if settings.scenario == "server" else None
        if settings.find_peak:
            return _find_peak(lg, session, settings, outdir, capacity)
        ts = settings_for(lg, session, settings, capacity=capacity)
        results = [_result(lg, session, settings, _start_test(lg, session, settings, ts, outdir), capacity, ts)
                   for _ in range(settings.runs)]
    return median_run(results) if len(results) > 1 else results[0]


def median_run(results: list[ScenarioResult]) -> ScenarioResult:
    """The median run by its headline (for an even count the worse middle one; a run without a
    headline counts as the worst), with ``scenario_metric_runs``: every run's headline in run order."""
    name = str(results[0].metrics.get("scenario_metric_name") or "")
    lower_better = "latency" in name
    worst = math.inf if lower_better else -math.inf

    def key(r: ScenarioResult) -> float:
        v = r.metrics.get("scenario_metric")
        return float(v) if isinstance(v, (int, float)) else worst

    ranked = sorted(results, key=key, reverse=lower_better)
    mid = ranked[(len(ranked) - 1) // 2]
    mid.metrics["scenario_metric_runs"] = [r.metrics.get("scenario_metric") for r in results]
    mid.units["scenario_metric_runs"] = mid.units.get("scenario_metric", "")
    mid.metrics["scenario_runs"] = len(results)
    mid.units["scenario_runs"] = "runs"
    bad = sum(not r.valid for r in results)
    if bad and mid.valid:
        mid.warnings.append(f"{bad} of the {len(results)} LoadGen runs were INVALID (the median run is VALID)")
    return mid


def _result(lg: Any, session: Any, s: ScenarioSettings, run: _Run, capacity: float | None = None,
            ts: Any = None) -> ScenarioResult:
    """The ScenarioResult of one run: LoadGen's logs read, SUT batching counts, LoadGen's reasons as warnings."""
    per_sample = session.units(1) if hasattr(session, "units") else 1
    unit = getattr(session, "sample_unit", "samples") if per_sample == 1 else "samples"
    metrics, units, warnings = read_logs(run.summary, run.detail, s.scenario, unit)
    if per_sample != 1:  # token families: a LoadGen sample is one sequence of per_sample tokens
        metrics["units_per_sample"], units["units_per_sample"] = per_sample, session.sample_unit
    metrics.update(max_batch=s.max_batch, sut_batches=run.batches,
                   sut_mean_batch=round(run.ran / run.batches, 3) if run.batches else None,
                   samples_on=getattr(session, "samples_on", None), sample_store_bytes=run.store_bytes,
                   sut_slots=run.slots, sut_shapes=list(run.shapes) if run.shapes else None)
    units.update(max_batch="samples", sut_batches="batches", sut_mean_batch="samples", sample_store_bytes="bytes",
                 sut_slots="batches", sut_shapes="samples")
    if run.raw_wall is not None:
        _raw_figures(metrics, units, run.raw_wall)
    if s.scenario == "server" and ts is not None:
        metrics["batch_timeout_s"], metrics["batch_timeout_source"] = batch_timeout(s, ts)
        units["batch_timeout_s"] = "s"
    if s.scenario == "multi-stream" and s.max_batch < MULTI_STREAM_SAMPLES:
        warnings.append(f"multi-stream: each query's {MULTI_STREAM_SAMPLES} samples ran as "
                        f"{math.ceil(MULTI_STREAM_SAMPLES / s.max_batch)} batches of up to {s.max_batch}; "
                        f"a batch size of {MULTI_STREAM_SAMPLES} runs a query as one batch")
    warnings += _unused(s)
    if s.scenario == "server":
        warnings = _server_notes(lg, session, s, metrics, units, capacity, warnings)
    if run.energy is not None:  # J per sample unit over the samples LoadGen's test ran
        from dlscale.harness import energy_meter as energy

        e_metrics, e_units, _ = energy.figures(run.energy, run.ran * per_sample, getattr(session, "sample_unit", unit))
        metrics.update({f"scenario_{k}": v for k, v in e_metrics.items()})
        units.update({f"scenario_{k}": v for k, v in e_units.items()})
    return ScenarioResult(metrics, units, bool(metrics.get("valid")), run.summary, _trim(run.detail), warnings)


def _raw_figures(metrics: dict[str, Any], units: dict[str, str], raw_wall: float) -> None:
    """Offline: the raw rate as LoadGen times it, and LoadGen's samples/s over it (what the harness costs)."""
    metrics["raw_wall_samples_per_s"], units["raw_wall_samples_per_s"] = round(raw_wall, 3), units["scenario_metric"]
    rate = metrics.get("scenario_metric")
    metrics["raw_wall_ratio"] = round(rate / raw_wall, 4) if isinstance(rate, (int, float)) and raw_wall else None
    units["raw_wall_ratio"] = "ratio"


def _server_notes(lg: Any, session: Any, s: ScenarioSettings, metrics: dict[str, Any], units: dict[str, str],
                  capacity: float | None, warnings: list[str]) -> list[str]:
    """A server run's bound and its source, the probed throughput, the query cap if it cut the run,
    and no scenario metric when the bound was missed; ``warnings`` with the server's own first."""
    rate = units["scenario_metric"]
    source = latency_bound_source(lg, s, session.model)
    metrics["latency_bound_source"] = source
    notes = []
    if source.startswith("mlperf.conf"):
        notes.append(f"--mlperf-durations: the server latency bound is {fmt_seconds(metrics.get('latency_bound_s'))}, "
                     f"{source} (without --mlperf-durations it is LoadGen's default "
                     f"{fmt_seconds(DEFAULT_LATENCY_BOUND_S)}); give --latency-bound to choose it")
    if capacity is not None:
        metrics["probed_samples_per_s"], units["probed_samples_per_s"] = round(capacity, 3), rate
    cap, issued = metrics.get("max_query_count"), metrics.get("query_count")
    metrics["query_cap_reached"] = bool(cap and issued and issued >= cap)
    if metrics["query_cap_reached"]:
        notes.append(f"server: LoadGen stopped issuing at its max query count of {cap} ({SERVER_QUERY_CAP:g} x the "
                     f"queries of a run at the probed {fmt_num(capacity)} {rate}): the SUT could not keep up with "
                     f"{fmt_num(metrics.get('target_qps'))} queries/s, so the run is INVALID; lower --target-qps "
                     "or use --find-peak")
        # the cut, not the schedule, left the min duration unmet: LoadGen's advice to raise the QPS is wrong here
        warnings = [w for w in warnings if "Increase the target QPS" not in w]
    if metrics.get("latency_bound_met") is False:
        notes.append(f"server: the completed {fmt_num(metrics.get('completed_samples_per_s'))} {rate} did not meet "
                     "the latency bound, so the run has no scenario metric")
        metrics["scenario_metric"] = None
    return notes + warnings


def _unused(s: ScenarioSettings) -> list[str]:
    """Settings the scenario ignores: said, not silently dropped."""
    out = []
    if s.latency_bound_s is not None and s.scenario != "server":
        out.append(f"{s.scenario}: the latency bound applies to the server scenario only; ignored")
    if s.target_qps is not None and s.scenario in ("single-stream", "multi-stream"):
        out.append(f"{s.scenario}: LoadGen issues the next query when one completes; the target QPS is ignored")
    return out


def _trim(detail: str) -> str:
    """The detail log's first DETAIL_HEAD and last DETAIL_TAIL characters (settings and results)."""
    if len(detail) <= DETAIL_HEAD + DETAIL_TAIL:
        return detail
    cut = len(detail) - DETAIL_HEAD - DETAIL_TAIL
    return f"{detail[:DETAIL_HEAD]}\n[... {cut} characters left out ...]\n{detail[-DETAIL_TAIL:]}"


# --- finding the server's peak --------------------------------------------------------------

_PEAK = re.compile(r"Found peak performance field: ([0-9.]+)")


def _find_peak(lg: Any, session: Any, s: ScenarioSettings, outdir: Path, capacity: float | None) -> ScenarioResult:
    """LoadGen's FindPeakPerformance mode; when its starting QPS already fails, bisection below it."""
    ts = settings_for(lg, session, s, mode="FindPeakPerformance", load=FIND_PEAK_START, capacity=capacity)
    start = ts.server_target_qps
    run = _start_test(lg, session, s, ts, outdir)
    found = _PEAK.search(run.detail)
    if found:
        peak = float(found.group(1))
        steps = len(re.findall(r"FindBoundaries: Checking|BinarySearch: Testing", run.detail)) + 1
        return _peak_result(_result(lg, session, s, run, capacity, ts), peak, "loadgen-find-peak", steps, start)
    last: dict[float, tuple[_Run, Any]] = {}

    def passes(qps: float) -> bool:
        at = settings_for(lg, session, s, qps=qps, capacity=capacity)
        r = _start_test(lg, session, s, at, outdir)
        m, _, _ = parse_summary(r.summary, "server", "samples")
        last[qps] = (r, at)
        return bool(m.get("latency_bound_met")) and bool(m.get("min_duration_met"))

    peak, tried = bisect_peak(passes, start / 2, hi=start)
    if peak is None:
        raise RunFailure(f"--find-peak: no target QPS down to {tried[-1][0]:.3g} met the latency bound; "
                         "raise --latency-bound or lower the batch size")
    run_at, ts_at = last[peak]
    result = _peak_result(_result(lg, session, s, run_at, capacity, ts_at), peak, "bisection", len(tried) + 1, start)
    result.warnings.append(f"find-peak: LoadGen's FindPeakPerformance failed at its start {start:.4g} QPS; "
                           f"bisected over {len(tried)} short runs: {tried}")
    return result


def _peak_result(result: ScenarioResult, peak: float, method: str, runs: int, start: float) -> ScenarioResult:
    """``result`` (the run at the peak) with the peak as the scenario metric and how it was found."""
    m, u = result.metrics, result.units
    for k in ("mlperf_result_key", "scenario_raw_name"):  # the peak is dlscale's search, not a LoadGen result key
        m.pop(k, None)
    m.update(peak_qps=peak, find_peak_method=method, find_peak_runs=runs, find_peak_start_qps=start,
             scenario_metric=peak, scenario_metric_name="peak_qps")
    u.update(peak_qps="queries/s", find_peak_runs="runs", find_peak_start_qps="queries/s", scenario_metric="queries/s")
    return result


def bisect_peak(passes: Callable[[float], bool], lo: float, hi: float, rel_tol: float = BISECT_REL_TOL,
                max_runs: int = BISECT_MAX_RUNS) -> tuple[float | None, list[tuple[float, bool]]]:
    """Highest QPS for which ``passes`` holds, given ``hi`` fails: halve down to a pass, then bisect.

    Returns the passing QPS (None if nothing passed within ``max_runs``) and every (qps, passed) tried.
    """
    tried: list[tuple[float, bool]] = []

    def check(qps: float) -> bool:
        ok = passes(qps)
        tried.append((round(qps, 3), ok))
        return ok

    while not check(lo):
        if len(tried) >= max_runs:
            return None, tried
        lo, hi = lo / 2, lo
    while (hi - lo) > rel_tol * lo and len(tried) < max_runs:
        mid = (lo + hi) / 2
        if check(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried
