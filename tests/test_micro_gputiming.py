"""GPU timing of the micro harness on a fake GPU (tests/fakes_gpu.FakeTimingCuda: a simulated clock
that fake calls advance, events that stamp it): events made once, K calls per event pair from a
calibration, a CUDA graph or launches one by one, cold-cache rotation past the L2, the median, the
SM clock and throttle reasons per case, and the energy rule for short windows."""

from __future__ import annotations

import math

import pytest
from conftest import requires_cuda
from fakes_gpu import FakeGpu, FakeTimingCuda, cuda_from_host, fake_nvml

from dlscale import stats
from dlscale.micro import gputiming, harness
from dlscale.micro.base import Case, MicroOptions, Plan

US = 1e-6


def test_events_are_made_once_and_every_window_holds_k_calls():
    gpu = FakeTimingCuda()
    w = gputiming.time_case(gpu.builder(lambda i: 7 * US), "cuda:0", warmup=2, reps=10, api=gpu)
    assert gpu.events_made == 10 + 1  # before the loop; calibration reuses the first two
    # K: the first calibrated count whose window reaches 1 ms; 7 us calls -> K * 7 us >= 1 ms
    assert w.calls * 7 * US >= gputiming.TARGET_WINDOW_S and w.calls < 2 * gputiming.TARGET_WINDOW_S / (7 * US)
    assert w.calibration[-1][0] == w.calls and w.calibration[-1][1] == pytest.approx(w.calls * 7 * US)
    assert [k for k, _ in w.calibration] == sorted(k for k, _ in w.calibration)  # K only grows
    assert [len(calls) for calls in gpu.windows(10)] == [w.calls] * 10
    assert w.per_call_s == pytest.approx([7 * US] * 10)  # window / K
    assert w.method == "cuda-events" and w.cache == "hot" and gpu.captures == 0


def test_a_long_call_needs_one_per_window():
    gpu = FakeTimingCuda()
    w = gputiming.time_case(gpu.builder(lambda i: 3e-3), "cuda:0", warmup=0, reps=4, api=gpu)
    assert w.calls == 1 and w.calibration == [[1, pytest.approx(3e-3)]]
    assert [len(c) for c in gpu.windows(4)] == [1, 1, 1, 1]


def test_graph_capture_removes_the_launch_gaps_and_a_failed_capture_falls_back():
    # 2 us calls behind a 10 us launch gap each: launched one by one a window is launch-bound
    eager = FakeTimingCuda(launch_s=10 * US)
    slow = gputiming.time_case(eager.builder(lambda i: 2 * US), "cuda:0", 1, 5, api=eager)
    graph = FakeTimingCuda(launch_s=10 * US)
    fast = gputiming.time_case(graph.builder(lambda i: 2 * US), "cuda:0", 1, 5, capture=True, api=graph)
    assert slow.method == "cuda-events" and slow.per_call_s == pytest.approx([12 * US] * 5)
    assert fast.method == "cuda-graph" and graph.captures >= 1
    # one launch per window of K captured calls: (10 us + K * 2 us) / K
    assert fast.per_call_s == pytest.approx([(10 * US + fast.calls * 2 * US) / fast.calls] * 5)
    assert [len(c) for c in graph.windows(5)] == [fast.calls] * 5
    broken = FakeTimingCuda(capture_error=RuntimeError("operation not permitted when stream is capturing\nmore"))
    w = gputiming.time_case(broken.builder(lambda i: 2 * US), "cuda:0", 1, 3, capture=True, api=broken)
    assert w.method == "cuda-events" and w.graph_error == "RuntimeError: operation not permitted when stream is capturing"
    assert w.row()["graph_error"] == w.graph_error and "graph_error" not in fast.row()


def test_cold_cache_rotates_copies_larger_than_l2_and_no_call_repeats_a_copy():
    mib = 2**20
    gpu = FakeTimingCuda(l2_bytes=50 * mib)
    w = gputiming.time_case(gpu.builder(lambda i: 5 * US, nbytes=6 * mib), "cuda:0", 2, 4, cache="cold", api=gpu)
    copies = math.ceil(2 * 50 / 6)  # 17 copies of 6 MiB: 102 MiB >= 2 x the 50 MiB L2
    assert w.copies == copies == gpu.builds and w.rotation_bytes == copies * 6 * mib > 2 * 50 * mib
    assert w.calls % copies == 0 and w.calls * 5 * US >= gputiming.TARGET_WINDOW_S
    for calls in gpu.windows(4):  # every window starts at copy 0 and walks every copy in turn
        assert calls == [i % copies for i in range(w.calls)]
    row = w.row()
    assert (row["cache"], row["operand_copies"], row["l2_bytes"], row["l2_source"]) == \
        ("cold", copies, 50 * mib, "device properties")
    hot = FakeTimingCuda()
    gputiming.time_case(hot.builder(lambda i: 5 * US, nbytes=6 * mib), "cuda:0", 2, 4, api=hot)
    assert hot.builds == 1 and {c for w_ in hot.windows(4) for c in w_} == {0}


