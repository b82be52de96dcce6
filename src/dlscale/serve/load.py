"""Load as the field generates it: arrivals at a rate (Poisson, or gamma for burstiness), with or without a
cap in flight, or a fixed concurrency.

One asyncio loop sends every request, so hundreds in flight cost one core. A load point is bounded
twice: no more than ``requests`` requests and no request sent after ``duration`` seconds (those in
flight then finish under their own timeout). Each result keeps when the generator meant to send it
(``scheduled``): the arrival time of the schedule at a rate, the moment a slot freed at a
concurrency; ``sent - scheduled`` is the generator's lag behind its schedule. At a rate with a cap in
flight (vLLM's ``--max-concurrency``), an arrival that finds the cap reached waits for a slot: its
``arrival`` is the schedule's time, its ``scheduled`` the moment the slot freed (``scheduled - arrival``
its wait in the client's queue, apart from the lag); arrivals stop at ``duration``, those waiting then
are still sent. A request that cannot connect stops the point: the server is gone and sending more
would only count refusals.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from dlscale.serve.client import Endpoint, Result, send
from dlscale.serve.workload import Request


def arrivals(rate: float, burstiness: float, n: int, seed: int) -> list[float]:
    """Offsets (s) of ``n`` arrivals: gamma inter-arrival times of mean 1/rate and shape ``burstiness``
    (1: exponential, a Poisson process; < 1 burstier, > 1 more regular); all at 0 for an infinite rate."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        out.append(t)
    return out


@dataclass
class Point:
    """One load point's requests and its window."""

    mode: str
    load: float
    results: list[Result] = field(default_factory=list)
    cap: int | None = None  # at a rate: the cap in flight (None: none)
    start: float = 0.0
    stop: float = 0.0
    planned: int = 0
    stopped_by: str = "requests"  # requests | duration | server_down

    @property
    def server_down(self) -> bool:
        return self.stopped_by == "server_down"


class _Sender:
    def __init__(self, session: Any, ep: Endpoint, reqs: list[Request], timeout: float, counter: Any):
        self.session, self.ep, self.reqs, self.timeout, self.counter = session, ep, reqs, timeout, counter
        self.down = asyncio.Event()

    async def one(self, i: int, scheduled: float) -> Result:
        req = self.reqs[i % len(self.reqs)]
        r = await send(self.session, self.ep, i, req.prompt, req.output_len, self.timeout, self.counter)
        r.scheduled = scheduled
        if r.prompt_tokens is None:
            r.prompt_tokens = req.prompt_tokens
        if r.error == "connect":
            self.down.set()
        return r


async def at_rate(session: Any, ep: Endpoint, reqs: list[Request], rate: float, *, n: int, duration: float,
                  timeout: float, burstiness: float = 1.0, seed: int = 0, counter: Any = None,
                  cap: int | None = None) -> Point:
    """``n`` requests arriving at ``rate`` per second (gamma inter-arrival times), at most ``duration`` s of
    arrivals; with ``cap``, at most that many in flight (an arrival past it waits for a slot)."""
    s = _Sender(session, ep, reqs, timeout, counter)
    pt = Point("rate", rate, planned=n, cap=cap)
    slots = asyncio.Semaphore(cap) if cap else None

    async def capped(i: int, due: float) -> Result:
        waits = slots.locked()
        async with slots:
            r = await s.one(i, time.perf_counter() if waits else due)
        r.arrival = due
        return r

    pt.start = time.perf_counter()
    deadline = pt.start + duration
    tasks = []
    for i, off in enumerate(arrivals(rate, burstiness, n, seed)):
        due = pt.start + off
        if due > deadline:
            pt.stopped_by = "duration"
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if s.down.is_set():
            pt.stopped_by = "server_down"
            break
        tasks.append(asyncio.create_task(capped(i, due) if slots else s.one(i, due)))
    pt.results = list(await asyncio.gather(*tasks))
    if s.down.is_set():
        pt.stopped_by = "server_down"
    pt.stop = time.perf_counter()
    return pt


async def at_concurrency(session: Any, ep: Endpoint, reqs: list[Request], concurrency: int, *, n: int,
                         duration: float, timeout: float, counter: Any = None) -> Point:
    """``n`` requests with ``concurrency`` in flight: each slot sends its next request when its last ends."""
    s = _Sender(session, ep, reqs, timeout, counter)
    pt = Point("concurrency", concurrency, planned=n)
    pt.start = time.perf_counter()
    deadline = pt.start + duration
    taken = iter(range(n))
    results: list[Result] = []

    async def slot() -> None:
        for i in taken:
            ready = time.perf_counter()
            if ready > deadline:
                pt.stopped_by = "duration"
                return
            if s.down.is_set():
                return
            results.append(await s.one(i, ready))

    await asyncio.gather(*(slot() for _ in range(min(concurrency, n))))
    if s.down.is_set():
        pt.stopped_by = "server_down"
    pt.results = sorted(results, key=lambda r: r.index)
    pt.stop = time.perf_counter()
    return pt


def session(limit: int = 0) -> Any:
    """An aiohttp session with no cap on connections (the load, not the pool, decides what is in flight)."""
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=aiohttp.ClientTimeout(total=None))
