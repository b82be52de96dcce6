"""infer.feed: samples held once in the model's input dtype and layout, batches gathered by index;
on a GPU (driven here by a fake ``torch.cuda`` whose names are checked against the real module) a
side stream's copies, per-batch events, four batches in flight, padded batch shapes warmed on their
thread, and completion off the issuing thread."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from conftest import requires_cuda

torch = pytest.importorskip("torch")

from dlscale.errors import UsageError  # noqa: E402
from dlscale.infer.config import InferConfig  # noqa: E402
from dlscale.infer.feed import GPU_SLOTS, Completer, Feed, SampleStore  # noqa: E402

CPU = torch.device("cpu")


def session_of(model: str = "tinycnn", **kw: Any):
    from dlscale.infer.session import open_session

    return open_session(InferConfig(model, batch_sizes="4", device="cpu", **kw).resolve("cpu"), CPU)


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_store_is_one_preallocated_tensor_of_the_models_input_dtype_and_layout(precision, dtype):
    s = session_of(precision=precision)
    store = SampleStore(s, 8)
    store.load([3, 0, 1, 2])
    store.load(range(4, 8))  # a second load fills rows of the same tensor
    (images,) = store.parts
    assert images.shape == (8, 3, 32, 32) and images.dtype == dtype
    assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()  # NHWC, as the CPU run
    assert store.nbytes == 8 * 3 * 32 * 32 * images.element_size() and store.where == "device"
    ptr = images.data_ptr()
    feed = Feed(s, store, 4)
    batch = feed.batch([5, 1, 5, 7])
    assert batch.data_ptr() == feed.slots[0].batch[0].data_ptr()  # gathered into the slot's buffer
    assert batch.is_contiguous(memory_format=torch.channels_last)
    want = torch.stack([s.sample(i) for i in (5, 1, 5, 7)]).to(dtype)
    assert torch.equal(batch, want)
    feed.run([2, 4])  # a short batch runs from the same buffers
    assert store.parts[0].data_ptr() == ptr
    store.unload(range(8))
    assert store.parts is None and store.nbytes == 0


def test_a_family_of_several_inputs_holds_one_tensor_per_input():
    s = session_of("transformer_tiny", seq_len=8)
    store = SampleStore(s, 4)
    store.load(range(4))
    assert len(store.parts) == 4 and [p.shape[0] for p in store.parts] == [4] * 4
    assert store.parts[0].dtype == torch.long and store.parts[2].dtype == torch.bool  # ids and pad masks as made
    src, tgt, _, _ = Feed(s, store, 2).batch([3, 1])
    assert torch.equal(src, torch.stack([s.sample(3)[0], s.sample(1)[0]])) and tgt.shape == (2, 8)


def test_samples_on_is_validated_resolved_and_recorded(tmp_path):
    with pytest.raises(UsageError) as e:
        InferConfig("tinycnn", samples_on="gpu")
    assert "--samples-on" in str(e.value) and "device, host" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UsageError, match="onnxruntime reads its inputs from host arrays"):
        InferConfig("tinycnn", runtime="onnxruntime", samples_on="device")
    assert InferConfig("tinycnn").resolve("cpu").samples_on == "device"
    assert InferConfig("tinycnn", runtime="onnxruntime").resolve("cpu").samples_on == "host"
    assert InferConfig("tinycnn", samples_on="host").resolve("cpu").samples_on == "host"


def test_cli_refuses_a_bad_samples_on_in_one_line(cli):
    res = cli("infer", "tinycnn", "--samples-on", "gpu")
    assert res.code == 2 and "--samples-on" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kw, option", [({"batch_timeout": -1.0, "scenario": "server"}, "--batch-timeout"),
                                        ({"batch_timeout": 0.01, "scenario": "offline"}, "--batch-timeout"),
                                        ({"scenario_runs": 0, "scenario": "offline"}, "--scenario-runs"),
                                        ({"scenario_runs": 3}, "--scenario-runs"),
                                        ({"scenario_runs": 2, "scenario": "server", "find_peak": True}, "--scenario-runs")])
def test_loadgen_options_are_validated(kw, option):
    with pytest.raises(UsageError) as e:
        InferConfig("tinycnn", **kw)
    assert option in str(e.value) and "\n" not in str(e.value)


# -- the GPU path, on a fake torch.cuda ---------------------------------------------------------------

class Log:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def add(self, *what: Any) -> None:
        with self.lock:
            self.calls.append((*what, threading.current_thread().name))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeEvent:
    ids = itertools.count()

    def __init__(self, log: Log, **_: Any) -> None:
        self.log, self.id = log, next(self.ids)

    def record(self, stream: Any = None) -> None:
        self.log.add("record", self.id, stream.name if stream else "current")

    def synchronize(self) -> None:
        self.log.add("event.synchronize", self.id)

    def query(self) -> bool:
        self.log.add("event.query", self.id)
        return False  # not yet: the device is still computing


class FakeStream:
    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name

    def wait_event(self, ev: FakeEvent) -> None:
        self.log.add("wait_event", self.name, ev.id)

    def synchronize(self) -> None:
        self.log.add("stream.synchronize", self.name)


def fake_streams(monkeypatch: Any) -> Log:
    """torch.cuda's streams, events and pinned memory, faked on the CPU: every call is logged; a
    device-wide synchronise is logged as such. Fails if a faked name is not in the real torch.cuda."""
    import contextlib

    log = Log()
    for name in ("Stream", "Event", "current_stream", "stream", "synchronize"):
        assert hasattr(torch.cuda, name), f"torch.cuda.{name} is gone: the fake would test an API that does not exist"
    for cls, name in ((torch.cuda.Event, "record"), (torch.cuda.Event, "synchronize"), (torch.cuda.Event, "query"),
                      (torch.cuda.Stream, "wait_event")):
        assert hasattr(cls, name)

    @contextlib.contextmanager
    def stream(s: FakeStream):
        log.add("enter", s.name)
        yield
        log.add("exit", s.name)

    real_empty = torch.empty

    def empty(*args: Any, pin_memory: bool = False, device: Any = None, **kw: Any) -> Any:
        if pin_memory:
            log.add("pinned")
        return real_empty(*args, **kw)

    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: FakeEvent(log, **kw))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream(log, "side"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream(log, "compute"))
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.add("device.synchronize"))
    monkeypatch.setattr(torch, "empty", empty)
    return log


class CudaSession:
    """The Session contract on a (fake) CUDA device: sample i is the row [i, i]; the forward logs the rows it got."""

    model, sample_unit, runtime, precision, channels_last = "fake", "images", "torch", "fp32", False

    def __init__(self, log: Log, samples_on: str) -> None:
        self.log, self.samples_on, self.device = log, samples_on, torch.device("cuda", 0)

    def stored(self, index: int) -> tuple:
        return (torch.full((2,), float(index)),)

    def inputs(self, parts: tuple) -> Any:
        return parts[0]

    def forward(self, batch: Any) -> Any:
        self.log.add("forward", [int(v) for v in batch[:, 0]])
        return batch

    def synchronize(self) -> None:
        self.log.add("device.synchronize")


def fed(monkeypatch: Any, samples_on: str) -> tuple[Log, Feed]:
    log = fake_streams(monkeypatch)
    s = CudaSession(log, samples_on)
    store = SampleStore(s, 6)
    store.load(range(6))
    return log, Feed(s, store, 4)


def test_samples_on_the_host_are_copied_on_a_side_stream_the_forward_waits_for(monkeypatch):
    log, feed = fed(monkeypatch, "host")
    assert feed.store.pinned and not feed.store.on_gpu and log.names().count("pinned") == 1 + GPU_SLOTS  # store + staging
    log.calls.clear()
    ticket = feed.launch([4, 1, 1])
    copied, done = feed.slots[ticket.slot].copied.id, ticket.done.id
    got = [c[:-1] for c in log.calls]  # what was called, without the thread
    assert got == [("enter", "side"), ("record", copied, "side"), ("exit", "side"), ("wait_event", "compute", copied),
                   ("forward", [4, 1, 1]), ("record", done, "compute")]
    feed.finish(ticket)
    assert log.calls[-1][:2] == ("event.synchronize", done) and "device.synchronize" not in log.names()


def test_samples_on_the_device_are_gathered_there_with_no_device_wide_synchronise(monkeypatch):
    log, feed = fed(monkeypatch, "device")
    assert feed.store.on_gpu and feed.copy_stream is None
    log.calls.clear()
    tickets = [feed.launch([5, 0]), feed.launch([2, 3, 4, 1])]
    assert [c[1] for c in log.calls if c[0] == "forward"] == [[5, 0], [2, 3, 4, 1]]
    assert [c[2] for c in log.calls if c[0] == "record"] == ["compute", "compute"]
    for t in tickets:
        feed.finish(t)
    assert "device.synchronize" not in log.names() and "enter" not in log.names()  # no side stream, no device sync


def test_gpu_slots_in_flight_then_launch_waits_for_one_to_finish(monkeypatch):
    log, feed = fed(monkeypatch, "host")
    assert len(feed.slots) == GPU_SLOTS >= 3  # the host may run batches ahead of the device, not only one
    flying = [feed.launch([k]) for k in range(GPU_SLOTS)]
    more: list[Any] = []
    t = threading.Thread(target=lambda: more.append(feed.launch([5])))
    t.start()
    time.sleep(0.2)
    assert not more and log.names().count("forward") == GPU_SLOTS  # every slot busy: the next batch waits
    feed.finish(flying[0])
    t.join(5)
    assert more and more[0].slot == flying[0].slot  # it took the slot the first one freed
    for ticket in flying[1:] + more:
        feed.finish(ticket)


def test_the_completer_waits_on_each_batchs_event_on_its_own_thread_then_completes(monkeypatch):
    log, feed = fed(monkeypatch, "device")
    completed: list[tuple] = []
    c = Completer(feed, lambda ids: completed.append((tuple(ids), threading.current_thread().name)))
    tickets = [(feed.launch([1, 2]), [10, 11]), (feed.launch([3]), [12])]
    for ticket, ids in tickets:
        c.submit(ticket, ids)
    c.close()
    assert completed == [((10, 11), "dlscale-loadgen-complete"), ((12,), "dlscale-loadgen-complete")]
    waits = [x for x in log.calls if x[0] == "event.synchronize"]
    assert [w[1] for w in waits] == [t.done.id for t, _ in tickets] and {w[2] for w in waits} == {"dlscale-loadgen-complete"}
    assert c.batches == 2 and c.ran == 3 and c.error is None


def test_inline_completion_finishes_the_oldest_batch_when_its_slot_is_needed_then_drains(monkeypatch):
    log, feed = fed(monkeypatch, "device")
    completed: list[tuple] = []
    c = Completer(feed, lambda ids: completed.append((tuple(ids), threading.current_thread().name)), inline=True)
    tickets = []
    for k in range(GPU_SLOTS - 1):  # the device still computing (the fake events never fire): all in flight
        tickets.append(feed.launch([k]))
        c.submit(tickets[-1], [100 + k])
    assert not completed and "event.synchronize" not in log.names()
    tickets.append(feed.launch([5]))
    c.submit(tickets[-1], [105])  # every slot taken: the oldest is waited for, so the next launch has one
    me = threading.current_thread().name
    assert completed == [((100,), me)] and feed.free.qsize() == 1
    c.drain()
    assert completed == [((100 + k,), me) for k in (0, 1, 2, 5)] and feed.free.qsize() == GPU_SLOTS
    waits = [x[1] for x in log.calls if x[0] == "event.synchronize"]
    assert waits == [t.done.id for t in tickets] and c.batches == 4 and c._thread is None


def test_inline_completion_on_a_cpu_completes_each_batch_at_once():
    s = session_of()
    store = SampleStore(s, 4)
    store.load(range(4))
    feed = Feed(s, store, 2)
    completed: list = []
    c = Completer(feed, completed.append, inline=True)
    c.submit(feed.launch([0, 1]), [7, 8])
    assert completed == [[7, 8]] and feed.free.qsize() == 2  # no event: done when launched


def test_a_failed_batch_still_completes_and_frees_its_slot(monkeypatch):
    log, feed = fed(monkeypatch, "device")

    def boom(batch: Any) -> Any:
        raise RuntimeError("planted")

    feed.session.forward = boom
    completed: list[Any] = []
    c = Completer(feed, completed.append, inline=True)
    c.submit(feed.launch([1]), [7])
    assert completed == [[7]] and isinstance(c.error, RuntimeError) and feed.free.qsize() == GPU_SLOTS


def test_a_batch_runs_padded_to_the_smallest_shape_that_holds_it(monkeypatch):
    log = fake_streams(monkeypatch)
    s = CudaSession(log, "device")
    store = SampleStore(s, 6)
    store.load(range(6))
    feed = Feed(s, store, 4, shapes=(2, 1, 4))
    assert feed.shapes == (1, 2, 4) and [feed.shape(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    log.calls.clear()
    feed.finish(feed.launch([5, 3, 2]))  # 3 samples run as a batch of 4: the 4th row is the buffer's zero
    feed.finish(feed.launch([1, 4, 0, 1]))
    feed.finish(feed.launch([2]))
    assert [c[1] for c in log.calls if c[0] == "forward"] == [[5, 3, 2, 0], [1, 4, 0, 1], [2]]
    with pytest.raises(ValueError, match="max_batch 4"):
        Feed(s, store, 4, shapes=(1, 2))  # max_batch itself must be one of the shapes


def test_warm_runs_every_shape_once_on_the_calling_thread(monkeypatch):
    log = fake_streams(monkeypatch)
    s = CudaSession(log, "device")
    store = SampleStore(s, 3)
    store.load(range(3))
    log.calls.clear()
    warmed: list[int] = []
    t = threading.Thread(target=lambda: warmed.append(Feed(s, store, 4, shapes=(1, 2, 4)).warm()), name="runner")
    t.start()
    t.join(10)
    forwards = [c for c in log.calls if c[0] == "forward"]
    assert warmed == [3] and [len(c[1]) for c in forwards] == [1, 2, 4] and {c[2] for c in forwards} == {"runner"}
    assert log.names().count("event.synchronize") == 3  # each finished before the next: warm when it returns
    log.calls.clear()
    assert Feed(s, store, 4).warm() == 1 and [len(c[1]) for c in log.calls if c[0] == "forward"] == [4]


@requires_cuda
@pytest.mark.gpu
def test_feed_on_a_real_gpu_matches_the_plain_forward():
    from dlscale.infer.session import open_session

    dev = torch.device("cuda", 0)
    for where in ("device", "host"):
        s = open_session(InferConfig("tinycnn", batch_sizes="4", device="cuda", samples_on=where).resolve("cuda"), dev)
        store = SampleStore(s, 8)
        store.load(range(8))
        assert store.pinned == (where == "host") and store.parts[0].is_pinned() == (where == "host")
        feed = Feed(s, store, 4)
        got = []
        s_forward = s.forward
        s.forward = lambda b: got.append(s_forward(b).float().cpu()) or got[-1]
        for idx in ([0, 1, 2, 3], [7, 6], [5, 5, 4, 3]):
            feed.run(idx)
        want = s_forward(s.collate([s.sample(i) for i in (5, 5, 4, 3)])).float().cpu()
        assert torch.allclose(got[-1], want, atol=1e-3)
