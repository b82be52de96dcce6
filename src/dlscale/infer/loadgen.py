"""MLPerf LoadGen scenarios (single-stream, multi-stream, server, offline) over an inference session.

LoadGen (``mlperf_loadgen``, the MLCommons library) owns the traffic: it decides when queries
are issued and measures each one from issue to completion; dlscale supplies the system under
test (SUT: runs ``session.run`` on a query's samples and reports completion) and the query
sample library (QSL: ``session.sample(i)`` preloaded into host memory). The figures come from
LoadGen's own ``mlperf_log_summary.txt``, parsed here, so they mean what MLPerf means by them.

Batching in the SUT: single-stream runs its one sample; multi-stream runs the query's samples
(LoadGen's 8) in batches of up to ``max_batch``; offline runs the one big query in batches of
``max_batch``; server enqueues each query and one worker thread drains the queue, each batch
being the oldest query plus whatever else is already waiting, up to ``max_batch`` (no timeout:
it never waits for a batch to fill). Responses carry no data (pointer 0, size 0): these are
performance runs, LoadGen's accuracy mode is not used.

Short runs (the default) cannot always satisfy LoadGen's early-stopping rule, so their
``valid`` is often False for that reason alone; every reason LoadGen gives goes into
``warnings`` and the constraint flags (``latency_bound_met`` ...) are reported on their own.
"""

from __future__ import annotations

import json
import math
import queue
import re
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from dlscale.errors import RunFailure, UsageError

SCENARIOS = ("single-stream", "multi-stream", "server", "offline")
LG_SCENARIO = {"single-stream": "SingleStream", "multi-stream": "MultiStream", "server": "Server",
               "offline": "Offline"}
DEFAULT_LATENCY_BOUND_S = 0.1  # LoadGen's TestSettings default server bound (100 ms at the 99th percentile)
SHORT_DURATION_S = 2.0  # min duration of a short run; LoadGen's official minimum is 600 s
SHORT_QUERY_COUNT = {"single-stream": 64, "multi-stream": 64, "server": 64, "offline": 1}
MULTI_STREAM_SAMPLES = 8  # LoadGen's samples per multi-stream query (MLPerf's fixed value)
SERVER_LOAD = 0.5  # server target when none is given: this fraction of the probed full-batch throughput
FIND_PEAK_START = 0.1  # find-peak's first QPS when none is given: LoadGen doubles from there, so start low
OFFLINE_MARGIN = 1.2  # offline expected QPS = probe x this, so the one query lasts past min duration
DETAIL_HEAD, DETAIL_TAIL = 20_000, 80_000  # characters of mlperf_log_detail.txt kept (start and end)
BISECT_REL_TOL, BISECT_MAX_RUNS = 0.05, 10
_LOCK = threading.Lock()  # LoadGen is one process-wide test at a time


@dataclass
class ScenarioSettings:
    """One LoadGen scenario run: what traffic, how the SUT batches, how long."""

    scenario: str
    max_batch: int = 1
    latency_bound_s: float | None = None
    target_qps: float | None = None
    find_peak: bool = False
    mlperf_durations: bool = False
    duration_s: float | None = None
    query_count: int | None = None
    samples: int = 64
    log_dir: str | None = None


@dataclass
class ScenarioResult:
    """LoadGen's verdict and figures for one scenario run (latencies in seconds)."""

    metrics: dict[str, Any]
    units: dict[str, str]
    valid: bool
    summary: str
    detail: str
    warnings: list[str] = field(default_factory=list)