def test_cold_cache_without_an_l2_size_assumes_one_and_says_so():
    gpu = FakeTimingCuda(l2_bytes=None)
    w = gputiming.time_case(gpu.builder(lambda i: 5 * US, nbytes=64 * 2**20), "cuda:0", 0, 2, cache="cold", api=gpu)
    assert w.l2_bytes == gputiming.ASSUMED_L2 and "assumed" in w.l2_source
    assert w.rotation_bytes >= 2 * gputiming.ASSUMED_L2
    with pytest.raises(RuntimeError, match="allocated no device memory"):
        gputiming.time_case(gpu.builder(lambda i: 5 * US, nbytes=0), "cuda:0", 0, 2, cache="cold", api=gpu)


def test_the_median_window_is_reported_not_the_mean():
    dry = FakeTimingCuda()  # the same case once without a hiccup: where the timed calls start
    w = gputiming.time_case(dry.builder(lambda n: 8 * US), "cuda:0", 0, 9, api=dry)
    slow_call = dry.executed - 9 * w.calls + 5 * w.calls + 3  # a call in timed window 5 (of 0..8)
    gpu = FakeTimingCuda()
    w = gputiming.time_case(gpu.builder(lambda n: 2e-3 if n == slow_call else 8 * US), "cuda:0", 0, 9, api=gpu)
    samples = w.per_call_s
    from statistics import mean, median

    assert samples[5] == pytest.approx((w.calls * 8 * US + 2e-3 - 8 * US) / w.calls)  # the hiccup's window
    assert samples[:5] + samples[6:] == pytest.approx([8 * US] * 8)
    row = harness.rates(samples, 2e9, None, None, "median")
    assert row["time_us"] == pytest.approx(median(samples) * 1e6) == pytest.approx(8.0)
    assert mean(samples) * 1e6 > 8.1  # the mean would carry the hiccup
    assert row["tflops"] == pytest.approx(2e9 / median(samples) / 1e12)
    assert row["time_us_best"] == pytest.approx(min(samples) * 1e6)


def test_next_calls_and_calibrate_by_hand():
    assert gputiming.next_calls(1, 10 * US) == 110  # ceil(1 x 1 ms / 10 us x 1.1)
    assert gputiming.next_calls(100, 0.99e-3) == 112  # at least 10% more, ceil(100 x 1.1 / 0.99)
    assert gputiming.next_calls(17, 17 * 5 * US, step=17) == 17 * 13  # 17 x 1 ms / 85 us x 1.1 = 220 -> 221
    assert gputiming.next_calls(1, 0.0) == 16  # a window too short to read: 16x more calls
    assert gputiming.next_calls(10_000, 1e-9) == gputiming.MAX_CALLS
    k, tried = gputiming.calibrate(lambda calls: calls * 1e-9)  # 1 ns calls never reach 1 ms
    assert k == gputiming.MAX_CALLS and tried[-1][0] == gputiming.MAX_CALLS


def test_clocks_and_throttle_reasons_come_from_nvml_per_case(monkeypatch):
    from dlscale.monitor.clocks import GpuClocks

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18)])
    cuda_from_host(monkeypatch, host)
    gpu = FakeTimingCuda()
    clocks = GpuClocks(0)
    w = gputiming.time_case(gpu.builder(lambda i: 50 * US), "cuda:0", 0, 3, clocks=clocks, api=gpu)
    assert w.row()["sm_clock_mhz"] == 1755 and w.row()["throttle_reasons"] == []
    host.gpus[0].throttle = 0x40 | 0x4  # HW thermal slowdown + SW power cap
    w = gputiming.time_case(gpu.builder(lambda i: 50 * US), "cuda:0", 0, 3, clocks=clocks, api=gpu)
    assert w.row()["throttle_reasons"] == ["hw_thermal_slowdown", "sw_power_cap"]
    clocks.close()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # no bindings: a reason, empty samples
    none = GpuClocks(0)
    assert "NVML is not available" in none.reason and none.sample() == {"sm_clock_mhz": None, "throttle_reasons": None}


