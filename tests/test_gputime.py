"""harness.gputime, the one GPU timing primitive: events made up front, the record/synchronise sequence
around timed windows, calibration, and CUDA graph capture against torch.cuda's API (faked: no GPU here)."""

from __future__ import annotations

import contextlib

import pytest
from fakes_gpu import FakeTimingCuda

from dlscale.harness import gputime

US = 1e-6


def test_marks_make_their_events_before_any_work_and_synchronise_once():
    gpu = FakeTimingCuda()
    marks = gputime.Marks(gpu, 3)
    assert gpu.events_made == 3 and gpu.log == []
    op = gpu.builder(lambda n: 5 * US)()
    for _ in range(2):
        marks.mark()
        op()
    marks.mark()
    assert marks.spans() == pytest.approx([5 * US, 5 * US]) and gpu.syncs == 1
    with pytest.raises(RuntimeError, match="3 marks"):
        marks.mark()
    marks.grow(5)  # room for more: events made now, the first three kept
    assert gpu.events_made == 5 and marks.size == 5
    assert marks.time(op) == pytest.approx(5 * US) and gpu.syncs == 2 and gpu.events_made == 5


def test_timed_windows_keep_the_record_and_synchronise_order():
    """begin, record 0, the windows each closed by its record, during, one synchronise, end: then the spans."""
    gpu = FakeTimingCuda()
    steps: list[str] = []
    real_sync = gpu.synchronize

    def sync() -> None:
        steps.append("sync")
        real_sync()

    gpu.synchronize = sync
    op = gpu.builder(lambda n: 10 * US)()

    def run() -> None:
        steps.append("window")
        op()
        op()

    marks = gputime.Marks(gpu, 4)
    spans = gputime.timed_windows(marks, run, 3, begin=lambda: steps.append("begin"),
                                  during=lambda: steps.append("during"), end=lambda: steps.append("end"))
    assert steps == ["begin", "window", "window", "window", "during", "sync", "end"]
    assert [what for what, _ in gpu.log if what == "record"] == ["record"] * 4
    assert gpu.windows(3) == [[0, 0]] * 3 and spans == pytest.approx([20 * US] * 3)
    with pytest.raises(RuntimeError, match="made before the timing"):
        gputime.timed_windows(gputime.Marks(gpu, 2), run, 3)


def test_marks_on_the_cpu_read_the_host_clock():
    ticks = iter([1.0, 1.5, 4.0])
    marks = gputime.Marks(None, 3, clock=lambda: next(ticks))
    for _ in range(3):
        marks.mark()
    assert marks.spans() == [0.5, 2.5]
    assert gputime.cuda_api(None) is None and isinstance(gputime.cuda_api(_Device("cuda")), gputime.TorchCuda)


class _Device:
    def __init__(self, type: str):
        self.type = type


class _FakeGraphs:
    """torch.cuda's stream and graph API, logging what capture does in order."""

    def __init__(self):
        self.log: list[tuple] = []
        graphs = self

        class Stream:
            def __init__(self, device=None):
                self.name = "side"
                graphs.log.append(("stream", device))

            def wait_stream(self, other) -> None:
                graphs.log.append(("wait", self.name, other.name))

        class Current(Stream):
            def __init__(self):
                self.name = "current"

        class CUDAGraph:
            def replay(self) -> None:
                graphs.log.append(("replay",))

        @contextlib.contextmanager
        def stream(s):
            graphs.log.append(("enter stream", s.name))
            yield
            graphs.log.append(("leave stream", s.name))

        @contextlib.contextmanager
        def graph(g, capture_error_mode="global"):
            graphs.log.append(("capture", capture_error_mode))
            yield
            graphs.log.append(("captured",))

        self.Stream, self.CUDAGraph, self.stream, self.graph = Stream, CUDAGraph, stream, graph
        self.current_stream = lambda device=None: Current()


@pytest.mark.parametrize("warmup, mode", [(1, "thread_local"), (3, "global")])
def test_capture_warms_up_on_a_side_stream_then_captures_once(monkeypatch, warmup, mode):
    import torch

    fake = _FakeGraphs()
    for name in ("Stream", "CUDAGraph", "stream", "graph", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    replay = gputime.TorchCuda("cuda:0").capture(lambda: fake.log.append(("call",)), warmup=warmup, error_mode=mode)
    assert fake.log == [("stream", "cuda:0"), ("wait", "side", "current"), ("enter stream", "side"),
                        *[("call",)] * warmup, ("leave stream", "side"), ("wait", "current", "side"),
                        ("capture", mode), ("call",), ("captured",)]
    replay()
    assert fake.log[-1] == ("replay",) and not gputime.CAPTURE_LOCK.locked()


def test_graph_decoder_captures_through_the_harness(monkeypatch):
    """graph-eager's default capture is harness.gputime's, with decode's warm-up and torch's global mode."""
    from dlscale.infer.decode import GRAPH_WARMUP, GraphDecoder

    seen = []
    monkeypatch.setattr(gputime.TorchCuda, "capture",
                        lambda self, body, warmup=1, error_mode="thread_local": seen.append(
                            (self.device, warmup, error_mode)) or body)
    d = GraphDecoder(model=_Model(), device="cuda:1", output_len=2)
    assert d._capture(lambda: None) is not None and seen == [("cuda:1", GRAPH_WARMUP, "global")]


class _Model:
    def forward(self, ids, past_key_values=None):  # the decoder reads the cache keyword off the signature
        return ids


def test_calibration_reaches_the_target_window():
    k, tried = gputime.calibrate(lambda calls: calls * 7 * US)
    assert k * 7 * US >= gputime.TARGET_WINDOW_S and tried[0][0] == 1 and tried[-1][0] == k
    assert gputime.window_target(None) == gputime.TARGET_WINDOW_S
    assert gputime.window_target(_Target(10.0), most=100) == pytest.approx(0.1)


class _Target:
    def __init__(self, target_s: float):
        self.target_s = target_s
