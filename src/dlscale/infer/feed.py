"""Batches at the device's speed: samples held once, gathered by index, copied and completed off the critical path.

``SampleStore`` holds a run's samples (LoadGen's query sample library, or the sweep's batch) as ONE
preallocated tensor per input of the model, row ``i`` = sample ``i``, in the model's input dtype and
layout (``Session.stored``; NHWC where the run uses channels_last): on the device (``--samples-on
device``, the default) or in pinned host memory (``--samples-on host``; MLPerf submissions say which
their QSL does). On a CPU the device is host memory, so the two are the same memory (nothing is pinned).

``Feed.launch(indices)`` gathers one batch (``index_select`` into a preallocated batch buffer: no
per-sample Python stacking) and runs the forward; it returns a ``Ticket`` at once on a GPU:

- samples on the device: the indices go to the device (a pinned buffer, a non-blocking copy), the
  gather and the forward run on the compute stream;
- samples on the host: the gather fills a pinned buffer, a side stream copies it to the device
  (non-blocking) and records an event the compute stream waits on, so the copy of batch k+1 overlaps
  the forward of batch k (each slot a pinned buffer, a device buffer and events);
- each batch ends by recording its ``done`` event on the compute stream; ``Feed.finish(ticket)`` waits
  on that event alone (never a device-wide synchronise) and frees the slot.

At most ``slots`` batches are in flight: ``launch`` waits for a free slot. On a CPU there are no
streams or events: the forward returns when it is done, ``finish`` only frees the slot, and two slots
(``SLOTS``) are enough. On a GPU ``GPU_SLOTS`` (4): the issuing thread may run three batches ahead of
the device, so a late wake-up of the completion thread or of the issuing thread (the GIL, another
process) is absorbed by the queued batches and the device never waits for the host while the host
keeps up with it at all.

``shapes`` (a GPU's LoadGen runs): the batch shapes a feed runs. A batch of ``n`` samples runs as the
smallest shape >= n, its rows past ``n`` left as they are in the slot's buffer (zeros, or an earlier
batch's samples; their outputs are not read), and ``warm`` runs one batch of every shape on the
calling thread before the measured window: cuDNN's execution plans are built per shape and cached
per thread (torch keeps its cuDNN v8 benchmark cache ``thread_local``), so a shape first seen inside
the window (offline's last, short batch; a server batch of a new size on the batcher's new thread)
would have its plans autotuned there. ``None``: every batch runs at its own size (the CPU, where a
new shape costs no autotuning and padding would cost compute).

``Completer`` reports finished batches to LoadGen (``QuerySamplesComplete``) in launch order. Where
LoadGen's issuing thread only issues (single-stream, multi-stream, offline) it does so itself
(``inline``): a batch is finished when the next launch needs its slot (the thread would wait for it
anyway) or, sooner, when its event has already fired, and a query's last batches when they are all
launched; nothing is handed to another thread, so no completion waits for a thread to be scheduled
and to take the GIL (a hand-over cost 0.1 - 1.4 ms a batch on a busy 2-core machine). The server's
batcher waits for queries, so there a thread of its own waits on each batch's event instead, as it
does for a CPU's offline batches (``loadgen_sut.completes_inline``).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

SAMPLES_ON = ("device", "host")
SLOTS = 2  # batches in flight on a CPU: one computing, one being gathered
GPU_SLOTS = 4  # on a GPU: one computing, up to three queued behind it (module doc)


def cuda(device: Any) -> bool:
    return getattr(device, "type", "cpu") == "cuda"


class SampleStore:
    """Samples as one preallocated tensor per input (rows = sample indices ``0 .. count-1``)."""

    def __init__(self, session: Any, count: int, where: str | None = None):
        self.session, self.count = session, count
        self.where = where or session.samples_on
        if self.where not in SAMPLES_ON:
            raise ValueError(f"samples on {self.where!r}: expected one of {SAMPLES_ON}")
        self.device = session.device if session.runtime == "torch" else _cpu()
        self.on_gpu = cuda(self.device) and self.where == "device"
        self.pinned = cuda(self.device) and self.where == "host"
        self.parts: tuple[Any, ...] | None = None
        self.loaded: set[int] = set()

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parts or ())

    def load(self, indices: Sequence[int]) -> None:
        """LoadGen's LoadSamplesToRam: these samples into their rows (the tensors made at the first load)."""
        import torch

        indices = [int(i) for i in indices]
        if not indices:
            return
        rows = [self.session.stored(i) for i in indices]
        cols = [torch.stack(col) for col in zip(*rows)]
        if self.parts is None:
            place = self.device if self.on_gpu else _cpu()
            self.parts = tuple(empty_rows(c, self.count, place, self.session.channels_last, self.pinned) for c in cols)
        at = torch.tensor(indices, dtype=torch.long)
        for part, col in zip(self.parts, cols):
            part.index_copy_(0, at.to(part.device), col.to(part.device))
        self.loaded.update(indices)

    def unload(self, indices: Sequence[int]) -> None:
        """LoadGen's UnloadSamplesFromRam: the tensors go when no sample is left in them."""
        self.loaded.difference_update(int(i) for i in indices)
        if not self.loaded:
            self.parts = None


