"""The timed-batch probe: one batch's samples held as LoadGen holds them (``infer.feed``), its forwards
timed by the harness's step clock (``harness.timing.timed_loop``). The batch sweep (``infer.run``), the
probes that size a LoadGen run (``infer.loadgen_settings``) and benchmarks/loadgen_offline.py all time
their batches here.

Two ways a batch is run, as its caller measures:

- the sweep's (default): the forward alone. On the device the samples are gathered once and every step
  is a forward of that batch, timed on the device's clock (CUDA events on a GPU; onnxruntime returns host
  arrays, so its forwards are timed on the host clock); in host memory on a GPU (``--samples-on host``)
  every step gathers them into pinned memory and copies them on a side stream while the previous steps
  compute (the feed's slots in flight);
- the SUT's (``as_sut``): gathered from the store, launched and waited for (``Feed.run``), on the host
  clock, on the calling thread or (``worker_thread``) a thread of its own, as LoadGen's SUT runs them.
"""

from __future__ import annotations

import threading
from typing import Any


def time_batch(session: Any, batch_size: int, warmup: int, iters: int, meter: Any = None, window: Any = None,
               as_sut: bool = False, worker_thread: bool = False) -> list[float]:
    """Seconds of each of ``iters`` timed batches of ``batch_size`` samples after ``warmup`` uncounted ones
    (``meter``: an EnergyMeter read at the window's edges; ``window``: harness.window.Window)."""
    import torch

    from dlscale.harness.timing import timed_loop
    from dlscale.infer.feed import Feed, SampleStore

    store = SampleStore(session, batch_size)
    store.load(range(batch_size))
    feed = Feed(session, store, batch_size)
    indices = list(range(batch_size))
    host = torch.device("cpu")
    if as_sut:
        return _on_thread(lambda: timed_loop(lambda: feed.run(indices), warmup, iters, host, meter=meter,
                                             window=window)[0], worker_thread)
    clock_device = session.device if session.runtime == "torch" else host
    if not store.pinned:
        batch = feed.batch(indices)
        return timed_loop(lambda: session.forward(batch), warmup, iters, clock_device, meter=meter, window=window)[0]
    flying: list[Any] = []

    def step() -> None:
        if len(flying) == len(feed.slots):
            feed.finish(flying.pop(0))
        flying.append(feed.launch(indices))

    try:
        return timed_loop(step, warmup, iters, clock_device, meter=meter, window=window)[0]
    finally:
        for t in flying:
            feed.finish(t)


def _on_thread(timed: Any, worker_thread: bool) -> list[float]:
    """``timed()`` here, or on a thread of its own; its error is raised on the caller's thread."""
    if not worker_thread:
        return timed()
    out: list[list[float]] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(timed())
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            failed.append(e)

    worker = threading.Thread(target=run, name="dlscale-loadgen-probe")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return out[0]
