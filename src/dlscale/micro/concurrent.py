"""One case on every GPU of the node at once: a thread per device, whose timed windows open together and
close together, with the node's energy counters read at those two moments (``micro.harness`` runs the
cases a plan groups, ``Case.group``, this way: GEMM and the device copy with ``every_device``).

Each device's thread builds its case, warms it up and calibrates it on its own (its device made current,
its own CUDA events, its device's stream), then waits at a barrier (``Gate.begin``, where a case timed
alone reads its energy meter) until every device is ready; the last to arrive reads the node's counters
and all launch their timed windows. After its last window each waits again (``Gate.end``) and the last
to arrive reads the counters again. A device whose thread fails breaks both barriers, so the others stop
instead of waiting for it, and the first failure is raised.

Why threads, not a process per device (docs/METRICS.md, "Every device at once"): a GEMM window is one
CUDA graph replay of K calls and a device copy's window K launches of calls of 0.1 ms or more, all
queued ahead of the GPU before the one wait at the end, and a CUDA call releases the GIL while it runs,
so one thread keeps its device busy while the others launch. A process per device (the job launcher)
would give each device its own CUDA context and start (seconds each) and need a rendezvous to open the
windows together, for no gain in what is measured.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
BARRIER_TIMEOUT_S = 600.0  # a device not ready this long after the first one is: the run fails, it does not hang


class Gate:
    """The two barriers of a group of devices; ``begin``/``end`` take the place of a meter's in the timing."""

    def __init__(self, n: int, on_open: Callable[[], None] | None = None, on_close: Callable[[], None] | None = None,
                 timeout: float = BARRIER_TIMEOUT_S):
        self._open = threading.Barrier(n, action=on_open, timeout=timeout)
        self._close = threading.Barrier(n, action=on_close, timeout=timeout)

    def begin(self) -> None:
        self._open.wait()

    def end(self) -> None:
        self._close.wait()

    def abort(self) -> None:
        self._open.abort()
        self._close.abort()


def run_together(jobs: Sequence[Callable[[Gate], T]], meter: Any = None,
                 timeout: float = BARRIER_TIMEOUT_S) -> list[T]:
    """Every job (one per device, each given the group's ``Gate``) on its own thread; their results in
    order. ``meter`` (an EnergyMeter over the devices) is begun as the windows open and ended as they
    close. The first job's exception is raised (after every thread has stopped)."""
    gate = Gate(len(jobs), meter.begin if meter is not None else None, meter.end if meter is not None else None,
                timeout)
    results: list[Any] = [None] * len(jobs)
    errors: list[tuple[int, BaseException]] = []

    def run(i: int) -> None:
        try:
            results[i] = jobs[i](gate)
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread below
            errors.append((i, e))
            gate.abort()

    threads = [threading.Thread(target=run, args=(i,), name=f"dlscale-device-{i}") for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        real = [(i, e) for i, e in errors if not isinstance(e, threading.BrokenBarrierError)]
        raise min(real or errors, key=lambda ie: ie[0])[1]
    return results