@dataclass
class Ticket:
    """One launched batch: its slot, its ``done`` event (None on a CPU), its sample count."""

    slot: int
    done: Any
    size: int
    error: BaseException | None = None


@dataclass
class _Slot:
    batch: tuple[Any, ...]  # the batch buffers the forward reads (on the device)
    staging: tuple[Any, ...] = ()  # samples on the host (GPU): pinned buffers the gather fills
    index: tuple[Any, Any] | None = None  # samples on the device: (pinned, device) index buffers
    copied: Any = None  # samples on the host: the side stream's copy is done
    done: Any = None  # the forward of this slot's batch is done


class Feed:
    """Batches of up to ``max_batch`` samples of ``store``, gathered by index and run (module doc)."""

    def __init__(self, session: Any, store: SampleStore, max_batch: int, slots: int | None = None,
                 shapes: Sequence[int] | None = None):
        import torch

        if store.parts is None:
            raise RuntimeError("the sample store is empty: load samples before feeding batches")
        self.session, self.store, self.max_batch = session, store, max_batch
        self.gpu = cuda(store.device)
        self.shapes = tuple(sorted({int(b) for b in shapes})) if shapes else None
        if self.shapes is not None and not (self.shapes[0] >= 1 and self.shapes[-1] == max_batch):
            raise ValueError(f"batch shapes {self.shapes}: expected sizes from 1 up to max_batch {max_batch}")
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        self.slots: list[_Slot] = []
        if self.gpu:
            self.compute = torch.cuda.current_stream(store.device)
            self.copy_stream = torch.cuda.Stream(store.device) if store.pinned else None
        for k in range(slots or (GPU_SLOTS if self.gpu else SLOTS)):
            self.slots.append(self._slot(torch))
            self.free.put(k)

    def shape(self, n: int) -> int:
        """The batch size a batch of ``n`` samples runs at: the smallest of ``shapes`` >= n, else ``n``."""
        return next((b for b in self.shapes if b >= n), n) if self.shapes else n

    def warm(self) -> int:
        """One batch of every shape launched and finished on the calling thread (the thread that will
        run them); the number of batches. Without ``shapes``: one full batch."""
        rows = sorted(self.store.loaded) or [0]
        for b in self.shapes or (self.max_batch,):
            self.run([rows[i % len(rows)] for i in range(b)])
        return len(self.shapes or (self.max_batch,))

    def _slot(self, torch: Any) -> _Slot:
        """One slot's buffers (and events on a GPU), allocated once."""
        dev = self.store.device
        nhwc = self.session.channels_last
        batch = tuple(empty_rows(p, self.max_batch, dev, nhwc) for p in self.store.parts)
        if self.shapes is not None:  # padded rows are read: zeros until a batch fills them
            for b in batch:
                b.zero_()
        if not self.gpu:
            return _Slot(batch)
        slot = _Slot(batch, done=torch.cuda.Event())
        if self.store.pinned:
            slot.staging = tuple(empty_rows(p, self.max_batch, _cpu(), nhwc, pin=True) for p in self.store.parts)
            slot.copied = torch.cuda.Event()
        else:
            slot.index = (torch.empty(self.max_batch, dtype=torch.long, pin_memory=True),
                          torch.empty(self.max_batch, dtype=torch.long, device=dev))
        return slot

    def launch(self, indices: Sequence[int]) -> Ticket:
        """Gather the samples ``indices`` into a free slot and run the forward (waits while every slot
        is in flight); returns at once on a GPU, when the forward is done on a CPU."""
        n = len(indices)
        if not 0 < n <= self.max_batch:
            raise ValueError(f"a batch of {n} samples: expected 1 to {self.max_batch}")
        k = self.free.get()
        slot = self.slots[k]
        try:
            self.session.forward(self.session.inputs(self._gather(slot, indices)))
            if self.gpu:
                slot.done.record(self.compute)
        except BaseException as e:  # noqa: BLE001 - the batch still needs finishing (its slot, LoadGen's samples)
            return Ticket(k, self._mark(slot), n, error=e)
        return Ticket(k, slot.done if self.gpu else None, n)

    def _mark(self, slot: _Slot) -> Any:
        """After a failed launch on a GPU: the slot's event after what was queued, so that ``finish``
        frees the slot only when its copies are done (None when not even that can be recorded)."""
        if not self.gpu:
            return None
        try:
            slot.done.record(self.compute)
            return slot.done
        except BaseException:  # noqa: BLE001 - the launch's own error is the one to report
            return None

    def batch(self, indices: Sequence[int]) -> Any:
        """The samples ``indices`` gathered once into the first slot's buffers, on the device, as the
        forward takes them (the sweep's resident batch); call before any ``launch``."""
        out = self.session.inputs(self._gather(self.slots[0], indices))
        if self.gpu:
            self.compute.synchronize()
        return out

    def _gather(self, slot: _Slot, indices: Sequence[int]) -> tuple[Any, ...]:
        """The rows ``indices`` of every input gathered into the slot's batch buffers (on the device);
        the buffers' first ``shape(len(indices))`` rows, what the forward reads."""
        import torch

        n = len(indices)
        idx = torch.tensor(indices, dtype=torch.long)
        if not self.gpu:
            for p, b in zip(self.store.parts, slot.batch):
                torch.index_select(p, 0, idx, out=b[:n])
        elif self.store.pinned:
            self._copy_in(slot, idx, n)
        else:
            pinned, on_dev = slot.index
            pinned[:n].copy_(idx)
            on_dev[:n].copy_(pinned[:n], non_blocking=True)
            for p, b in zip(self.store.parts, slot.batch):
                torch.index_select(p, 0, on_dev[:n], out=b[:n])
        m = self.shape(n)
        return tuple(b[:m] for b in slot.batch)

    def _copy_in(self, slot: _Slot, idx: Any, n: int) -> None:
        """Samples on the host: gather into the slot's pinned buffers, copy them to the device on the
        side stream; the compute stream waits for that copy alone."""
        import torch

        for p, s in zip(self.store.parts, slot.staging):
            torch.index_select(p, 0, idx, out=s[:n])
        with torch.cuda.stream(self.copy_stream):
            for s, b in zip(slot.staging, slot.batch):
                b[:n].copy_(s[:n], non_blocking=True)
            slot.copied.record(self.copy_stream)
        self.compute.wait_event(slot.copied)

    def finish(self, ticket: Ticket) -> None:
        """Wait for this batch's forward (its event only) and free its slot; a launch or device error
        is raised after the slot is freed."""
        try:
            if ticket.done is not None:
                ticket.done.synchronize()
        except BaseException:
            if ticket.error is None:
                raise
        finally:
            self.free.put(ticket.slot)
        if ticket.error is not None:
            raise ticket.error

    def run(self, indices: Sequence[int]) -> None:
        """One batch, launched and finished (the probes, a synchronised single batch)."""
        self.finish(self.launch(indices))