# -- energy: only for windows many counter updates long ----------------------------------------------
def _reading(seconds: float, joules: float) -> dict:
    return {"source": "nvml-total-energy", "domains": ["gpu"], "devices": ["GPU 0"], "per_device_j": [joules],
            "seconds": [seconds], "reason": None}


def test_energy_is_absent_for_windows_shorter_than_ten_counter_updates():
    short = harness.row_energy(_reading(0.0104, 6.0), 1e12, 1000, update_s=0.1)
    assert set(short) == {"energy_reason"}
    assert "10.4 ms is shorter than 10 x the 100 ms update period of nvml-total-energy" in short["energy_reason"]
    long_ = harness.row_energy(_reading(2.0, 1200.0), 1e12, 1000, update_s=0.1)
    assert long_["energy_j"] == 1200.0 and long_["avg_power_w"] == pytest.approx(600.0)
    assert long_["gflops_per_j"] == pytest.approx(1e12 * 1000 / 1200.0 / 1e9)  # F x calls / E
    assert harness.row_energy(_reading(0.0104, 6.0), 1e12, 1000, update_s=0.001)["energy_j"] == 6.0  # RAPL: 10 ms > 10 x 1 ms
    no_counter = {**_reading(0.0, 0.0), "reason": "no counter: NVML is not available"}
    assert harness.row_energy(no_counter, 1e12, 10, update_s=0.1) == {}  # the run's raw["energy"] says why


def test_counters_carry_their_update_periods():
    from dlscale.monitor import energy_counters as mon

    assert mon.NvmlTotalEnergy.update_s == 0.1 and mon.PowercapZone.update_s == 0.001
    assert mon.HwmonEnergy.update_s == mon.RAPL_UPDATE_S


# -- the harness on a fake GPU: the row's columns -------------------------------------------------------
class _Bench:
    name, title, columns = "fakegemm", "fake", ("i",)

    def __init__(self, gpu, device, durations):
        self.gpu, self.device, self.durations = gpu, device, durations

    def plan(self, opts, device):
        return Plan([Case({"i": i}, self.gpu.builder(lambda n, d=d: d, nbytes=2**20), flops=2e9, precision="bf16",
                          capture=True) for i, d in enumerate(self.durations)])

    def summarize(self, rows):
        return {"best_tflops": max(r["tflops"] for r in rows)}, {"best_tflops": "TFLOP/s"}


def test_harness_gpu_rows_report_median_k_method_cache_clock_and_why_no_energy(monkeypatch):
    import torch

    from dlscale.record import RunRecord

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18)])
    cuda_from_host(monkeypatch, host)
    from dlscale.harness import device as dev_mod

    monkeypatch.setattr(dev_mod, "set_matmul_precision", lambda p, d: None)  # leave torch's global flags alone
    gpu = FakeTimingCuda()
    monkeypatch.setattr(gputiming, "API", lambda device: gpu)
    dev = torch.device("cuda", 0)
    rec = RunRecord(kind="micro", workload="fakegemm", config={})
    out = harness.measure(_Bench(gpu, dev, [10 * US, 400 * US]), MicroOptions(reps=5), dev, {}, rec)
    small, big = out.raw["rows"]
    assert small["timing"] == "cuda-graph" and small["cache"] == "hot" and small["reps"] == 5
    assert small["calls_per_window"] * 10 * US >= 1e-3 and big["calls_per_window"] == 3  # ceil(1 ms / 400 us x 1.1)
    assert small["time_us"] == pytest.approx(10.0) and big["time_us"] == pytest.approx(400.0)
    assert small["window_us"] == pytest.approx(small["calls_per_window"] * 10.0)
    assert small["sm_clock_mhz"] == 1755 and small["throttle_reasons"] == []
    # the fake NVML energy counter exists, but 5 windows of ~1 ms are far below 10 x its 100 ms period
    assert "shorter than 10 x the 100 ms update period" in small["energy_reason"] and "energy_j" not in small
    assert out.units["row.calls_per_window"] == "calls" and out.units["row.sm_clock_mhz"] == "MHz"
    assert out.raw["times_s"][1] == pytest.approx([400 * US] * 5)  # per call, one per window (accept's samples)
    import io

    from rich.console import Console

    from dlscale.micro.report import kernel_footer, kernel_table

    rec.raw, rec.metrics, rec.config = out.raw, out.metrics, {"device": "cuda"}
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(kernel_table(rec, ("i",)))
    header, first = buf.getvalue().splitlines()[2], buf.getvalue().splitlines()[4]
    assert "K" in header.split() and "graph" in header and "SM MHz" in header
    assert [c.strip() for c in first.split("│")[-4:-1]] == [str(small["calls_per_window"]), "yes", "1755"]
    assert "median of timed windows of >= 1 ms" in kernel_footer(rec)[1] and "hot cache" in kernel_footer(rec)[1]


