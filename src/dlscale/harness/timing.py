"""The timed loop: warm-up steps not counted, then measured steps timed one by one (and MarkClock:
consecutive spans of one stream of work, e.g. a generation's prefill and decode steps, with events made
up front and one synchronise).

Each measured step sits between its own start and end mark, and nothing else does: the progress
callback runs after a step's end mark and before the next step's start mark, so a slow callback
(a progress bar, logging) never lands in a step time. On CUDA the marks are CUDA events made before
the first step (``harness.gputime.Marks``) and recorded on the stream, so timing does not stall the GPU
pipeline; the device is synchronised once before
the window opens and once after it closes. On CPU, kernels run synchronously and
``time.perf_counter`` marks the step boundaries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dlscale.harness.gputime import Marks, cuda_api
from dlscale.harness.window import PROBE_STEPS

StepCallback = Callable[[str, int, int], None]  # (phase, steps done, phase total)


class StepClock:
    """Brackets each step with ``start()``/``stop()``; ``step_times()`` returns seconds per step.

    Its marks are ``harness.gputime.Marks``: on CUDA, ``2 x steps`` events made here, before any step."""

    def __init__(self, device: Any, steps: int = 1):
        self.device = device
        self._marks = Marks(cuda_api(device), 2 * steps, time.perf_counter)

    def start(self) -> None:
        self._marks.grow(self._marks.count + 2)
        self._marks.mark()

    def stop(self) -> None:
        if self._marks.count % 2 == 0:
            raise RuntimeError("StepClock.stop() without start()")
        self._marks.mark()

    def step_times(self) -> list[float]:
        return self._marks.spans()[::2]


def timed_loop(
    step: Callable[[], Any],
    warmup_steps: int,
    steps: int,
    device: Any,
    on_step: StepCallback | None = None,
    sync: Callable[[], None] | None = None,
    meter: Any = None,
    window: Any = None,
) -> tuple[list[float], list[Any]]:
    """Run ``warmup_steps`` uncounted steps, then ``steps`` timed ones.

    Returns the per-step times (seconds) and what each measured step returned (e.g. the loss,
    left on the device: no per-step host synchronisation). ``sync`` defaults to a device
    synchronise; a distributed caller passes one that also waits for every rank. ``on_step``
    runs between steps, outside every timed interval. ``meter`` (harness.energy_meter.EnergyMeter) reads
    its energy counters right after the synchronisation that opens the window and right after the
    one that closes it. ``window`` (harness.window.Window) with a target duration: the last warm-up
    steps (at most ``window.PROBE_STEPS``; one more uncounted step where there is no warm-up) are
    timed between synchronisations, and ``steps`` becomes the count ``window.size`` chooses from them
    (at least ``steps``).
    """
    from dlscale.harness.device import synchronize

    sync = sync or (lambda: synchronize(device))
    probing = window is not None and window.target_s is not None
    probe = max(1, min(PROBE_STEPS, warmup_steps)) if probing else 0
    plain = max(0, warmup_steps - probe)
    for i in range(plain):
        step()
        if on_step:
            on_step("warmup", i + 1, warmup_steps)
    if probing:
        sync()
        t0 = time.perf_counter()
        for i in range(probe):
            step()
        sync()
        steps = window.size(steps, (time.perf_counter() - t0) / probe, probe)
        if on_step:
            for i in range(plain, warmup_steps):
                on_step("warmup", i + 1, warmup_steps)
    sync()
    if meter is not None:
        meter.begin()
    clock = StepClock(device, steps)
    outputs: list[Any] = []
    for i in range(steps):
        clock.start()
        outputs.append(step())
        clock.stop()
        if on_step:
            on_step("measure", i + 1, steps)
    times = clock.step_times()
    sync()
    if meter is not None:
        meter.end()
    return times, outputs


class MarkClock(Marks):
    """Points along one stream of work: ``mark()`` up to ``marks`` times, then ``spans()`` gives the
    seconds between consecutive marks (``harness.gputime.Marks`` on the device's clock).

    On CUDA the marks are events made here, before any work, and recorded on the current stream;
    ``spans()`` synchronises once (so a run of marks costs one host wait, not one per span). On the CPU
    ``clock`` (``time.perf_counter``; a test injects one) is read at each mark. ``restart()`` reuses the
    same events for the next run.
    """

    def __init__(self, device: Any, marks: int, clock: Callable[[], float] = time.perf_counter):
        if marks < 2:
            raise ValueError("a MarkClock needs at least 2 marks (one span)")
        self.device = device
        super().__init__(cuda_api(device), marks, clock)
