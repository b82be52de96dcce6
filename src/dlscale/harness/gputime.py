"""GPU timing, written once for every caller (the short test's and inference's timed loop, decode's
generations, micro's cases, the collectives' windows), as nvbench times GPU work:

- ``Marks``: points along one stream of work. On CUDA its events are made up front (``grow`` adds more,
  still before the timing that uses them) and recorded on the current stream; ``spans()`` synchronises
  the device once and reads the seconds between consecutive marks. On the CPU a host clock is read.
- ``calibrate``: K, the calls per window, so that a window lasts at least ``TARGET_WINDOW_S`` (1 ms):
  a window of K calls is timed, K grows by the ratio to the target, the K that reaches it is kept.
- ``timed_windows``: windows back to back between consecutive marks, one synchronise after the last.
- ``TorchCuda.capture``: calls captured into a CUDA graph after a warm-up on a side stream (PyTorch's
  graph recipe); a window (or a decode step) is then one replay.

Every CUDA call goes through ``TorchCuda`` (one device), so tests drive the callers with a fake
(tests/fakes_gpu.FakeTimingCuda).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

TARGET_WINDOW_S = 1e-3  # a window lasts at least this long
MAX_WINDOWS = 2000  # with a target duration: windows of at least target / this (events made: one more)
MAX_CALLS = 1 << 14  # calls per window at most (a 60 ns call would need more)
CALIBRATION_ROUNDS = 6  # windows tried while finding K
CAPTURE_LOCK = threading.Lock()  # one CUDA graph capture at a time in the process (TorchCuda.capture)


class TorchCuda:
    """The CUDA calls the timing makes, on one device (tests pass a fake with the same methods)."""

    def __init__(self, device: Any = None):
        self.device = device

    def scope(self) -> Any:
        import torch

        return torch.cuda.device(self.device)

    def event(self) -> Any:
        import torch

        return torch.cuda.Event(enable_timing=True)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def allocated(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated(self.device))

    def l2_bytes(self) -> int | None:
        import torch

        return getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", None) or None

    def capture(self, calls: Callable[[], None], warmup: int = 1,
                error_mode: str = "thread_local") -> Callable[[], None]:
        """``calls`` run ``warmup`` times on a side stream, then captured into a CUDA graph; returns its
        replay, which runs on the current stream.

        One capture at a time in the process (``CAPTURE_LOCK``; entering a capture synchronises and
        empties torch's cache). ``thread_local`` (micro's every-device cases: a thread per GPU): the other
        threads' allocations and synchronisations on their own GPUs neither fail nor spoil it;
        ``global`` is torch's default (CUDA's stream-capture modes)."""
        import torch

        with CAPTURE_LOCK:
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    calls()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode=error_mode):
                calls()
        return graph.replay


def cuda_api(device: Any) -> TorchCuda | None:
    """A CUDA device's calls, or None for a device that is timed on the host clock."""
    return TorchCuda(device) if getattr(device, "type", "cpu") == "cuda" else None


class Marks:
    """``mark()`` up to ``n`` times (``grow`` makes room for more), then ``spans()``: the seconds between
    consecutive marks. ``api`` (TorchCuda or a fake): events made here, before any work, and one device
    synchronise in ``spans()``; None: ``clock`` (``time.perf_counter``; a test injects one) read at
    each mark. ``restart()`` reuses the same events for the next run."""

    def __init__(self, api: Any, n: int, clock: Callable[[], float] = time.perf_counter):
        self.api, self._clock = api, clock
        self._events: list[Any] = []
        self._at: list[Any] = []
        self.grow(n)

    def grow(self, n: int) -> None:
        """Room for ``n`` marks in all (events made now, never while timing)."""
        more = max(0, n - len(self._events))
        self._events += [self.api.event() if self.api is not None else None for _ in range(more)]

    @property
    def size(self) -> int:
        return len(self._events)

    def restart(self) -> None:
        self._at = []

    def mark(self) -> None:
        i = len(self._at)
        if i == len(self._events):
            raise RuntimeError(f"more than the {len(self._events)} marks it was made for")
        if self.api is not None:
            self._events[i].record()
            self._at.append(self._events[i])
        else:
            self._at.append(self._clock())

    @property
    def count(self) -> int:
        """Marks made since the last restart."""
        return len(self._at)

    def spans(self, synced: Callable[[], None] | None = None) -> list[float]:
        """Seconds between consecutive marks (one device synchronise with events); ``synced`` runs right
        after that synchronise (on the CPU: right away), before the spans are read."""
        if self.api is not None:
            self.api.synchronize()
        if synced is not None:
            synced()
        if self.api is not None:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._at, self._at[1:])]
        return [b - a for a, b in zip(self._at, self._at[1:])]

    def time(self, run: Callable[[], Any]) -> float:
        """Seconds of one ``run()`` between the first two marks, then the synchronise."""
        self.restart()
        self.mark()
        run()
        self.mark()
        return self.spans()[0]


def timed_windows(marks: Marks, run: Callable[[], Any], windows: int, begin: Callable[[], None] | None = None,
                  during: Callable[[], None] | None = None, end: Callable[[], None] | None = None) -> list[float]:
    """Seconds of each of ``windows`` back-to-back ``run()`` calls, window i between marks i and i+1
    (``marks`` was grown to ``windows + 1`` before the caller's synchronise). ``begin`` runs just before
    the first mark, ``during`` after the last window is queued, before the one synchronise, ``end`` right
    after it (an energy meter's windows: ``begin`` and ``end``)."""
    if marks.size < windows + 1:
        raise RuntimeError(f"{windows} windows need {windows + 1} marks made before the timing; there are {marks.size}")
    marks.restart()
    if begin is not None:
        begin()
    marks.mark()
    for _ in range(windows):
        run()
        marks.mark()
    if during is not None:
        during()
    return marks.spans(end)


def next_calls(calls: int, window_s: float, step: int = 1, target_s: float = TARGET_WINDOW_S,
               most: int = MAX_CALLS) -> int:
    """The calls for the next calibration window: ``calls · target / window`` with 10% to spare, at
    least ``calls + step``, a multiple of ``step``, at most ``most`` (rounded down to a multiple of step)."""
    want = math.ceil(calls * target_s / window_s * 1.1 - 1e-9) if window_s > 0 else calls * 16
    want = max(calls + step, want)
    want = -(-want // step) * step
    return max(step, min(want, most // step * step))


def calibrate(window: Callable[[int], float], step: int = 1, target_s: float = TARGET_WINDOW_S,
              most: int = MAX_CALLS) -> tuple[int, list[list[float]]]:
    """K, the calls per window, from timing windows of growing K (``window(k)`` → seconds): the
    first K whose window reaches ``target_s`` (or ``most``, or the last tried)."""
    calls, tried = step, []
    for _ in range(CALIBRATION_ROUNDS):
        secs = window(calls)
        tried.append([calls, secs])
        if secs >= target_s or calls >= most // step * step:
            break
        calls = next_calls(calls, secs, step, target_s, most)
    return int(tried[-1][0]), tried


def window_target(window: Any, most: int = MAX_WINDOWS) -> float:
    """The least length of one window: 1 ms, or with a target duration 1/``most`` of it, so that a long
    target lengthens the windows (more calls each) rather than multiplying them past ``most`` windows."""
    target = getattr(window, "target_s", None)
    return max(TARGET_WINDOW_S, target / most) if target else TARGET_WINDOW_S
