"""The serving client driven by MLPerf LoadGen's server scenario with token latencies.

LoadGen owns the traffic: it issues queries at ``server_target_qps`` (its own Poisson schedule)
from its thread; each query's sample becomes one request on this run's asyncio loop. The first
token reports ``FirstTokenComplete`` and the end ``QuerySamplesComplete`` with the answer's token
count, so LoadGen measures TTFT and TPOT itself and judges them against ``ttft_latency`` and
``tpot_latency`` (the SLO, MLPerf's p99 bounds) with its early-stopping rule. The figures are read
from LoadGen's logs (``infer.loadgen_log``): its result (VALID or INVALID), completed tokens/s (the
server scenario's headline for LLMs), the p99 first-token latency and time per output token, and
each early-stopping verdict; the same requests also give dlscale's own figures (``serve.figures``).

A request that fails is still completed to LoadGen (first token at its failure, two tokens) so
that LoadGen's run ends; it is counted in the errors and the record warns that LoadGen's figures
include it.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.serve.client import Endpoint, Result, send
from dlscale.serve.load import Point

NS = 1e9
_SUMMARY = {"Completed tokens per second": ("mlperf_completed_tokens_per_s", "tokens/s", 1.0),
            "Completed samples per second": ("mlperf_completed_samples_per_s", "requests/s", 1.0),
            "Scheduled samples per second": ("mlperf_scheduled_samples_per_s", "requests/s", 1.0),
            "Mean First Token latency (ns)": ("mlperf_ttft_mean_s", "s", 1 / NS),
            "Mean Time per Output Token (ns)": ("mlperf_tpot_mean_s", "s", 1 / NS),
            "ttft_latency (ns)": ("mlperf_ttft_bound_s", "s", 1 / NS),
            "tpot_latency (ns)": ("mlperf_tpot_bound_s", "s", 1 / NS)}
_P99 = {"first token": ("mlperf_ttft_p99_s", "s"), "time to output token": ("mlperf_tpot_p99_s", "s")}


def settings(lg: Any, rate: float, ttft_s: float, tpot_s: float, requests: int, duration_s: float) -> Any:
    """LoadGen's server scenario at ``rate`` with token latencies bounded at the SLO, ``requests`` queries
    at least and as many as ``duration_s`` holds (a short run, not MLPerf's official 600 s)."""
    ts = lg.TestSettings()
    ts.scenario, ts.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    ts.server_target_qps = float(rate)
    ts.use_token_latencies = True
    ts.ttft_latency, ts.tpot_latency = int(ttft_s * NS), int(tpot_s * NS)
    ts.min_query_count, ts.max_query_count = requests, requests
    ts.min_duration_ms = 0
    ts.max_duration_ms = int(duration_s * 1000)
    return ts


def check(cfg: Any) -> None:
    """What a LoadGen run needs: one rate, both token bounds, streamed answers."""
    slo = cfg.slo_bounds
    if cfg.mode != "rate" or len(cfg.rates) != 1 or cfg.rates[0] == float("inf"):
        raise UsageError("--loadgen runs LoadGen's server scenario at one rate: give --rates R (requests/s)")
    if slo.ttft_s is None or slo.tpot_s is None:
        raise UsageError("--loadgen judges TTFT and TPOT as MLPerf does: give both (--slo mlperf-llama2-70b, or "
                         "ttft=S,tpot=S)")
    if not cfg.stream or cfg.find_max:
        raise UsageError("--loadgen needs streamed answers (token latencies) and runs one rate: drop --no-stream and "
                         "--find-max")


async def run(cfg: Any, ep: Endpoint, reqs: list[Any], http: Any, counter: Any) -> tuple[Point, dict[str, Any]]:
    """One LoadGen server run through the client; the point of its requests and LoadGen's figures."""
    import mlperf_loadgen as lg

    from dlscale.infer.loadgen_sut import Responses

    responses = Responses(lg)  # response objects made once and reused, as infer's LoadGen SUT does
    loop = asyncio.get_running_loop()
    slo = cfg.slo_bounds
    pt = Point("rate", cfg.rates[0])
    pending: list[asyncio.Future] = []
    numbers = itertools.count()

    async def one(q: Any, issued: float) -> None:
        req = reqs[q.index % len(reqs)]
        first = []

        def on_first() -> None:
            first.append(True)
            responses.first_token([q.id])

        r: Result = await send(http, ep, next(numbers), req.prompt, req.output_len, cfg.timeout, counter, on_first)
        r.scheduled = issued  # when LoadGen issued it: the lag is this loop's delay in sending it
        r.prompt_tokens = r.prompt_tokens if r.prompt_tokens is not None else req.prompt_tokens
        pt.results.append(r)
        if not first:
            responses.first_token([q.id])
        responses.complete([q.id], [max(2, r.output_tokens or 0)])

    def issue(queries: list[Any]) -> None:  # LoadGen's thread
        now = time.perf_counter()
        for q in queries:
            pending.append(asyncio.run_coroutine_threadsafe(one(q, now), loop))

    with tempfile.TemporaryDirectory(prefix="dlscale-serve-loadgen-") as tmp:
        log = lg.LogSettings()
        out = lg.LogOutputSettings()
        out.outdir, out.copy_summary_to_stdout, out.copy_detail_to_stdout = tmp, False, False
        log.log_output = out
        sut = lg.ConstructSUT(issue, lambda: None)
        qsl = lg.ConstructQSL(len(reqs), len(reqs), lambda _i: None, lambda _i: None)
        ts = settings(lg, cfg.rates[0], slo.ttft_s, slo.tpot_s, cfg.requests, cfg.duration)
        pt.start = time.perf_counter()
        try:
            await loop.run_in_executor(None, lg.StartTestWithLogSettings, sut, qsl, ts, log)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        pt.stop = time.perf_counter()
        pt.planned = len(pending)
        summary = (Path(tmp) / "mlperf_log_summary.txt").read_text()
        errors = [line for line in (Path(tmp) / "mlperf_log_detail.txt").read_text().splitlines()
                  if '"error' in line.lower()]
    return pt, {"summary": summary, "errors": errors[:20], **read_summary(summary)}


def read_summary(text: str) -> dict[str, Any]:
    """LoadGen's token-latency figures from its server summary: result, rates, p99 TTFT and TPOT (s),
    and each early-stopping verdict."""
    from dlscale.infer.loadgen_log import summary_fields

    fields = summary_fields(text)
    metrics: dict[str, Any] = {"mlperf_result": fields.get("Result is")}
    units: dict[str, str] = {}
    metrics["mlperf_valid"] = metrics["mlperf_result"] == "VALID"
    for key, (name, unit, scale) in _SUMMARY.items():
        if key in fields:
            try:
                metrics[name], units[name] = float(fields[key]) * scale, unit
            except ValueError:
                pass
    for key, val in fields.items():
        m = re.match(r"^99\.00 percentile (first token|time to output token)(?: latency)? \(ns\)$", key)
        if m:
            name, unit = _P99[m.group(1)]
            metrics[name], units[name] = float(val) / NS, unit
    for which in ("TTFT", "TPOT"):
        said = " ".join(_block(text, f"{which} Early Stopping Result:"))
        if said:
            metrics[f"mlperf_{which.lower()}_early_stopping"] = said
    return {"metrics": metrics, "units": units}


def _block(text: str, header: str) -> list[str]:
    """The indented lines under ``header`` in LoadGen's summary, their bullets stripped."""
    lines = text.splitlines()
    if header not in lines:
        return []
    out = []
    for line in lines[lines.index(header) + 1:]:
        if not line.strip() or not line.startswith((" ", "*")):
            break
        out.append(line.strip(" *"))
    return out
