"""MLPerf LoadGen scenarios (single-stream, multi-stream, server, offline) over an inference session.

LoadGen (``mlperf_loadgen``, the MLCommons library) owns the traffic: it decides when queries
are issued and measures each one from issue to completion; dlscale supplies the system under
test (SUT: runs ``session.run`` on a query's samples and reports completion) and the query
sample library (QSL: ``session.sample(i)`` preloaded into host memory). The figures come from
LoadGen's own logs (``loadgen_log``), and each scenario's headline is the one MLPerf reports.

Batching in the SUT: single-stream runs its one sample; multi-stream runs the query's samples
(LoadGen's 8) in batches of up to ``max_batch``; offline runs the one big query in batches of
``max_batch``; server enqueues each query and one worker thread drains the queue, each batch
being the oldest query plus whatever else is already waiting, up to ``max_batch`` (no timeout:
it never waits for a batch to fill). Responses carry no data (pointer 0, size 0): these are
performance runs, LoadGen's accuracy mode is not used.

Short runs (the default: 2 s, and the 64 or 662 queries LoadGen's early-stopping estimate needs)
cannot always satisfy LoadGen's early-stopping rule, so their ``valid`` is often False for that
reason alone; every reason LoadGen gives goes into ``warnings`` and the constraint flags
(``latency_bound_met`` ...) are reported on their own. A server run is bounded: LoadGen's max
query count (``server_query_cap``) stops one far above the SUT's probed throughput, which LoadGen
would otherwise wait on until every scheduled query completed.
"""

from __future__ import annotations

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
from dlscale.format import fmt_num, fmt_seconds
from dlscale.infer.loadgen_log import parse_summary, read_logs

SCENARIOS = ("single-stream", "multi-stream", "server", "offline")
LG_SCENARIO = {"single-stream": "SingleStream", "multi-stream": "MultiStream", "server": "Server",
               "offline": "Offline"}
DEFAULT_LATENCY_BOUND_S = 0.1  # LoadGen's TestSettings default server bound (100 ms at the 99th percentile)
SHORT_DURATION_S = 2.0  # min duration of a short run; LoadGen's official minimum is 600 s
# min query count of a short run: LoadGen's early-stopping minimum (64 queries for a 90th-percentile
# estimate, 662 for a 99th, as mlperf.conf's *.MultiStream.min_query_count), so the headline exists
SHORT_QUERY_COUNT = {"single-stream": 64, "multi-stream": 662, "server": 64, "offline": 1}
MULTI_STREAM_SAMPLES = 8  # LoadGen's samples per multi-stream query (MLPerf's fixed value)
SERVER_LOAD = 0.5  # server target when none is given: this fraction of the probed full-batch throughput
SERVER_QUERY_CAP = 4.0  # server: LoadGen's max query count = this x the queries of a run at the probed throughput
UNNAMED_MODEL = "dlscale-unnamed-model"  # a name mlperf.conf does not have: its '*' values
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

def _probe(session: Any, batch: int, worker_thread: bool = False) -> float:
    """Seconds per ``session.run`` of ``batch`` samples: the fastest of 3 after one warm-up run, timed
    on the thread the SUT runs on: the calling one, as LoadGen's single-stream, multi-stream and
    offline issue, or (``worker_thread``) a thread of its own, as the server worker.

    The fastest, not the median: every use of it errs safe when it is low (offline issues more
    samples than min duration needs, single/multi-stream generate more queries than they use, the
    server's query cap is larger). The thread matters: on a CPU shared with other busy processes a
    forward on the main thread, whose 2-thread OpenMP team waits at barriers for descheduled workers,
    ran a median 52x slower than on a fresh thread (benchmarks/loadgen_threads.py; 1x with one thread).
    """
    samples = [session.sample(i) for i in range(batch)]
    times: list[float] = []
    failed: list[BaseException] = []

    def timed() -> None:
        try:
            session.run(samples)
            for _ in range(3):
                t0 = time.perf_counter()
                session.run(samples)
                times.append(time.perf_counter() - t0)
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            failed.append(e)

    if worker_thread:
        worker = threading.Thread(target=timed, name="dlscale-loadgen-probe")
        worker.start()
        worker.join()
    else:
        timed()
    if failed:
        raise failed[0]
    return max(min(times), 1e-6)


def _capacity(session: Any, s: ScenarioSettings) -> float:
    """Samples per second of full batches (the fastest of 3 probes) on a worker thread, as the server
    SUT runs them: its best sustained rate."""
    full = min(s.max_batch, s.samples)
    return full / _probe(session, full, worker_thread=True)


def server_query_cap(min_queries: int, min_duration_s: float, capacity: float) -> int:
    """LoadGen's max query count for a server run: SERVER_QUERY_CAP x the queries a run needs at ``capacity``.

    LoadGen issues every query on its schedule whether or not the SUT keeps up, then waits for all of
    them, so an unbounded run far above capacity lasts (target QPS x min duration) / capacity. A run
    at or below capacity issues at most max(min_queries, capacity x min_duration) + 1 and is never
    cut, nor is one up to SERVER_QUERY_CAP x capacity (room for a probe that ran slow); one above
    stops issuing at the cap and is drained in about SERVER_QUERY_CAP x min duration (LoadGen then
    finds min duration unmet: INVALID).
    """
    return math.ceil(SERVER_QUERY_CAP * max(min_queries, capacity * min_duration_s))


