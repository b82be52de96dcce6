"""Every GPU at once (micro/node.py, micro/concurrent.py) on fake GPUs (tests/fakes_gpu.py: a fake NVML and
one simulated GPU clock per device): a case's timed windows on every device open together, each device's
figure is its own, the node's energy is its devices' over those windows, a slow device is named against
its peers; and the planning that groups GEMM and the device copy per device."""

from __future__ import annotations

import threading

import pytest
from conftest import requires_cuda
from fakes_gpu import FakeGpu, FakeTimingCuda, cuda_from_host, fake_cuda, fake_nvml

from dlscale.micro import concurrent, gputiming, harness
from dlscale.micro.base import Case, MicroOptions, Plan
from dlscale.micro.node import at_once_sums, schedule

H100 = "NVIDIA H100 80GB HBM3"
US = 1e-6


class _Gemm:
    """Cases shaped as micro gemm's rows, one per (shape, device), grouped per shape (as gemm.plan with
    every_device). ``durations[d][i]``: seconds per call of shape i on device d; ``joules[d]``: the energy
    each call of device d adds to its GPU's NVML counter; ``during(d)``: called on every call of device d."""

    name, title, columns = "gemm", "fake gemm", ("m", "n", "k", "device")

    def __init__(self, fakes, durations, host=None, joules=None, during=None, jitter=0.0):
        self.fakes, self.durations, self.host, self.joules, self.during = fakes, durations, host, joules, during
        self.jitter = jitter  # call n takes (1 + jitter x (n mod 5)) x its duration: samples that vary

    def _call(self, d: int, seconds: float, n: int) -> float:
        seconds *= 1 + self.jitter * (n % 5)
        if self.joules:
            self.host.gpus[d].energy_mj += int(self.joules[d] * 1e3)
        if self.during:
            self.during(d)
        return seconds

    def plan(self, opts, device):
        import torch

        cases = []
        for d, gpu in enumerate(self.fakes):
            where = torch.device("cuda", d)
            for i, t in enumerate(self.durations[d]):
                k = 1024 * (i + 1)
                cases.append(Case({"set": "fake", "m": 1024, "n": 1024, "k": k, "a_t": 0, "b_t": 0, "precision": "bf16",
                                   "device": str(where)}, gpu.builder(lambda n, d=d, t=t: self._call(d, t, n)),
                                  flops=2 * 1024 * 1024 * k, precision="bf16", device=where, capture=True,
                                  group=("gemm", i)))
        return Plan(cases)

    def summarize(self, rows):
        from dlscale.micro import gemm

        return gemm.summarize(rows)


def _gpus(monkeypatch, n: int, **gpu):
    """A fake server of ``n`` H100s (NVML and torch.cuda) and one simulated GPU clock per device."""
    import torch

    from dlscale.harness import device as dev_mod

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18 + 0x10 * i, **gpu) for i in range(n)])
    cuda_from_host(monkeypatch, host)
    monkeypatch.setattr(dev_mod, "set_matmul_precision", lambda p, d: None)  # leave torch's global flags alone
    fakes = [FakeTimingCuda() for _ in range(n)]
    monkeypatch.setattr(gputiming, "API", lambda device: fakes[torch.device(device).index])
    return host, fakes


def _measure(bench, opts):
    import torch

    from dlscale.record import RunRecord

    rec = RunRecord(kind="micro", workload=bench.name, config={"device": "cuda", "device_name": H100})
    out = harness.measure(bench, opts, torch.device("cuda", 0), {}, rec)
    rec.metrics, rec.units, rec.raw, rec.status = out.metrics, out.units, out.raw, "ok"
    return rec


def test_schedule_runs_the_cases_of_one_group_together_in_plan_order():
    a0, a1 = Case({"i": 0}, None, group=("g", 0)), Case({"i": 0}, None, group=("g", 0))
    b0, b1 = Case({"i": 1}, None, group=("g", 1)), Case({"i": 1}, None, group=("g", 1))
    alone = Case({"host": 1}, None)
    assert schedule([alone, a0, b0, a1, b1]) == [[alone], [a0, a1], [b0, b1]]


def test_no_device_times_a_window_before_every_device_has_opened_its_windows(monkeypatch):
    """Each device's calls in its timed windows wait (up to 10 s) for the other device to have opened
    this case's windows: were the devices timed one after the other, the first would wait in vain."""
    opened = {0: 0, 1: 0}  # cases whose timed windows each device has opened
    timing = {0: False, 1: False}
    cond = threading.Condition()
    met: list[bool] = []
    begin, end = concurrent.Gate.begin, concurrent.Gate.end

    def me() -> int:
        return int(threading.current_thread().name.rsplit("-", 1)[1])

    def opening(self):
        begin(self)
        with cond:
            opened[me()] += 1
            timing[me()] = True
            cond.notify_all()

    def closing(self):
        timing[me()] = False
        end(self)

    def during(d: int) -> None:
        if timing.get(d):
            with cond:
                met.append(cond.wait_for(lambda: opened[1 - d] >= opened[d], timeout=10))

    monkeypatch.setattr(concurrent.Gate, "begin", opening)
    monkeypatch.setattr(concurrent.Gate, "end", closing)
    _, fakes = _gpus(monkeypatch, 2)
    rec = _measure(_Gemm(fakes, [[20 * US, 300 * US], [20 * US, 300 * US]], during=during), MicroOptions(reps=4))
    assert met and all(met), f"{met.count(False)} of {len(met)} timed calls ran while the other device had not opened"
    rows = rec.raw["rows"]
    assert [(r["device"], r["k"], r["at_once"]) for r in rows] == [
        ("cuda:0", 1024, 2), ("cuda:1", 1024, 2), ("cuda:0", 2048, 2), ("cuda:1", 2048, 2)]
    assert rec.raw["node"]["devices"] == ["cuda:0", "cuda:1"] and rec.raw["node"]["groups"] == 2