def check_settings(settings: ScenarioSettings) -> None:
    """Reject settings LoadGen cannot run, before any work starts (one-line UsageError)."""
    if settings.scenario not in SCENARIOS:
        raise UsageError(f"--scenario {settings.scenario!r} is unknown: use one of {', '.join(SCENARIOS)}")
    if settings.latency_bound_s is not None and not settings.latency_bound_s > 0:
        raise UsageError(f"--latency-bound {settings.latency_bound_s} must be > 0 seconds")
    if settings.max_batch < 1:
        raise UsageError(f"--batch-sizes {settings.max_batch} must be >= 1 for a LoadGen scenario")
    if settings.target_qps is not None and not settings.target_qps > 0:
        raise UsageError(f"--target-qps {settings.target_qps} must be > 0")
    if settings.duration_s is not None and not settings.duration_s > 0:
        raise UsageError(f"--duration {settings.duration_s} must be > 0 seconds")
    if settings.query_count is not None and settings.query_count < 1:
        raise UsageError(f"--query-count {settings.query_count} must be >= 1")
    if settings.samples < 1:
        raise UsageError(f"--samples {settings.samples} must be >= 1 (samples in LoadGen's sample library)")
    if settings.find_peak and settings.scenario != "server":
        raise UsageError(f"--find-peak needs --scenario server, not {settings.scenario}")


# --- the query sample library and the system under test -------------------------------------

class _Samples:
    """The QSL's host-memory cache: LoadGen asks to load/unload sample indices around a test."""

    def __init__(self, session: Any):
        self.session, self.loaded = session, {}

    def load(self, indices: list[int]) -> None:
        """LoadGen's LoadSamplesToRam: make these samples now, so no query pays for making one."""
        for i in indices:
            self.loaded[i] = self.session.sample(i)

    def unload(self, indices: list[int]) -> None:
        """LoadGen's UnloadSamplesFromRam."""
        for i in indices:
            self.loaded.pop(i, None)

    def get(self, index: int) -> Any:
        """A loaded sample (LoadGen only asks for loaded ones; made on demand otherwise)."""
        hit = self.loaded.get(index)
        return hit if hit is not None else self.session.sample(index)


class _Sut:
    """Runs the session on LoadGen's queries and reports each sample complete."""

    def __init__(self, lg: Any, session: Any, samples: _Samples, scenario: str, max_batch: int):
        self.lg, self.session, self.samples = lg, session, samples
        self.scenario, self.max_batch = scenario, max_batch
        self.error: BaseException | None = None
        self.batches = self.ran = 0
        self.pending: queue.Queue = queue.Queue()
        self.worker: threading.Thread | None = None

    def issue(self, queries: list[Any]) -> None:
        """LoadGen's IssueQuery: server queues (returns at once), the others run in place."""
        if self.scenario == "server":
            for q in queries:
                self.pending.put(q)
            return
        for start in range(0, len(queries), self.max_batch):
            self._run(queries[start:start + self.max_batch])

    def flush(self) -> None:
        """LoadGen's FlushQueries: nothing is held back, the server worker never waits."""

    def _run(self, batch: list[Any]) -> None:
        """One session batch, then completion; after a failure only completion (the error is re-raised later)."""
        try:
            if self.error is None:
                self.session.run([self.samples.get(q.index) for q in batch])
                self.batches, self.ran = self.batches + 1, self.ran + len(batch)
        except BaseException as e:  # noqa: BLE001 - LoadGen would wait forever for these samples
            self.error = e
        self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(q.id, 0, 0) for q in batch])

    def _drain(self) -> None:
        """Server worker: the oldest waiting query plus whatever else waits, up to max_batch, until stopped."""
        stop = False
        while not stop:
            first = self.pending.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    nxt = self.pending.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._run(batch)

    def start(self) -> None:
        """Start the server worker (the other scenarios run on LoadGen's issue thread)."""
        if self.scenario == "server":
            self.worker = threading.Thread(target=self._drain, name="dlscale-loadgen-sut", daemon=True)
            self.worker.start()

    def stop(self) -> None:
        """Stop the server worker once LoadGen's test has returned (every query is complete by then)."""
        if self.worker is not None:
            self.pending.put(None)
            self.worker.join()
            self.worker = None


