"""How the micro harness times a case on a CUDA device, as nvbench and cuBLASLt's benchmarks do.

- Events: ``reps + 1`` CUDA events are made once, before anything is timed, and recorded back to
  back on the device's current stream: window i lies between events i and i+1, so the device is
  synchronised once, after the last window, and no event is made inside the loop.
- Calls per window: a window holds K back-to-back calls, K chosen by calibration so that a window
  lasts at least ``TARGET_WINDOW_S`` (1 ms): a window of K calls is timed, K grows by the ratio
  to the target, and the K that reaches it is kept (the row records K and the calibration). One
  call's host launch jitter (microseconds) is then a small part of every window.
- CUDA graph: where a case says its call can be captured, the K calls are captured once into a
  CUDA graph and a window is one replay of it, so no host launch gap sits between the calls; where
  the capture fails the calls are launched one by one and the row says why (``graph_error``).
- Cache: ``hot`` (default) calls the same operands over and over, as a training step does.
  ``cold`` builds the case's operands several times over, enough copies that together they are at
  least twice the GPU's L2 (``L2_cache_size``), and each call uses the next copy in turn, so no
  call finds its operands in L2; nothing is flushed inside a window.
- Samples: one per window, the window's time / K (seconds per call). The harness reports their
  median (docs/METRICS.md, "Microbenchmarks").
- Windows: ``reps``, or with a target duration (``--min-duration``) as many as the last calibration
  window, the probe, says the target needs (``harness.window``); the row keeps how (``sizing``).

The events, the calibration, the timed windows and the capture are ``harness.gputime``'s; this module
adds the operands (hot or cold cache) and the row. Every CUDA call goes through ``TorchCuda`` (one
device), so tests drive this module with a fake.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlscale.harness.gputime import (MAX_CALLS, MAX_WINDOWS, TARGET_WINDOW_S, Marks, TorchCuda, calibrate,  # noqa: F401
                                     next_calls, timed_windows, window_target)

ROTATE_L2 = 2  # cold cache: the operand copies together hold at least this many L2 sizes
MAX_COPIES = 4096
ASSUMED_L2 = 256 * 2**20  # where the device properties have no L2 size: above any GPU's L2 today
CACHES = ("hot", "cold")


API: Callable[[Any], Any] = TorchCuda  # how a device's CUDA calls are made (tests swap in a fake)


@dataclass
class Windows:
    """A case's timed windows on a GPU and how they were made."""

    per_call_s: list[float]  # one sample per window: its time / calls
    calls: int  # K: calls per window
    method: str  # "cuda-graph" (one replay of K captured calls) or "cuda-events" (K launches)
    cache: str
    copies: int = 1  # operand copies the calls rotate through (cold cache)
    l2_bytes: int | None = None
    l2_source: str = ""
    rotation_bytes: int | None = None  # device memory of all the copies together (cold cache)
    graph_error: str | None = None
    calibration: list[list[float]] = field(default_factory=list)  # [[K, window seconds], ...]
    clock: dict[str, Any] = field(default_factory=dict)  # monitor.clocks.summarize of the case's samples
    sizing: dict[str, Any] | None = None  # how the window count was chosen (harness.window), with a target

    @property
    def total_calls(self) -> int:
        return self.calls * len(self.per_call_s)

    def row(self) -> dict[str, Any]:
        """The row's timing columns (docs/METRICS.md)."""
        from dlscale import stats

        out: dict[str, Any] = {"timing": self.method, "calls_per_window": self.calls,
                               "window_us": stats.percentile(self.per_call_s, 50) * self.calls * 1e6,
                               "cache": self.cache, "calibration": self.calibration}
        if self.cache == "cold":
            out.update(operand_copies=self.copies, rotation_bytes=self.rotation_bytes, l2_bytes=self.l2_bytes,
                       l2_source=self.l2_source)
        if self.graph_error:
            out["graph_error"] = self.graph_error
        if self.sizing:
            out["sizing"] = self.sizing
        return {**out, **self.clock}