def test_each_devices_figure_is_its_own_and_the_node_sums_them(monkeypatch):
    host, fakes = _gpus(monkeypatch, 3)
    slow = [[400 * US, 400 * US], [400 * US, 400 * US], [500 * US, 500 * US]]  # GPU 2 is 20% slower
    rec = _measure(_Gemm(fakes, slow), MicroOptions(reps=5))
    by = {(r["device"], r["k"]): r for r in rec.raw["rows"]}
    flops = 2 * 1024 * 1024 * 2048  # the larger shape in the same time: every device's best
    assert by[("cuda:2", 2048)]["tflops"] == pytest.approx(flops / 500e-6 / 1e12)
    assert by[("cuda:0", 2048)]["tflops"] == pytest.approx(flops / 400e-6 / 1e12)
    m = rec.metrics
    assert m["best_tflops_by_device"] == pytest.approx([flops / 400e-6 / 1e12] * 2 + [flops / 500e-6 / 1e12])
    assert m["node_best_tflops"] == pytest.approx(sum(m["best_tflops_by_device"]))  # the bigger shape on all
    assert m["node_best_case"] == "1024x1024x2048 a_t=0 b_t=0 bf16" and m["node_devices"] == 3
    assert rec.units["node_best_tflops"] == "TFLOP/s" and rec.units["row.at_once"] == "devices"


def test_a_device_below_its_peers_is_named_and_failed(monkeypatch):
    from dlscale.accept import acceptance as run
    from dlscale.accept.plan import spec

    host, fakes = _gpus(monkeypatch, 4)
    durations = [[400 * US]] * 3 + [[500 * US]]  # GPU 3 at 0.8 of its peers
    rec = _measure(_Gemm(fakes, durations, jitter=0.002), MicroOptions(reps=8))
    rec.system = {"accelerators": {"devices": [{"index": i, "name": H100} for i in range(4)]}}
    peers = [v for v in run.judge([rec], spec.builtin(True)) if v.expectation == "peers"]
    assert {v.subject: v.status for v in peers} == {"GPU 0": "PASS", "GPU 1": "PASS", "GPU 2": "PASS", "GPU 3": "FAIL"}
    failed = next(v for v in peers if v.status == "FAIL")
    assert failed.ratio == pytest.approx(0.8, rel=0.01) and "median of 3 peer(s)" in failed.source


def test_the_nodes_energy_is_each_devices_over_the_windows_opened_together(monkeypatch):
    """GPU 1 draws twice GPU 0's energy per call: the node's energy over the timed windows is exactly
    the timed calls' (the warm-up and calibration calls fall outside), its power each device's summed."""
    from dlscale.monitor import energy_counters as mon

    monkeypatch.setattr(mon.NvmlTotalEnergy, "update_s", 0.0)  # the fake counter changes on every read
    host, fakes = _gpus(monkeypatch, 2)
    bench = _Gemm(fakes, [[200 * US], [200 * US]], host=host, joules=[0.5, 1.0])
    rec = _measure(bench, MicroOptions(reps=6))
    rows = rec.raw["rows"]
    calls = [r["calls_per_window"] * r["reps"] for r in rows]
    m = rec.metrics
    assert m["node_energy_j"] == pytest.approx(0.5 * calls[0] + 1.0 * calls[1])
    assert [r["energy_j"] for r in rows] == pytest.approx([0.5 * calls[0], 1.0 * calls[1]])
    by = m["node_power_by_device_w"]
    assert by[1] == pytest.approx(2 * by[0]) and m["node_avg_power_w"] == pytest.approx(sum(by))
    assert m["node_avg_power_w"] == pytest.approx(m["node_energy_j"] / m["node_metered_s"])
    assert rec.raw["node"]["energy"]["source"] == "nvml-total-energy"
    from dlscale.micro.report import window_lines

    lines = window_lines(rec)
    assert lines[0].startswith("every GPU at once: 2 GPUs") and "best case summed" in lines[0]
    assert lines[1].startswith("node power ") and "W over" in lines[1]
    import io

    from rich.console import Console

    from dlscale.micro.report import print_record

    buf = io.StringIO()
    print_record(rec, Console(file=buf, width=200, color_system=None))
    assert "every GPU at once: 2 GPUs" in buf.getvalue() and "TFLOP/s, median" in buf.getvalue()  # and gemm's footer


