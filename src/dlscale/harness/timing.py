"""The timed loop: warm-up steps not counted, then measured steps timed one by one.

On CUDA each step is bracketed by CUDA events recorded on the stream, so timing does not stall
the GPU pipeline; the device is synchronised once before the window opens and once after it
closes. On CPU, kernels run synchronously and ``time.perf_counter`` marks step boundaries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

StepCallback = Callable[[str, int, int], None]  # (phase, steps done, phase total)


class StepClock:
    """Marks step boundaries; ``step_times()`` returns seconds per step after the window."""

    def __init__(self, device: Any):
        self.device = device
        self._cuda = getattr(device, "type", "cpu") == "cuda"
        self._marks: list[Any] = []

    def mark(self) -> None:
        if self._cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(time.perf_counter())

    def step_times(self) -> list[float]:
        if self._cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._marks, self._marks[1:])]
        return [b - a for a, b in zip(self._marks, self._marks[1:])]


def timed_loop(
    step: Callable[[], Any],
    warmup_steps: int,
    steps: int,
    device: Any,
    on_step: StepCallback | None = None,
    sync: Callable[[], None] | None = None,
) -> tuple[list[float], list[Any]]:
    """Run ``warmup_steps`` uncounted steps, then ``steps`` timed ones.

    Returns the per-step times (seconds) and what each measured step returned (e.g. the loss,
    left on the device: no per-step host synchronisation). ``sync`` defaults to a device
    synchronise; a distributed caller passes one that also waits for every rank.
    """
    from dlscale.harness.device import synchronize

    sync = sync or (lambda: synchronize(device))
    for i in range(warmup_steps):
        step()
        if on_step:
            on_step("warmup", i + 1, warmup_steps)
    sync()
    clock = StepClock(device)
    outputs: list[Any] = []
    clock.mark()
    for i in range(steps):
        outputs.append(step())
        clock.mark()
        if on_step:
            on_step("measure", i + 1, steps)
    times = clock.step_times()
    sync()
    return times, outputs