# --- settings -------------------------------------------------------------------------------

def _probe(session: Any, batch: int) -> float:
    """Seconds per ``session.run`` of ``batch`` samples: the fastest of 3 after one warm-up run.

    The fastest, not the median: every use of it errs safe when it is low (offline issues more
    samples than min duration needs, single/multi-stream generate more queries than they use).
    """
    samples = [session.sample(i) for i in range(batch)]
    session.run(samples)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        session.run(samples)
        times.append(time.perf_counter() - t0)
    return max(min(times), 1e-6)


def _test_settings(lg: Any, session: Any, s: ScenarioSettings, qps: float | None = None,
                   mode: str = "PerformanceOnly", load: float = SERVER_LOAD) -> Any:
    """LoadGen TestSettings for ``s``: short durations unless ``mlperf_durations``; probed expectations."""
    ts = lg.TestSettings()
    if s.mlperf_durations:  # LoadGen's built-in mlperf.conf for this model and scenario (600 s ...)
        ts.FromConfig("", session.model, LG_SCENARIO[s.scenario], 0)
        ts.performance_sample_count_override = 0  # the QSL's own count: settings.samples
    else:
        ts.min_duration_ms = int(1000 * SHORT_DURATION_S)
        ts.min_query_count = SHORT_QUERY_COUNT[s.scenario]
    ts.scenario = getattr(lg.TestScenario, LG_SCENARIO[s.scenario])
    ts.mode = getattr(lg.TestMode, mode)
    if s.duration_s is not None:
        ts.min_duration_ms = max(1, int(1000 * s.duration_s))
    if s.query_count is not None:
        ts.min_query_count = s.query_count
    if s.latency_bound_s is not None:
        ts.server_target_latency_ns = int(s.latency_bound_s * 1e9)
    full = min(s.max_batch, s.samples)
    if s.scenario == "single-stream":
        ts.single_stream_expected_latency_ns = max(1, int(_probe(session, 1) * 1e9 / 2))
    elif s.scenario == "multi-stream":
        per_query = math.ceil(MULTI_STREAM_SAMPLES / s.max_batch) * _probe(session, min(full, MULTI_STREAM_SAMPLES))
        ts.multi_stream_expected_latency_ns = max(1, int(per_query * 1e9 / 2))
    elif s.scenario == "offline":
        ts.offline_expected_qps = s.target_qps or OFFLINE_MARGIN * full / _probe(session, full)
    else:
        ts.server_target_qps = qps or s.target_qps or load * full / _probe(session, full)
        if s.find_peak and not s.mlperf_durations:
            ts.server_find_peak_qps_decimals_of_precision = 0  # stop at 1 QPS resolution: fewer runs
    return ts


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
    energy: dict[str, Any] | None = None  # harness.energy reading over LoadGen's test


def _start_test(lg: Any, session: Any, s: ScenarioSettings, ts: Any, outdir: Path) -> _Run:
    """One LoadGen test of ``session`` under ``ts``; logs in ``outdir``; the session's error re-raised."""
    samples = _Samples(session)
    sut = _Sut(lg, session, samples, s.scenario, s.max_batch)
    log = lg.LogSettings()
    out = lg.LogOutputSettings()
    out.outdir, out.copy_summary_to_stdout, out.copy_detail_to_stdout = str(outdir), False, False
    log.log_output = out
    sut_handle = lg.ConstructSUT(sut.issue, sut.flush)
    qsl_handle = lg.ConstructQSL(s.samples, s.samples, samples.load, samples.unload)
    from dlscale.harness.energy import EnergyMeter

    meter = EnergyMeter(getattr(session, "device", None) if getattr(session, "runtime", "torch") == "torch" else None)
    sut.start()
    try:
        meter.begin()  # LoadGen's test is the measured window: its queries, latencies and rates
        lg.StartTestWithLogSettings(sut_handle, qsl_handle, ts, log)
        meter.end()
    finally:
        meter.close()
        sut.stop()
        lg.DestroyQSL(qsl_handle)
        lg.DestroySUT(sut_handle)
    if sut.error is not None:
        raise RunFailure(f"--scenario {s.scenario}: the session failed during the LoadGen run: "
                         f"{type(sut.error).__name__}: {sut.error}") from sut.error
    summary = (outdir / "mlperf_log_summary.txt").read_text()
    detail = (outdir / "mlperf_log_detail.txt").read_text()
    return _Run(summary, detail, sut.batches, sut.ran, meter.reading())