def _test_settings(lg: Any, session: Any, s: ScenarioSettings, qps: float | None = None,
                   mode: str = "PerformanceOnly", load: float = SERVER_LOAD, capacity: float | None = None) -> Any:
    """LoadGen TestSettings for ``s``: short durations unless ``mlperf_durations``; probed expectations;
    a server run's query count capped by ``server_query_cap`` at ``capacity`` (probed if not given)."""
    ts = lg.TestSettings()
    if s.mlperf_durations:  # LoadGen's built-in mlperf.conf for this model and scenario (600 s, server bound ...)
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
        capacity = capacity or _capacity(session, s)
        ts.server_target_qps = qps or s.target_qps or load * capacity
        cap = server_query_cap(ts.min_query_count, ts.min_duration_ms / 1000, capacity)
        ts.max_query_count = min(cap, ts.max_query_count or cap)  # a lower one from mlperf.conf stands
        if s.find_peak and not s.mlperf_durations:
            ts.server_find_peak_qps_decimals_of_precision = 0  # stop at 1 QPS resolution: fewer runs
    return ts


def latency_bound_source(lg: Any, s: ScenarioSettings, model: str) -> str:
    """Where a server run's latency bound came from: --latency-bound, mlperf.conf, or LoadGen's default."""
    if s.latency_bound_s is not None:
        return "--latency-bound"
    if not s.mlperf_durations:
        return f"LoadGen's default ({DEFAULT_LATENCY_BOUND_S * 1000:g} ms)"
    bounds = []
    for name in (model, UNNAMED_MODEL):
        ts = lg.TestSettings()
        ts.FromConfig("", name, "Server", 0)
        bounds.append(ts.server_target_latency_ns)
    if bounds[0] != bounds[1]:
        return f"mlperf.conf {model}.Server.target_latency"
    return "mlperf.conf *.Server.target_latency (its bound for models it does not name)"


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
        capacity = _capacity(session, settings) if settings.scenario == "server" else None
        if settings.find_peak:
            return _find_peak(lg, session, settings, outdir, capacity)
        ts = _test_settings(lg, session, settings, capacity=capacity)
        run = _start_test(lg, session, settings, ts, outdir)
    return _result(lg, session, settings, run, capacity)


def _result(lg: Any, session: Any, s: ScenarioSettings, run: _Run, capacity: float | None = None) -> ScenarioResult:
    """The ScenarioResult of one run: LoadGen's logs read, SUT batching counts, LoadGen's reasons as warnings."""
    per_sample = session.units(1) if hasattr(session, "units") else 1
    unit = getattr(session, "sample_unit", "samples") if per_sample == 1 else "samples"
    metrics, units, warnings = read_logs(run.summary, run.detail, s.scenario, unit)
    if per_sample != 1:  # token families: a LoadGen sample is one sequence of per_sample tokens
        metrics["units_per_sample"], units["units_per_sample"] = per_sample, session.sample_unit
    metrics.update(max_batch=s.max_batch, sut_batches=run.batches,
                   sut_mean_batch=round(run.ran / run.batches, 3) if run.batches else None)
    units.update(max_batch="samples", sut_batches="batches", sut_mean_batch="samples")
    if s.scenario == "multi-stream" and s.max_batch < MULTI_STREAM_SAMPLES:
        warnings.append(f"multi-stream: each query's {MULTI_STREAM_SAMPLES} samples ran as "
                        f"{math.ceil(MULTI_STREAM_SAMPLES / s.max_batch)} batches of up to {s.max_batch}; "
                        f"a batch size of {MULTI_STREAM_SAMPLES} runs a query as one batch")
    warnings += _unused(s)
    if s.scenario == "server":
        warnings = _server_notes(lg, session, s, metrics, units, capacity, warnings)
    if run.energy is not None:  # J per sample unit over the samples LoadGen's test ran
        from dlscale.harness import energy

        e_metrics, e_units, _ = energy.figures(run.energy, run.ran * per_sample, getattr(session, "sample_unit", unit))
        metrics.update({f"scenario_{k}": v for k, v in e_metrics.items()})
        units.update({f"scenario_{k}": v for k, v in e_units.items()})
    return ScenarioResult(metrics, units, bool(metrics.get("valid")), run.summary, _trim(run.detail), warnings)


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
    ts = _test_settings(lg, session, s, mode="FindPeakPerformance", load=FIND_PEAK_START, capacity=capacity)
    start = ts.server_target_qps
    run = _start_test(lg, session, s, ts, outdir)
    found = _PEAK.search(run.detail)
    if found:
        peak = float(found.group(1))
        steps = len(re.findall(r"FindBoundaries: Checking|BinarySearch: Testing", run.detail)) + 1
        return _peak_result(_result(lg, session, s, run, capacity), peak, "loadgen-find-peak", steps, start)
    last: dict[float, _Run] = {}

    def passes(qps: float) -> bool:
        r = _start_test(lg, session, s, _test_settings(lg, session, s, qps=qps, capacity=capacity), outdir)
        m, _, _ = parse_summary(r.summary, "server", "samples")
        last[qps] = r
        return bool(m.get("latency_bound_met")) and bool(m.get("min_duration_met"))

    peak, tried = bisect_peak(passes, start / 2, hi=start)
    if peak is None:
        raise RunFailure(f"--find-peak: no target QPS down to {tried[-1][0]:.3g} met the latency bound; "
                         "raise --latency-bound or lower the batch size")
    result = _peak_result(_result(lg, session, s, last[peak], capacity), peak, "bisection", len(tried) + 1, start)
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
