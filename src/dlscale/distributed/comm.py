"""Time and count DDP's gradient all-reduce with a communication hook.

``CommTimer.hook`` replaces DDP's default hook with the same arithmetic (divide the bucket by
the world size, all-reduce it asynchronously) and notes, per bucket, when the all-reduce was
launched and when it completed, and how many bytes it carried. A step's communication time is
the length of the union of those [launch, completion] intervals: the wall time during which at
least one gradient all-reduce was in flight (buckets overlap each other and the backward pass,
so the sum of bucket times would count the same second twice). On CPU the marks are
``time.perf_counter`` (gloo completes work on its own threads; the completion callback runs
there); on CUDA they are CUDA events on the current stream, read after the timed window.

The harness's ``on_step`` callback closes a step: ``on_step`` after a measured step files the
intervals seen since the previous step under that step; warm-up steps are dropped.
"""

from __future__ import annotations

import time
from typing import Any


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of [start, end] intervals (overlaps counted once)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


class CommTimer:
    """A DDP comm hook that records all-reduce intervals and bytes per measured step."""

    def __init__(self, device: Any, world_size: int):
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.world_size = world_size
        self._pending: list[list[Any]] = []  # [start, end] marks of the current step
        self._bytes = 0
        self._steps: list[tuple[list[list[Any]], int]] = []
        self.repeats_comm_s: list[list[float]] = []
        self.repeats_bytes: list[list[int]] = []

    def _mark(self) -> Any:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def hook(self, state, bucket):  # no annotations: DDP checks the bucket annotation against GradBucket
        """DDP comm hook: average the bucket over ranks with an async all-reduce, timed."""
        import torch.distributed as dist

        buf = bucket.buffer()
        span = [self._mark(), None]
        self._pending.append(span)
        self._bytes += buf.numel() * buf.element_size()
        buf.div_(self.world_size)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f: Any) -> Any:
            span[1] = self._mark()
            return f.value()[0]

        return fut.then(done)

    def on_step(self, phase: str, done: int, total: int) -> None:
        """Harness callback after each step: keep a measured step's marks, drop a warm-up step's."""
        pending, nbytes = self._pending, self._bytes
        self._pending, self._bytes = [], 0
        if phase != "measure":
            return
        self._steps.append((pending, nbytes))
        if done == total:
            self._close_repeat()

    def _close_repeat(self) -> None:
        comm, nbytes = [], []
        for spans, b in self._steps:
            comm.append(self._length(spans))
            nbytes.append(b)
        self._steps = []
        self.repeats_comm_s.append(comm)
        self.repeats_bytes.append(nbytes)

    def _length(self, spans: list[list[Any]]) -> float:
        spans = [s for s in spans if s[1] is not None]
        if not spans:
            return 0.0
        if self.cuda:
            ref = spans[0][0]
            ref.synchronize()
            spans[-1][1].synchronize()
            return union_length([(ref.elapsed_time(a) / 1e3, ref.elapsed_time(b) / 1e3) for a, b in spans])
        return union_length([(a, b) for a, b in spans])