def test_without_nvml_energy_the_node_figures_say_why(monkeypatch):
    _, fakes = _gpus(monkeypatch, 2, energy_mj=None, power_mw=None)
    rec = _measure(_Gemm(fakes, [[100 * US], [100 * US]]), MicroOptions(reps=3))
    assert "node_avg_power_w" not in rec.metrics and rec.metrics["node_devices"] == 2
    assert "neither NVML's total-energy counter" in rec.raw["node"]["energy"]["reason"]
    from dlscale.micro.report import window_lines

    assert window_lines(rec)[1].startswith("node power: none (no counter: this GPU has neither")


def test_a_device_that_fails_stops_the_others_and_its_error_is_raised(monkeypatch):
    _, fakes = _gpus(monkeypatch, 3)

    def during(d: int) -> None:
        if d == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        _measure(_Gemm(fakes, [[50 * US]] * 3, during=during), MicroOptions(reps=3))


def test_gemm_and_the_device_copy_are_grouped_per_device_host_transfers_are_not(monkeypatch):
    import torch

    from dlscale.micro import gemm, memory

    fake_cuda(monkeypatch, [H100] * 2)
    plan = gemm.plan(MicroOptions(precisions=("bf16",), every_device=True), torch.device("cuda", 0))
    groups = schedule(plan.cases)
    assert all(len(g) == 2 and [c.device.index for c in g] == [0, 1] for g in groups)
    assert all(g[0].labels["k"] == g[1].labels["k"] and g[0].labels["m"] == g[1].labels["m"] for g in groups)
    assert all(c.group is None for c in gemm.plan(MicroOptions(precisions=("bf16",)), torch.device("cuda", 0)).cases)
    mem = memory.plan(MicroOptions(every_device=True, mem_mib=8), torch.device("cuda", 0))
    together = [[c.labels["op"] for c in g] for g in schedule(mem.cases) if len(g) > 1]
    assert together == [["d2d", "d2d"]]  # h2d/d2h: each GPU over its own link, in turn
    cpu = gemm.plan(MicroOptions(every_device=True), torch.device("cpu"))
    assert all(c.group is None for c in cpu.cases)  # a CPU is one device


def test_node_sums_of_the_cases_run_at_once():
    rows = [{"op": "d2d", "gbps": 4000.0, "at_once": 2}, {"op": "d2d", "gbps": 3900.0, "at_once": 2},
            {"op": "h2d_pinned", "gbps": 55.0}, {"op": "h2d_pinned", "gbps": 54.0}]
    assert at_once_sums(rows, ("op",), "gbps") == {("d2d",): 7900.0}
    from dlscale.micro import memory

    metrics, units = memory.summarize([{**r, "where": f"cuda:{i % 2}", "gbps_best": r["gbps"]} for i, r in enumerate(rows)])
    assert metrics["d2d_gbps_node"] == 7900.0 and units["d2d_gbps_node"] == "GB/s" and "h2d_pinned_gbps_node" not in metrics


def test_run_together_runs_each_job_on_its_own_thread_with_one_gate():
    names, gates = [], set()

    def job(i):
        def run(gate):
            gate.begin()
            names.append(threading.current_thread().name)
            gates.add(id(gate))
            gate.end()
            return i * 10
        return run

    assert concurrent.run_together([job(i) for i in range(3)]) == [0, 10, 20]
    assert sorted(names) == ["dlscale-device-0", "dlscale-device-1", "dlscale-device-2"] and len(gates) == 1


@requires_cuda
@pytest.mark.gpu
def test_gpu_gemm_on_every_gpu_at_once_with_windows_of_the_target(cli, db_path, tmp_path):
    """On the real GPUs: every shape on every GPU at once (CUDA graphs captured one at a time, in
    thread-local mode, while the other GPUs' threads work), each row's windows lasting the target."""
    import json

    import torch

    p = tmp_path / "g.csv"
    p.write_text("m,n,k,a_t,b_t\n4096,4096,4096,0,0\n1760,128,1760,0,0\n")
    r = cli("micro", "gemm", "--device", "cuda", "--precision", "bf16", "--shapes", str(p), "--every-device",
            "--min-duration", "0.3", "--format", "json")
    assert r.code == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    n = torch.cuda.device_count()
    rows = [x for x in doc["rows"] if x["set"] == "user"]
    assert len(rows) == 2 * n and {x["at_once"] for x in rows} == {n}
    for x in rows:
        assert x["timing"] == "cuda-graph", x.get("graph_error")
        assert x["sizing"]["target_s"] == 0.3 and x["window_us"] * x["reps"] / 1e6 >= 0.3 * 0.8, x["sizing"]
    m = doc["metrics"]
    assert m["node_devices"] == n and m["node_best_tflops"] >= max(m["best_tflops_by_device"])
    assert doc["node"]["devices"] == [f"cuda:{i}" for i in range(n)]
