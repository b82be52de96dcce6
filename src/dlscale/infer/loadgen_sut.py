"""LoadGen's query sample library (QSL) and system under test (SUT) over ``infer.feed``.

QSL: LoadGen's LoadSamplesToRam fills one ``SampleStore`` (every sample once, in the model's input
dtype and layout, on the device or in pinned host memory) and readies a ``Feed`` and a ``Completer``;
then the energy window opens, so loading is not in it. UnloadSamplesFromRam closes the window
(every query of the test is complete by then) and frees the store.

SUT (LoadGen's "fast" interface: query ids and sample indices as lists of integers):

- single-stream, multi-stream, offline: ``issue`` runs the query's samples in batches of up to
  ``max_batch`` on LoadGen's issuing thread (``Feed.launch``: on a GPU it returns once the batch is
  queued, so batch k+1 is gathered while batch k computes) and hands each batch to the completer,
  which waits on that batch's event and reports it complete (QuerySamplesComplete) from its own
  thread (on a CPU single- and multi-stream complete on the issuing thread);
- server: ``issue`` queues each query and returns; a batcher thread takes the oldest waiting query
  and waits up to the batch-fill timeout after that query arrived for the batch to fill to
  ``max_batch``, then launches it; with two slots, two batches are in flight on a GPU.

Responses carry no data (pointer 0, size 0): these are performance runs, LoadGen's accuracy mode is
not used. After a failure nothing more runs, but every issued sample is still reported complete
(LoadGen would wait for it forever); the first error is raised after LoadGen's test returns.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from dlscale.infer.feed import Completer, Feed, SampleStore, cuda

_STOP = None


class Qsl:
    """LoadGen's QSL: the samples in one store; the feed and completer made when they are loaded."""

    def __init__(self, lg: Any, session: Any, count: int, max_batch: int, inline: bool, meter: Any = None):
        self.lg, self.session, self.count, self.max_batch, self.inline = lg, session, count, max_batch, inline
        self.meter = meter
        self.store = SampleStore(session, count)
        self.feed: Feed | None = None
        self.completer: Completer | None = None
        self.store_bytes = 0
        self.batches = self.ran = 0
        self.error: BaseException | None = None
        self._open = False

    def load(self, indices: Sequence[int]) -> None:
        """LoadGen's LoadSamplesToRam; the energy window opens once the samples are in."""
        self._close_completer()  # a second load without an unload: the batches so far are counted
        self.store.load(indices)
        self.store_bytes = max(self.store_bytes, self.store.nbytes)
        self.feed = Feed(self.session, self.store, self.max_batch)
        self.completer = Completer(self.feed, self.complete, inline=self.inline)
        if hasattr(self.session, "synchronize"):
            self.session.synchronize()  # the load's copies are done before the window opens
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
        lg = self.lg
        lg.QuerySamplesComplete([lg.QuerySampleResponse(i, 0, 0) for i in ids])

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


def completes_inline(session: Any, scenario: str) -> bool:
    """Whether batches are completed on the thread that ran them: on a CPU (no event to wait on) for
    single- and multi-stream, where a hand-over would only add to each query's latency; never on a
    GPU. CPU offline and server batches go to the completion thread: against completing them inline it
    measured a median 0.86 - 0.96 inline / thread on a busy machine and 1.02 on a quiet one
    (docs/PERFORMANCE.md)."""
    gpu = getattr(session, "runtime", "torch") == "torch" and cuda(getattr(session, "device", None))
    return not gpu and scenario in ("single-stream", "multi-stream")
