"""A LoadGen scenario's settings: what the user asked for, checked, and LoadGen's TestSettings made from
it with the probes that size a short run (``dlscale.infer.loadgen`` runs them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dlscale.errors import UsageError

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
BATCH_TIMEOUT_SHARE = 0.1  # server: the batch-fill timeout when none is given, as a share of the latency bound


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
    batch_timeout_s: float | None = None  # server: how long the oldest query waits for its batch to fill
    runs: int = 1  # LoadGen tests; the record keeps the median one and every run's headline


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
    if settings.batch_timeout_s is not None and not settings.batch_timeout_s >= 0:
        raise UsageError(f"--batch-timeout {settings.batch_timeout_s} must be >= 0 seconds")
    if settings.runs < 1:
        raise UsageError(f"--scenario-runs {settings.runs} must be >= 1")
    if settings.runs > 1 and settings.find_peak:
        raise UsageError("--scenario-runs repeats one LoadGen test; --find-peak is a search of many: drop one of them")


def probe(session: Any, batch: int, worker_thread: bool = False) -> float:
    """Seconds per batch of ``batch`` samples as the SUT runs them (``infer.probe.time_batch`` with
    ``as_sut``: gathered from a sample store by ``infer.feed``, launched and waited for): the fastest
    of 3 after one warm-up batch, timed on the
    thread the SUT runs on: the calling one, as LoadGen's single-stream, multi-stream and offline
    issue, or (``worker_thread``) a thread of its own, as the server's batcher.

    The fastest, not the median: every use of it errs safe when it is low (offline issues more
    samples than min duration needs, single/multi-stream generate more queries than they use, the
    server's query cap is larger). The thread matters: on a CPU shared with other busy processes a
    forward on the main thread, whose 2-thread OpenMP team waits at barriers for descheduled workers,
    ran a median 52x slower than on a fresh thread (docs/PERFORMANCE.md; 1x with one thread).
    """
    from dlscale.infer.probe import time_batch

    times = time_batch(session, batch, 1, 3, as_sut=True, worker_thread=worker_thread)
    return max(min(times), 1e-6)


def probe_capacity(session: Any, s: ScenarioSettings) -> float:
    """Samples per second of full batches (the fastest of 3 probes) on a worker thread, as the server
    SUT runs them: its best sustained rate."""
    full = min(s.max_batch, s.samples)
    return full / probe(session, full, worker_thread=True)


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


def settings_for(lg: Any, session: Any, s: ScenarioSettings, qps: float | None = None,
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
        ts.single_stream_expected_latency_ns = max(1, int(probe(session, 1) * 1e9 / 2))
    elif s.scenario == "multi-stream":
        per_query = math.ceil(MULTI_STREAM_SAMPLES / s.max_batch) * probe(session, min(full, MULTI_STREAM_SAMPLES))
        ts.multi_stream_expected_latency_ns = max(1, int(per_query * 1e9 / 2))
    elif s.scenario == "offline":
        ts.offline_expected_qps = s.target_qps or OFFLINE_MARGIN * full / probe(session, full)
    else:
        capacity = capacity or probe_capacity(session, s)
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


def batch_timeout(s: ScenarioSettings, ts: Any) -> tuple[float, str]:
    """The server's batch-fill timeout (seconds) and where it came from: --batch-timeout, else
    BATCH_TIMEOUT_SHARE of the latency bound LoadGen runs with."""
    if s.batch_timeout_s is not None:
        return s.batch_timeout_s, "--batch-timeout"
    return BATCH_TIMEOUT_SHARE * ts.server_target_latency_ns / 1e9, f"{BATCH_TIMEOUT_SHARE:g} x the latency bound"