def empty_rows(part: Any, rows: int, device: Any, nhwc: bool, pin: bool = False) -> Any:
    """An empty tensor of ``rows`` rows shaped and typed as ``part``'s rows; 4-D ones NHWC when ``nhwc``."""
    import torch

    fmt = torch.channels_last if nhwc and part.dim() == 4 else torch.contiguous_format
    return torch.empty((rows, *part.shape[1:]), dtype=part.dtype, device=device, memory_format=fmt, pin_memory=pin)


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


class Completer:
    """Finishes launched batches in launch order and then calls ``complete(ids)`` for each (module doc):
    on a thread of its own, or ``inline`` on the issuing thread, which finishes the oldest batch when
    the next launch would find every slot taken (it would wait for that batch anyway), any batch whose
    event has already fired (on a CPU: every batch, at once) when it submits the next, and the rest in
    ``drain`` once a query's batches are all launched. The first error (a launch's, the device's,
    LoadGen's) is kept in ``error``; later batches are still completed so LoadGen is never left waiting."""

    def __init__(self, feed: Feed, complete: Callable[[Sequence[int]], None], inline: bool = False):
        self.feed, self.complete, self.inline = feed, complete, inline
        self.error: BaseException | None = None
        self.batches = self.ran = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: deque[tuple[Ticket, Sequence[int]]] = deque()  # inline: launched, not yet completed
        self._thread: threading.Thread | None = None
        if not inline:
            self._thread = threading.Thread(target=self._loop, name="dlscale-loadgen-complete", daemon=True)
            self._thread.start()

    def submit(self, ticket: Ticket, ids: Sequence[int]) -> None:
        if not self.inline:
            self._queue.put((ticket, ids))
            return
        self._pending.append((ticket, ids))
        keep = len(self.feed.slots) - 1  # at most this many in flight after a submit: the next launch has a slot
        while self._pending and (len(self._pending) > keep or _ready(self._pending[0][0])):
            self._done(*self._pending.popleft())

    def drain(self) -> None:
        """Inline: finish and complete every batch submitted so far (a query's last batches)."""
        while self._pending:
            self._done(*self._pending.popleft())

    def _done(self, ticket: Ticket, ids: Sequence[int]) -> None:
        try:
            self.feed.finish(ticket)
            self.batches, self.ran = self.batches + 1, self.ran + ticket.size
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller after LoadGen's test
            self.error = self.error or e
        try:
            self.complete(ids)
        except BaseException as e:  # noqa: BLE001
            self.error = self.error or e

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._done(*item)

    def close(self) -> None:
        """Finish what was submitted and stop the thread."""
        self.drain()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def _ready(ticket: Ticket) -> bool:
    """Whether a batch can be finished without waiting: a CPU's (done when launched), a failed launch's,
    or one whose event has fired."""
    return ticket.done is None or ticket.error is not None or bool(ticket.done.query())