def run_scenario(session: Any, settings: ScenarioSettings) -> ScenarioResult:
    """Run one LoadGen scenario on ``session`` and return LoadGen's figures and verdict."""
    check_settings(settings)
    import mlperf_loadgen as lg

    with _LOCK, _log_dir(settings.log_dir) as outdir:
        if settings.find_peak:
            return _find_peak(lg, session, settings, outdir)
        ts = _test_settings(lg, session, settings)
        run = _start_test(lg, session, settings, ts, outdir)
    return _result(session, settings, run)


def _result(session: Any, s: ScenarioSettings, run: _Run, extra: dict[str, Any] | None = None) -> ScenarioResult:
    """The ScenarioResult of one run: parsed summary, SUT batching counts, LoadGen's reasons as warnings."""
    per_sample = session.units(1) if hasattr(session, "units") else 1
    unit = getattr(session, "sample_unit", "samples") if per_sample == 1 else "samples"
    metrics, units, warnings = parse_summary(run.summary, s.scenario, unit)
    if per_sample != 1:  # token families: a LoadGen sample is one sequence of per_sample tokens
        metrics["units_per_sample"], units["units_per_sample"] = per_sample, session.sample_unit
    metrics.update(_detail_counts(run.detail))
    metrics.update(max_batch=s.max_batch, sut_batches=run.batches,
                   sut_mean_batch=round(run.ran / run.batches, 3) if run.batches else None)
    units.update(max_batch="samples", sut_batches="batches", sut_mean_batch="samples")
    if s.scenario == "multi-stream" and s.max_batch < MULTI_STREAM_SAMPLES:
        warnings.append(f"multi-stream: each query's {MULTI_STREAM_SAMPLES} samples ran as "
                        f"{math.ceil(MULTI_STREAM_SAMPLES / s.max_batch)} batches of up to {s.max_batch}; "
                        f"a batch size of {MULTI_STREAM_SAMPLES} runs a query as one batch")
    warnings += _unused(s)
    if s.scenario == "server" and metrics.get("latency_bound_met") is False:
        warnings.append(f"server: the scheduled {metrics.get('scheduled_samples_per_s')} {units['scenario_metric']} "
                        "did not meet the latency bound, so the run has no scenario metric")
        metrics["scenario_metric"] = None
    metrics.update(extra or {})
    if run.energy is not None:  # J per sample unit over the samples LoadGen's test ran
        from dlscale.harness import energy

        e_metrics, e_units, _ = energy.figures(run.energy, run.ran * per_sample, getattr(session, "sample_unit", unit))
        metrics.update({f"scenario_{k}": v for k, v in e_metrics.items()})
        units.update({f"scenario_{k}": v for k, v in e_units.items()})
    return ScenarioResult(metrics, units, bool(metrics.get("valid")), run.summary, _trim(run.detail), warnings)


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


