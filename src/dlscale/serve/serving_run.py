"""A serving run: the endpoint checked, the client calibrated, warm-up, the load points (a list, or
the search for the highest load meeting the SLOs), each point's energy, and the ``serving`` record.

The warm-up (``warm_up``) sends at least ``--warmup`` requests, for at least ``--warmup-duration``
seconds, and with ``--warmup-until-stable`` rounds of ``WARM_ROUND`` requests until one round's median
speed is within 1.2x of the round before's (``figures.settled``), for at most ``--duration`` seconds;
none of them is counted.

The record's headline figures are those of the answer (the highest load that met the SLOs) where
SLOs are given, else of the highest load measured; ``*_by_point`` lists hold every point in the
order measured; ``raw.points`` every request's timestamps. A server that stops answering during
the run leaves a failed record holding every point measured until then, the partial one included.
"""

from __future__ import annotations

import asyncio
import time
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit

from dlscale.log import info
from dlscale.serve import figures as figs
from dlscale.serve import search
from dlscale.serve.client import Endpoint
from dlscale.serve.config import ServeConfig
from dlscale.serve.outcome import users_of
from dlscale.serve.load import Point, at_concurrency, at_rate, session

WARM_ROUND = 8  # requests of one round of a warm-up until stable


class ServerGone(RuntimeError):
    """The server stopped answering during the run."""


def local(url: str) -> bool:
    """Whether the server runs on this machine (its energy can be read here)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        import socket

        return host in (socket.gethostname(), socket.getfqdn())


def energy_meter(cfg: ServeConfig) -> Any:
    """An EnergyMeter over the server's devices where it runs here: its GPUs (NVML), else this host's CPUs."""
    from dlscale.harness.energy_meter import EnergyMeter
    from dlscale.monitor.energy_counters import DeviceCounters, cpu_counters, gpu_counters
    from dlscale.monitor import nvml

    if not local(cfg.url):
        return EnergyMeter(found=DeviceCounters([], f"no counter: the server at {cfg.url} runs on another machine"))
    nv = nvml.start()
    count = nv.nvmlDeviceGetCount() if nv is not None else 0
    if count:
        found = [gpu_counters(i) for i in range(min(cfg.server_devices, count))]
        missing = [f.reason for f in found if f.reason]
        return EnergyMeter(found=DeviceCounters([c for f in found for c in f.counters], missing[0] if missing else None))
    return EnergyMeter(found=cpu_counters())


class Session:
    """One run's state: the endpoint, its requests, the points measured, the energy of each."""

    def __init__(self, cfg: ServeConfig, ep: Endpoint, reqs: list[Any], counter: Any, meter: Any, http: Any):
        self.cfg, self.ep, self.reqs, self.counter, self.meter, self.http = cfg, ep, reqs, counter, meter, http
        self.points: list[Point] = []
        self.energy: list[dict[str, Any]] = []
        self.pooled: dict[float, list[Any]] = {}

    async def point(self, load: float) -> Point:
        c = self.cfg
        self.meter.begin()
        if c.mode == "rate":
            pt = await at_rate(self.http, self.ep, self.reqs, load, n=c.requests, duration=c.duration, timeout=c.timeout,
                               burstiness=c.burstiness, seed=c.seed + len(self.points), counter=self.counter, cap=c.cap)
        else:  # never more in flight than requests sent (a search's load too: ServeConfig caps the given ones)
            pt = await at_concurrency(self.http, self.ep, self.reqs, min(int(load), c.requests), n=c.requests,
                                      duration=c.duration, timeout=c.timeout, counter=self.counter)
        self.meter.end()
        self.energy.append(self.meter.take(f"point {len(self.points)}"))
        self.points.append(pt)
        f = figs.point_figures(pt.results, c.slo_bounds.bounds(), c.stream, users_of(pt))
        info(f"  {pt.mode} {load:g}: {f['completed']}/{f['requests_sent']} completed in {f['duration_s']:.3g} s, "
             f"{_g(f['output_throughput'])} tokens/s, TTFT p99 {_g(f['ttft_p99_s'])} s, TPOT p99 {_g(f['tpot_p99_s'])} s"
             + (f", errors {f['errors']}" if f["errors"] else ""))
        if pt.server_down:
            raise ServerGone(f"the server at {c.url} stopped answering (connection refused) during {pt.mode} {load:g}: "
                             f"{f['completed']} of {f['requests_sent']} requests of that point completed; the points "
                             "measured until then are recorded")
        return pt

    async def measure(self, load: float, again: bool) -> tuple[dict[str, list[float]], int]:
        """For the search: a point's TTFT and TPOT samples (pooled with the first measurement when ``again``)."""
        pt = await self.point(load)
        results = (self.pooled.get(load, []) if again else []) + pt.results
        self.pooled[load] = results
        each = [figs.per_request(r) for r in results if r.ok]
        return {"ttft": [e["ttft"] for e in each if e["ttft"] is not None],
                "tpot": [e["tpot"] for e in each if e["tpot"] is not None]}, len(self.points) - 1