def operands(build: Callable[[], Callable[[], Any]], cache: str, api: Any) -> tuple[list[Callable[[], Any]], dict[str, Any]]:
    """The ops the calls rotate through: one (hot), or enough copies that they fill ``ROTATE_L2``
    L2 sizes (cold; a copy's size is the device memory its build allocated)."""
    if cache == "hot":
        return [build()], {}
    before = api.allocated()
    ops = [build()]
    footprint = api.allocated() - before
    if footprint <= 0:
        raise RuntimeError("--cache cold: building the case allocated no device memory, so there is nothing to rotate")
    l2 = api.l2_bytes()
    source = "device properties" if l2 else f"assumed {ASSUMED_L2 // 2**20} MiB (the device properties have none)"
    l2 = l2 or ASSUMED_L2
    copies = min(MAX_COPIES, max(2, math.ceil(ROTATE_L2 * l2 / footprint)))
    ops += [build() for _ in range(copies - 1)]
    return ops, {"copies": copies, "l2_bytes": l2, "l2_source": source, "rotation_bytes": copies * footprint}


def _runner(ops: list[Callable[[], Any]], calls: int) -> Callable[[], None]:
    n = len(ops)

    def run() -> None:
        for j in range(calls):
            ops[j % n]()

    return run


def time_case(build: Callable[[], Callable[[], Any]], device: Any, warmup: int, reps: int, cache: str = "hot",
              capture: bool = False, meter: Any = None, clocks: Any = None, api: Any = None,
              window: Any = None) -> Windows:
    """Time ``reps`` windows of K calls of the case ``build`` makes (see the module's text).

    ``meter`` (an EnergyMeter) is read where the timed windows start and after they end; ``clocks``
    (monitor.clocks.GpuClocks) is sampled while they run. ``window`` (harness.window.Window) with a
    target duration: the windows are as many as the last calibration window (the probe) says the target
    needs, never fewer than ``reps``.
    """
    api = api if api is not None else API(device)
    with api.scope():
        ops, rot = operands(build, cache, api)
        for i in range(warmup):
            ops[i % len(ops)]()
        api.synchronize()
        marks = Marks(api, 2)  # the calibration's pair, then window 0's edges
        run, calls, method, tried, graph_error = _calibrated(ops, capture, api, marks, window_target(window, MAX_WINDOWS))
        if window is not None:
            reps = window.size(reps, tried[-1][1])
        marks.grow(reps + 1)  # made once, before anything is timed
        api.synchronize()
        sample: list[Any] = []
        spans = timed_windows(marks, run, reps, begin=meter.begin if meter is not None else None,
                              during=(lambda: sample.append(clocks.sample())) if clocks is not None else None,
                              end=meter.end if meter is not None else None)
        per_call = [t / calls for t in spans]
    from dlscale.monitor.clocks import summarize

    return Windows(per_call, calls, method, cache, rot.get("copies", 1), rot.get("l2_bytes"), rot.get("l2_source", ""),
                   rot.get("rotation_bytes"), graph_error, tried, summarize(sample) if sample else {},
                   window.last if window is not None else None)


def _calibrated(ops: list[Callable[[], Any]], capture: bool, api: Any, marks: Marks,
                target_s: float = TARGET_WINDOW_S) -> tuple[Callable[[], None], int, str, list[list[float]], str | None]:
    """(one window's run, K, method, the calibration tried, why the graph failed or None)."""
    made: dict[int, Callable[[], None]] = {}

    def make(calls: int, graph: bool) -> Callable[[], None]:
        if calls not in made:
            made.clear()  # one graph alive at a time
            made[calls] = api.capture(_runner(ops, calls)) if graph else _runner(ops, calls)
        return made[calls]

    def window(graph: bool) -> Callable[[int], float]:
        def timed(calls: int) -> float:
            run = make(calls, graph)
            run()  # untimed: a graph's first replay uploads it
            return marks.time(run)

        return timed

    step = len(ops)  # cold: every window starts at the first copy and goes through all of them
    if capture:
        try:
            calls, tried = calibrate(window(True), step, target_s)
            return make(calls, True), calls, "cuda-graph", tried, None
        except Exception as e:  # noqa: BLE001 - a call the graph cannot hold is launched one by one instead
            made.clear()
            error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
            api.synchronize()
    else:
        error = None
    calls, tried = calibrate(window(False), step, target_s)
    return make(calls, False), calls, "cuda-events", tried, error
