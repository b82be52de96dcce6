"""infer.probe, the one timed-batch probe: the batch sweep's forwards and the SUT's batches, timed by the
harness's step clock; LoadGen's settings, the sweep and benchmarks/loadgen_offline.py all time through it."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")


class _Session:
    """The Session contract: a sample is one number; ``forward`` sleeps ``per_batch_s`` and logs its
    batch and thread."""

    model, sample_unit, runtime, precision, samples_on, channels_last = "fake", "images", "torch", "fp32", "device", False

    def __init__(self, per_batch_s: float):
        self.device = torch.device("cpu")
        self.per_batch_s, self.batches, self.threads = per_batch_s, [], []

    def stored(self, index: int) -> tuple:
        return (torch.tensor([float(index)]),)

    def inputs(self, parts: tuple):
        return parts[0]

    def forward(self, batch):
        time.sleep(self.per_batch_s)
        self.batches.append(batch)
        self.threads.append(threading.current_thread())
        return batch


def test_the_sweep_times_forwards_of_one_gathered_batch():
    from dlscale.infer.probe import time_batch

    s = _Session(0.01)
    times = time_batch(s, 4, 2, 3)
    assert len(times) == 3 and all(0.009 <= t < 1.0 for t in times)
    assert len(s.batches) == 2 + 3 and all(b is s.batches[0] for b in s.batches)  # gathered once
    assert s.batches[0].flatten().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_sut_probe_gathers_every_batch_on_the_thread_asked_for():
    from dlscale.infer.probe import time_batch

    s = _Session(0.01)
    times = time_batch(s, 2, 1, 3, as_sut=True)
    assert len(times) == 3 and all(t >= 0.009 for t in times) and len(s.batches) == 4
    assert set(s.threads) == {threading.current_thread()}
    s.threads.clear()
    time_batch(s, 2, 1, 3, as_sut=True, worker_thread=True)
    assert len(s.threads) == 4 and threading.current_thread() not in s.threads


def test_every_caller_times_its_batches_through_the_one_probe(monkeypatch):
    """LoadGen's probe (as the SUT runs: 1 warm-up, the fastest of 3), the sweep, the offline benchmark."""
    import importlib.util
    from pathlib import Path

    from dlscale.infer import loadgen_settings, probe, run

    assert run.time_batch is probe.time_batch  # the sweep's forwards: the probe's own function
    calls = []

    def fake(session, batch, warmup, iters, meter=None, window=None, as_sut=False, worker_thread=False):
        calls.append((batch, warmup, iters, as_sut, worker_thread))
        return [0.3, 0.2, 0.25][:iters] + [0.1] * max(0, iters - 3)

    monkeypatch.setattr(probe, "time_batch", fake)
    assert loadgen_settings.probe(None, 8, worker_thread=True) == 0.2
    assert calls[-1] == (8, 1, 3, True, True)
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "loadgen_offline.py"
    spec = importlib.util.spec_from_file_location("loadgen_offline_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.time_batch is fake  # raw_rate and per_batch_for time through the probe
