"""The timed loop: the progress callback stays outside every step's timed interval (CPU and CUDA)."""

from __future__ import annotations

import time

import pytest

from dlscale.harness.timing import StepClock, timed_loop


def test_slow_callback_does_not_inflate_cpu_step_times():
    calls = []

    def slow_progress(phase: str, done: int, total: int) -> None:
        calls.append((phase, done, total))
        time.sleep(0.05)

    times, outs = timed_loop(lambda: 7, warmup_steps=1, steps=4, device=None, on_step=slow_progress,
                             sync=lambda: None)
    assert outs == [7] * 4 and len(times) == 4
    assert calls == [("warmup", 1, 1)] + [("measure", i, 4) for i in range(1, 5)]
    # an empty step takes microseconds; a step time holding the 50 ms callback would be >= 0.05 s
    assert max(times) < 0.02, times


def test_cpu_step_times_still_measure_the_step():
    times, _ = timed_loop(lambda: time.sleep(0.02), warmup_steps=0, steps=3, device=None, sync=lambda: None)
    assert all(0.019 <= t < 0.5 for t in times), times


class _FakeEvent:
    """Stands in for torch.cuda.Event: logs its record and times by the order of records."""

    log: list[str] = []

    def __init__(self, enable_timing: bool = False):
        self.at: int | None = None

    def record(self, stream=None) -> None:
        _FakeEvent.log.append("record")
        self.at = len(_FakeEvent.log)

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return float(end.at - self.at)  # ms: the number of log entries between the two records


def test_cuda_callback_sits_outside_the_event_pair(monkeypatch):
    import torch

    _FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    log = _FakeEvent.log

    times, _ = timed_loop(lambda: log.append("step"), warmup_steps=0, steps=3, device=torch.device("cuda"),
                          on_step=lambda *a: log.append("progress"), sync=lambda: None)
    assert log == ["record", "step", "record", "progress"] * 3
    assert times == pytest.approx([2e-3] * 3)  # each pair brackets its step alone


def test_stop_without_start_is_an_error():
    with pytest.raises(RuntimeError, match="without start"):
        StepClock(None).stop()


def test_mark_clock_spans_tile_the_marks_on_the_cpu():
    from dlscale.harness.timing import MarkClock

    ticks = iter([1.0, 1.5, 1.75, 3.0, 10.0, 10.25])
    clock = MarkClock(None, 4, clock=lambda: next(ticks))
    for _ in range(4):
        clock.mark()
    assert clock.spans() == [0.5, 0.25, 1.25]
    clock.restart()  # the next run reuses the clock
    clock.mark()
    clock.mark()
    assert clock.spans() == [0.25]


def test_mark_clock_makes_its_events_up_front_and_synchronises_once(monkeypatch):
    import torch

    from dlscale.harness.timing import MarkClock

    made, syncs = [], []

    class Event(_FakeEvent):
        def __init__(self, enable_timing: bool = False):
            super().__init__(enable_timing)
            made.append(self)

    _FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    clock = MarkClock(torch.device("cuda"), 3)
    assert len(made) == 3 and _FakeEvent.log == []
    for _ in range(3):
        clock.mark()
        _FakeEvent.log.append("work")
    assert clock.spans() == pytest.approx([2e-3, 2e-3]) and len(syncs) == 1 and len(made) == 3
    with pytest.raises(RuntimeError, match="3 marks"):
        clock.mark()
    with pytest.raises(ValueError):
        MarkClock(None, 1)
