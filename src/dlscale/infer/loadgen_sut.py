"""LoadGen's query sample library (QSL) and system under test (SUT) over ``infer.feed``.

QSL: LoadGen's LoadSamplesToRam fills one ``SampleStore`` (every sample once, in the model's input
dtype and layout, on the device or in pinned host memory), readies a ``Feed`` and a ``Completer``
and warms the feed's batch shapes on the thread that will run them (``Sut.warm``); then the energy
window opens, so loading and warming are not in it. UnloadSamplesFromRam closes the window (every
query of the test is complete by then) and frees the store.

SUT (LoadGen's "fast" interface: query ids and sample indices as lists of integers):

- single-stream, multi-stream, offline: ``issue`` runs the query's samples in batches of up to
  ``max_batch`` on LoadGen's issuing thread, the thread that also loads the samples (``Feed.launch``:
  on a GPU it returns once the batch is queued, so the next batches are gathered and queued while
  one computes), and completes them there too (``Completer`` inline: a batch when the next launch
  needs its slot or its event has fired, the query's last ones before ``issue`` returns);
- server: ``issue`` queues each query and returns; a batcher thread takes the oldest waiting query
  and waits up to the batch-fill timeout after that query arrived for the batch to fill to
  ``max_batch``, then launches it, with ``feed.GPU_SLOTS`` batches in flight on a GPU; a completion
  thread waits on each batch's event and reports it complete.

On a GPU every batch runs at one of the scenario's shapes (``shapes_for``: offline ``max_batch``, its
last batch padded; single-stream 1; multi-stream a query's part; server powers of two up to
``max_batch``), each warmed before the window on the thread that runs it.

Responses carry no data (pointer 0, size 0): these are performance runs, LoadGen's accuracy mode is
not used. LoadGen's Python API (mlcommons-loadgen 6.0: ``QuerySamplesComplete(responses,
response_cb=None)``, ``FirstTokenComplete`` alike) takes a list of ``QuerySampleResponse`` objects and
copies it into a C++ vector; it has no form that takes arrays of ids. So ``Responses`` makes those
objects once per completing thread and reuses them, setting each one's id per batch: no object is
made per sample or per batch (measured: 64 ids set in a third of the time 64 new objects take).
After a failure nothing more runs, but every issued sample is still reported complete (LoadGen would
wait for it forever); the first error is raised after LoadGen's test returns.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

from dlscale.infer.feed import Completer, Feed, SampleStore, cuda
from dlscale.infer.loadgen_settings import MULTI_STREAM_SAMPLES

_STOP = None


class Responses:
    """QuerySamplesComplete (and FirstTokenComplete) with ``QuerySampleResponse`` objects made once per
    thread and reused (module doc); ``serve.mlperf`` completes its token-latency queries through it too."""

    def __init__(self, lg: Any):
        self.lg = lg
        self._local = threading.local()

    def _pool(self, kind: str, ids: Sequence[int]) -> list[Any]:
        n = len(ids)
        pool = getattr(self._local, kind, None)
        if pool is None or len(pool) < n:
            pool = [self.lg.QuerySampleResponse(0, 0, 0) for _ in range(n)]
            setattr(self._local, kind, pool)
        deque(map(setattr, pool, repeat("id"), ids), 0)  # each response's id, in C: no Python loop
        return pool if n == len(pool) else pool[:n]

    def complete(self, ids: Sequence[int], n_tokens: Sequence[int] | None = None) -> None:
        """The samples ``ids`` complete (with ``n_tokens``: each one's output tokens, LoadGen's token latencies)."""
        pool = self._pool("pool", ids)
        if n_tokens is not None:
            deque(map(setattr, pool, repeat("n_tokens"), n_tokens), 0)
        self.lg.QuerySamplesComplete(pool)

    def first_token(self, ids: Sequence[int]) -> None:
        """The samples ``ids`` have their first token (LoadGen's FirstTokenComplete)."""
        self.lg.FirstTokenComplete(self._pool("first", ids))


class Qsl:
    """LoadGen's QSL: the samples in one store; the feed and completer made, and the feed's shapes
    warmed (``warm``: on the thread that runs them), when they are loaded."""

    def __init__(self, lg: Any, session: Any, count: int, max_batch: int, inline: bool, meter: Any = None,
                 shapes: Sequence[int] | None = None):
        self.lg, self.session, self.count, self.max_batch, self.inline = lg, session, count, max_batch, inline
        self.meter, self.shapes = meter, shapes
        self.store = SampleStore(session, count)
        self.feed: Feed | None = None
        self.completer: Completer | None = None
        self.responses = Responses(lg)
        self.warm: Callable[[Feed], None] = lambda feed: feed.warm()
        self.store_bytes = self.slots = 0
        self.batches = self.ran = 0
        self.error: BaseException | None = None
        self._open = False

    def load(self, indices: Sequence[int]) -> None:
        """LoadGen's LoadSamplesToRam; the feed's shapes warmed, then the energy window opens."""
        self._close_completer()  # a second load without an unload: the batches so far are counted
        try:
            self.store.load(indices)
            self.store_bytes = max(self.store_bytes, self.store.nbytes)
            self.feed = Feed(self.session, self.store, self.max_batch, shapes=self.shapes)
            self.slots = len(self.feed.slots)
            self.completer = Completer(self.feed, self.complete, inline=self.inline)
            self.warm(self.feed)
            if hasattr(self.session, "synchronize"):
                self.session.synchronize()  # the load's copies and the warm-up are done before the window opens
        except Exception as e:  # noqa: BLE001 - raised after LoadGen's test; its queries are completed unrun
            self.error = self.error or e
        if self.meter is not None and not self._open:
            self.meter.begin()
            self._open = True

    def unload(self, indices: Sequence[int]) -> None:
        """LoadGen's UnloadSamplesFromRam: the test is over; the window closes, the store goes."""
        if self.meter is not None and self._open:
            self.meter.end()
            self._open = False
        self._close_completer()
        self.store.unload(indices)
        if self.store.parts is None:
            self.feed = None

    def _close_completer(self) -> None:
        c = self.completer
        if c is None:
            return
        c.close()
        self.batches, self.ran = self.batches + c.batches, self.ran + c.ran
        self.error = self.error or c.error
        self.completer = None

    def complete(self, ids: Sequence[int]) -> None:
        """Report these samples complete to LoadGen (no response data: performance runs)."""
        self.responses.complete(ids)

    def close(self) -> None:
        """After LoadGen's test: a completer LoadGen never unloaded is stopped."""
        self._close_completer()


class Sut:
    """LoadGen's SUT over a ``Qsl``'s feed and completer (module doc)."""

    def __init__(self, qsl: Qsl, scenario: str, max_batch: int, batch_timeout_s: float | None = None):
        self.qsl, self.scenario, self.max_batch = qsl, scenario, max_batch
        self.batch_timeout_s = batch_timeout_s or 0.0
        self.pending: queue.Queue = queue.Queue()
        self.worker: threading.Thread | None = None
        qsl.warm = self.warm

    def warm(self, feed: Feed) -> None:
        """The feed's shapes warmed on the thread that will run them: the server's batcher (handed to
        it, waited for), else the calling one, LoadGen's issuing thread."""
        if self.worker is None:
            feed.warm()
            return
        job = _WarmJob(feed)
        self.pending.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error

    @property
    def failed(self) -> bool:
        c = self.qsl.completer
        return self.qsl.error is not None or (c is not None and c.error is not None)

    def issue(self, ids: Sequence[int], indices: Sequence[int]) -> None:
        """LoadGen's IssueQuery (fast form): server queues (returns at once), the others run in place."""
        if self.scenario == "server":
            now = time.monotonic()
            for i, x in zip(ids, indices):
                self.pending.put((i, x, now))
            return
        for start in range(0, len(ids), self.max_batch):
            self._launch(ids[start:start + self.max_batch], indices[start:start + self.max_batch])
        if self.qsl.completer is not None:
            self.qsl.completer.drain()  # the query's last batches, before LoadGen issues the next query

    def flush(self) -> None:
        """LoadGen's FlushQueries: nothing is held back past the batch-fill timeout."""

    def _launch(self, ids: Sequence[int], indices: Sequence[int]) -> None:
        """One batch to the feed and its completion to the completer; after a failure, completion only."""
        feed, completer = self.qsl.feed, self.qsl.completer
        if completer is None or feed is None:  # LoadGen issues only loaded samples; never left waiting if not
            self.qsl.error = self.qsl.error or RuntimeError("LoadGen issued a query before loading its samples")
            self.qsl.complete(ids)
            return
        if self.failed:
            self.qsl.complete(ids)
            return
        completer.submit(feed.launch(indices), ids)

    def _batches(self) -> None:
        """Server batcher: the oldest waiting query plus what arrives within the batch-fill timeout of
        it, up to max_batch; until stopped."""
        while True:
            first = self.pending.get()
            if first is _STOP:
                return
            if isinstance(first, _WarmJob):
                first.run()
                continue
            batch, stop = [first], False
            deadline = first[2] + self.batch_timeout_s
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    nxt = self.pending.get(timeout=left) if left > 0 else self.pending.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._launch([b[0] for b in batch], [b[1] for b in batch])
            if stop:
                return

    def start(self) -> None:
        """Start the server's batcher (the other scenarios run on LoadGen's issuing thread)."""
        if self.scenario == "server":
            self.worker = threading.Thread(target=self._batches, name="dlscale-loadgen-sut", daemon=True)
            self.worker.start()

    def stop(self) -> None:
        """Stop the batcher once LoadGen's test has returned (every query is complete by then)."""
        if self.worker is not None:
            self.pending.put(_STOP)
            self.worker.join()
            self.worker = None


class _WarmJob:
    """A feed to warm on the server's batcher thread; ``done`` is set when it ran (or failed)."""

    def __init__(self, feed: Feed):
        self.feed, self.done, self.error = feed, threading.Event(), None

    def run(self) -> None:
        try:
            self.feed.warm()
        except BaseException as e:  # noqa: BLE001 - raised on the loading thread
            self.error = e
        finally:
            self.done.set()


def completes_inline(session: Any, scenario: str) -> bool:
    """Whether batches are completed on LoadGen's issuing thread (``Completer`` inline), else on a
    completion thread. Single- and multi-stream: inline (LoadGen issues the next query when this one
    completes; a hand-over only adds a thread wake-up to each query's latency). Offline: inline on a
    GPU, where the issuing thread completes a batch while three more are queued on the device, so the
    completion costs the device nothing and no GIL changes hands per batch; on a CPU the completion
    thread, which overlaps LoadGen's completion work with the next forward (the forward holds the
    issuing thread; LoadGen offline inline / thread measured a median 0.81 at 1 ms a batch and 0.97 at
    5 ms on a busy 2-core machine, docs/PERFORMANCE.md). Server: the thread, as the batcher waits for
    queries."""
    if scenario in ("single-stream", "multi-stream"):
        return True
    return scenario == "offline" and gpu_session(session)


def gpu_session(session: Any) -> bool:
    return getattr(session, "runtime", "torch") == "torch" and cuda(getattr(session, "device", None))


def shapes_for(session: Any, scenario: str, max_batch: int) -> tuple[int, ...] | None:
    """The batch shapes the SUT runs on a GPU (module doc); None on a CPU (every batch at its size)."""
    if not gpu_session(session):
        return None
    if scenario == "single-stream":
        return (1,)
    if scenario == "multi-stream":
        return (min(MULTI_STREAM_SAMPLES, max_batch),)
    if scenario == "offline":
        return (max_batch,)
    return tuple(sorted({1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch} | {max_batch}))


def wall_rate(session: Any, max_batch: int, samples: int, seconds: float) -> float:
    """Samples/s of full batches run as the offline SUT runs them, without LoadGen: the same sample
    store, feed (slots, shapes, warmed on this thread) and completion thread, completing nothing;
    timed on the wall clock from the first launch to the last batch's completion, as LoadGen times its
    offline query, over at least ``seconds`` and 2 x the slots' batches."""
    store = SampleStore(session, samples)
    store.load(range(samples))
    feed = Feed(session, store, max_batch, shapes=shapes_for(session, "offline", max_batch))
    feed.warm()
    indices = [i % samples for i in range(max_batch)]
    least = 2 * len(feed.slots)
    completer = Completer(feed, lambda ids: None, inline=completes_inline(session, "offline"))
    try:
        t0 = time.perf_counter()
        launched = 0
        while launched < least or time.perf_counter() - t0 < seconds:
            completer.submit(feed.launch(indices), ())
            launched += 1
    finally:
        completer.close()
    spent = time.perf_counter() - t0
    if completer.error is not None:
        raise completer.error
    return launched * max_batch / spent