def _g(x: Any) -> str:
    return "-" if x is None else f"{x:.3g}"


async def _go(cfg: ServeConfig, state: dict[str, Any]) -> None:
    """The run, its state kept in ``state`` as it grows (a failure still has the points measured)."""
    from dlscale.serve import probe, workload
    from dlscale.serve.instant import calibrate

    tokens = workload.load_tokens(cfg.tokenizer, cfg.model)
    reqs = workload.requests_for(cfg, tokens, cfg.requests)
    state.update(tokens=tokens, reqs=reqs)
    async with session() as http:
        ep0 = Endpoint(cfg.base_url, cfg.model, cfg.api, cfg.stream, cfg.key_env)
        ep, found = await probe.check(http, ep0, cfg.timeout, cfg.fixed_output)
        state["probe"] = found
        if cfg.calibrate:
            top = max(cfg.concurrencies) if cfg.mode == "concurrency" else cfg.cap or 16
            mean_out = sum(r.output_len for r in reqs) / len(reqs)
            state["calibration"] = await calibrate(ep, min(64, round(mean_out)), min(top, 256))
        await warm_up(http, ep, reqs, cfg, tokens, state)
        with energy_meter(cfg) as meter:
            s = Session(cfg, ep, reqs, tokens, meter, http)
            state["session"] = s
            bounds = cfg.slo_bounds.bounds()
            if cfg.loadgen:
                from dlscale.serve import mlperf

                meter.begin()
                pt, state["loadgen"] = await mlperf.run(cfg, ep, reqs, http, tokens)
                meter.end()
                s.energy.append(meter.take("loadgen"))
                s.points.append(pt)
            elif cfg.find_max:
                lo, hi = cfg.loads[0], (cfg.loads[-1] if len(cfg.loads) > 1 else None)
                if cfg.mode == "concurrency":  # a search past --requests in flight would measure the same point
                    hi = min(hi or cfg.requests, cfg.requests)
                state["answer"] = await search.find_max(s.measure, bounds, lo, hi, cfg.mode == "concurrency",
                                                        cfg.max_points)
            else:
                for load in cfg.loads:
                    await s.point(load)


async def warm_up(http: Any, ep: Endpoint, reqs: list[Any], cfg: ServeConfig, counter: Any,
                  state: dict[str, Any]) -> None:
    """The warm-up of the module doc, before every point; what it did in ``state["warmup"]``."""
    if not (cfg.warmup or cfg.warmup_duration or cfg.warmup_until_stable):
        return
    top = max(cfg.loads) if cfg.mode == "concurrency" else 1
    size = WARM_ROUND if cfg.warmup_until_stable else max(cfg.warmup, 1)
    t0 = time.perf_counter()
    rounds: list[list[Any]] = []
    stable = None
    while True:
        pt = await at_concurrency(http, ep, reqs, min(size, top), n=size, duration=cfg.duration, timeout=cfg.timeout,
                                  counter=counter)
        rounds.append(pt.results)
        elapsed = time.perf_counter() - t0
        if cfg.warmup_until_stable:
            stable = len(rounds) >= 2 and figs.settled(rounds[-2], rounds[-1], cfg.stream)
        sent = sum(len(r) for r in rounds)
        if pt.server_down or elapsed >= cfg.duration or (
                sent >= cfg.warmup and elapsed >= cfg.warmup_duration and stable is not False):
            break
    every = [r for rs in rounds for r in rs]
    state["warmup_errors"] = [f"{r.error}: {r.detail}" for r in every if not r.ok]
    state["warmup"] = {"requests": len(every), "seconds": round(elapsed, 3), "stable": stable, "rounds": len(rounds)}


def run_serving(cfg: ServeConfig, rec: Any) -> Any:
    """The run's body for ``harness.runner.execute``: an ``Outcome``; a failure keeps what was measured in ``rec``."""
    from dlscale.serve.outcome import build

    state: dict[str, Any] = {}
    try:
        asyncio.run(_go(cfg, state))
    except ServerGone:
        out = build(cfg, state)
        rec.metrics.update(out.metrics)
        rec.units.update(out.units)
        rec.raw.update(out.raw)
        raise
    out = build(cfg, state)
    if not out.metrics.get("completed_total"):
        errors = out.raw.get("errors_total") or {}
        rec.raw.update(out.raw)
        raise RuntimeError("no request completed (" + ", ".join(f"{k}: {v}" for k, v in errors.items()) + ")")
    return out