def test_cold_cache_on_a_cpu_is_a_usage_error(tmp_path):
    import torch

    from dlscale.errors import UsageError

    with pytest.raises(UsageError, match="needs a CUDA device"):
        harness.check_cache(MicroOptions(cache="cold"), torch.device("cpu"))
    with pytest.raises(UsageError, match="choose hot or cold"):
        MicroOptions(cache="lukewarm")
    harness.check_cache(MicroOptions(cache="cold"), torch.device("cuda", 0))  # fine where there is a GPU


# -- on a real GPU (skipped with the reason where there is none) ------------------------------------------
def median(xs):
    return stats.percentile(xs, 50)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("shape, precision", [((8192, 8192, 8192), "bf16"), ((1760, 16, 1760), "fp16"),
                                              ((2048, 2048, 2048), "fp32")])
def test_gpu_gemm_windows_of_at_least_1ms_vary_by_at_most_5pct(shape, precision):
    import torch

    from dlscale.micro import gemm

    dev = torch.device("cuda", torch.cuda.current_device())
    m, n, k = shape
    w = gputiming.time_case(lambda: gemm.build_gemm(m, n, k, False, False, precision, dev), dev, warmup=3, reps=20,
                            capture=True)
    window = median(w.per_call_s) * w.calls
    assert window >= 0.9e-3, (w.calls, w.calibration)  # the calibration's target, within timer noise
    assert w.method == "cuda-graph", w.graph_error
    assert stats.cv(w.per_call_s) <= 0.05, (w.per_call_s, w.calls)


@requires_cuda
@pytest.mark.gpu
def test_gpu_cold_cache_rotates_past_the_l2_and_is_not_faster_than_hot():
    import torch

    from dlscale.micro import gemm

    dev = torch.device("cuda", torch.cuda.current_device())
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    build = lambda: gemm.build_gemm(1024, 1024, 1024, False, False, "fp16", dev)  # noqa: E731 - 6 MiB of operands
    hot = gputiming.time_case(build, dev, 3, 15, "hot", capture=True)
    cold = gputiming.time_case(build, dev, 3, 15, "cold", capture=True)
    assert cold.l2_bytes == l2 and cold.rotation_bytes >= 2 * l2 and cold.calls % cold.copies == 0
    assert median(cold.per_call_s) >= 0.97 * median(hot.per_call_s)


def _rows(cli, tmp_path, kind: str, precision: str, shapes: str, iters: int) -> list[dict]:
    """The rows of ``dlscale micro KIND`` on the GPU with these shapes (a CSV's text)."""
    import json

    p = tmp_path / f"{kind}.csv"
    p.write_text(shapes)
    r = cli("micro", kind, "--device", "cuda", "--precision", precision, "--shapes", str(p), "--iters", str(iters),
            "--format", "json")
    assert r.code == 0, r.stderr
    return json.loads(r.stdout)["rows"]


@requires_cuda
@pytest.mark.gpu
def test_gpu_micro_gemm_rows_record_timing_clock_and_keep_cv_within_5pct(cli, db_path, tmp_path):
    shapes = "m,n,k,a_t,b_t\n8192,8192,8192,0,0\n4096,4096,4096,0,0\n1760,16,1760,0,0\n"
    for row in _rows(cli, tmp_path, "gemm", "bf16", shapes, 20):
        assert row["timing"] in ("cuda-graph", "cuda-events") and row["cache"] == "hot"
        assert row["calls_per_window"] >= 1 and "sm_clock_mhz" in row and "throttle_reasons" in row
        if row["window_us"] >= 1000:
            assert row["cv"] <= 0.05, row


@requires_cuda
@pytest.mark.gpu
def test_gpu_conv_and_rnn_say_which_cases_ran_as_graphs(cli, db_path, tmp_path):
    conv = _rows(cli, tmp_path, "conv", "bf16", "w,h,c,n,k,s,r,pad_w,pad_h,stride_w,stride_h\n56,56,64,16,64,3,3,1,1,1,1\n", 5)
    assert {row["timing"] for row in conv} <= {"cuda-graph", "cuda-events"}
    rnn = _rows(cli, tmp_path, "rnn", "fp16", "hidden,batch,timesteps,cell\n256,16,10,lstm\n", 5)
    timing = {row["pass"]: row["timing"] for row in rnn}
    assert timing["bwd_data"] == "cuda-events" and timing["bwd_weights"] == "cuda-graph"