def _find_peak(lg: Any, session: Any, s: ScenarioSettings, outdir: Path) -> ScenarioResult:
    """LoadGen's FindPeakPerformance mode; when its starting QPS already fails, bisection below it."""
    ts = _test_settings(lg, session, s, mode="FindPeakPerformance", load=FIND_PEAK_START)
    start = ts.server_target_qps
    run = _start_test(lg, session, s, ts, outdir)
    found = _PEAK.search(run.detail)
    if found:
        peak = float(found.group(1))
        steps = len(re.findall(r"FindBoundaries: Checking|BinarySearch: Testing", run.detail)) + 1
        return _peak_result(_result(session, s, run), peak, "loadgen-find-peak", steps, start)
    last: dict[float, _Run] = {}

    def passes(qps: float) -> bool:
        r = _start_test(lg, session, s, _test_settings(lg, session, s, qps=qps), outdir)
        m, _, _ = parse_summary(r.summary, "server", "samples")
        last[qps] = r
        return bool(m.get("latency_bound_met")) and bool(m.get("min_duration_met"))

    peak, tried = bisect_peak(passes, start / 2, hi=start)
    if peak is None:
        raise RunFailure(f"--find-peak: no target QPS down to {tried[-1][0]:.3g} met the latency bound; "
                         "raise --latency-bound or lower the batch size")
    result = _peak_result(_result(session, s, last[peak]), peak, "bisection", len(tried) + 1, start)
    result.warnings.append(f"find-peak: LoadGen's FindPeakPerformance failed at its start {start:.4g} QPS; "
                           f"bisected over {len(tried)} short runs: {tried}")
    return result


def _peak_result(result: ScenarioResult, peak: float, method: str, runs: int, start: float) -> ScenarioResult:
    """``result`` (the run at the peak) with the peak as the scenario metric and how it was found."""
    m, u = result.metrics, result.units
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


# --- reading LoadGen's logs -----------------------------------------------------------------

_KV = re.compile(r"^\s*(?:\*\s*)?(?P<key>[^:*][^:]*?)\s*:\s*(?P<val>.*?)\s*$")
_HEADLINE = re.compile(r"^(\d+(?:\.\d+)?)th percentile latency \(ns\)$")
_PERCENTILE = re.compile(r"^(\d+)\.(\d+) percentile latency \(ns\)$")
_EARLY = re.compile(r"^Early stopping (\d+(?:\.\d+)?)th percentile estimate$")
_FLAGS = {"Min duration satisfied": "min_duration_met", "Min queries satisfied": "min_queries_met",
          "Early stopping satisfied": "early_stopping_met", "Performance constraints satisfied": "latency_bound_met"}
_RATES = {"Samples per second": "samples_per_s", "Completed samples per second": "completed_samples_per_s",
          "Scheduled samples per second": "scheduled_samples_per_s",
          "QPS w/ loadgen overhead": "qps_with_loadgen_overhead",
          "QPS w/o loadgen overhead": "qps_without_loadgen_overhead"}
_LATENCIES = {"Min latency (ns)": "latency_min", "Max latency (ns)": "latency_max", "Mean latency (ns)": "latency_mean"}
_SCENARIO_METRIC = {"single-stream": "latency_p90", "multi-stream": "latency_p99",
                    "server": "scheduled_samples_per_s", "offline": "samples_per_s"}


def _pct_name(whole: str, frac: str) -> str:
    """'99', '90' -> latency_p99_9; '50', '00' -> latency_p50 (LoadGen prints two decimals)."""
    frac = frac.rstrip("0")
    return f"latency_p{int(whole)}" + (f"_{frac}" if frac else "")


def summary_fields(text: str) -> dict[str, str]:
    """Every ``label : value`` line of mlperf_log_summary.txt (first occurrence wins)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _KV.match(line)
        if m and m.group("key") not in fields:
            fields[m.group("key")] = m.group("val")
    return fields


def parse_summary(text: str, scenario: str, sample_unit: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(metrics, units, warnings) from mlperf_log_summary.txt: ns become seconds, Yes/NO become booleans."""
    fields = summary_fields(text)
    metrics: dict[str, Any] = {"scenario": scenario, "result": fields.get("Result is")}
    metrics["valid"] = metrics["result"] == "VALID"
    units: dict[str, str] = {}
    rate_unit = f"{sample_unit}/s"
    for key, val in fields.items():
        name, unit, value = _field(key, val, rate_unit)
        if name is not None:
            metrics[name], units[name] = value, unit
    if "target_latency (ns)" in fields and scenario == "server":
        metrics["latency_bound_s"], units["latency_bound_s"] = int(fields["target_latency (ns)"]) / 1e9, "s"
    if "target_qps" in fields and scenario in ("server", "offline"):
        metrics["target_qps"], units["target_qps"] = float(fields["target_qps"]), "queries/s"
    if "samples_per_query" in fields:
        metrics["samples_per_query"], units["samples_per_query"] = int(fields["samples_per_query"]), "samples"
    name = _SCENARIO_METRIC[scenario]
    metrics["scenario_metric_name"] = name
    metrics["scenario_metric"] = metrics.get(name)
    units["scenario_metric"] = units.get(name, "s" if name.startswith("latency") else rate_unit)
    return metrics, units, _reasons(text, fields)


def _field(key: str, val: str, rate_unit: str) -> tuple[str | None, str, Any]:
    """(metric name, unit, value) of one summary line, or (None, '', None) for lines not kept."""
    try:
        if key in _FLAGS:
            return _FLAGS[key], "bool", val.strip().lower() == "yes"
        if key in _RATES:
            unit = "queries/s" if key.startswith("QPS") else rate_unit
            return _RATES[key], unit, float(val)
        if key in _LATENCIES:
            return _LATENCIES[key], "s", int(val) / 1e9
        if m := _PERCENTILE.match(key):
            return _pct_name(m.group(1), m.group(2)), "s", int(val) / 1e9
        if m := _HEADLINE.match(key):  # the scenario's own percentile (90.0th single-, 99.0th multi-stream)
            return _pct_name(*m.group(1).partition(".")[::2]), "s", int(val) / 1e9
        if m := _EARLY.match(key):  # LoadGen's early-stopping estimate of that percentile
            return "early_stopping_" + _pct_name(*m.group(1).partition(".")[::2]), "s", int(val) / 1e9
    except ValueError:
        pass
    return None, "", None


def _bullets(block: str) -> list[str]:
    """The ``* ...`` items of a summary section, continuation lines joined to their item."""
    items: list[str] = []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("*"):
            items.append(line.lstrip("* ").strip())
        elif line and items:
            items[-1] += " " + line
    return items


def _reasons(text: str, fields: dict[str, str]) -> list[str]:
    """LoadGen's reasons a run is INVALID, its recommendations, and its warning/error counts."""
    out = [f"LoadGen: {key} : NO" for key in _FLAGS if fields.get(key, "").lower() == "no"]
    results = text.split("Additional Stats", 1)[0]
    recommended, _, early = results.partition("Early Stopping Result:")
    if "Recommendations:" in recommended:
        out += [f"LoadGen recommends: {b}" for b in _bullets(recommended.split("Recommendations:", 1)[1])]
    if fields.get("Early stopping satisfied", "").lower() == "no":
        out += [f"LoadGen early stopping: {b}" for b in _bullets(early.split("=====", 1)[0])]
    for line in text.splitlines():
        if re.search(r"(warning|error)s? encountered", line, re.I) and not line.strip().startswith("No "):
            out.append(f"LoadGen: {line.strip()}")
    return out


def _detail_counts(detail: str) -> dict[str, Any]:
    """Query counts from the detail log's result keys (the summary prints them only in prose)."""
    keys = {"result_query_count": "query_count", "result_overlatency_query_count": "overlatency_query_count"}
    out: dict[str, Any] = {}
    for line in detail.splitlines():
        if not line.startswith(":::MLLOG") or '"result_' not in line:
            continue
        try:
            entry = json.loads(line[len(":::MLLOG"):])
        except ValueError:
            continue
        if entry.get("key") in keys:
            out[keys[entry["key"]]] = entry["value"]
    return out
