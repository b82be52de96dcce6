"""Energy over the measured window: RAPL (with its wrap-around), AMD hwmon, NVML counters, the figures.

No machine here has a counter, so every counter is a fake with known values: a powercap or hwmon
tree the test writes (chosen by DLSCALE_POWERCAP_ROOT / DLSCALE_HWMON_ROOT) and the fake NVML of
fakes_gpu.py; the joules expected are computed by hand.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from dlscale.harness import energy_meter as energy
from dlscale.harness.energy_meter import EnergyMeter
from dlscale.monitor import energy_counters as counters

INTEL_RANGE_UJ = 262_143_328_850  # a real package zone's max_energy_range_uj


def write(path: Path, value: object) -> None:
    """Replace a counter file at once, as sysfs shows a value (a reader never sees it half written)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


def powercap_tree(root: Path, zones: dict[str, tuple[str, int, int]]) -> Path:
    """``zones``: directory -> (name, energy_uj, max_energy_range_uj)."""
    root.mkdir(parents=True, exist_ok=True)
    for d, (name, uj, rng) in zones.items():
        z = root / d
        z.mkdir()
        (z / "name").write_text(name + "\n")
        write(z / "energy_uj", uj)
        (z / "max_energy_range_uj").write_text(f"{rng}\n")
    return root


@pytest.fixture
def no_counters(tmp_path, monkeypatch):
    """This host's counters hidden: an empty powercap and hwmon tree."""
    (tmp_path / "no-powercap").mkdir()
    (tmp_path / "no-hwmon").mkdir()
    monkeypatch.setenv(counters.POWERCAP_ENV, str(tmp_path / "no-powercap"))
    monkeypatch.setenv(counters.HWMON_ENV, str(tmp_path / "no-hwmon"))


def test_wrapped_delta_by_hand():
    assert counters.wrapped_delta(100, 350, 1000) == 250
    assert counters.wrapped_delta(900, 50, 1000) == 150  # 100 to the top, then 50 past 0


def test_powercap_window_across_a_wrap_gives_exact_joules(tmp_path, monkeypatch, no_counters):
    root = powercap_tree(tmp_path / "powercap", {
        "intel-rapl:0": ("package-0", INTEL_RANGE_UJ - 2_000_000, INTEL_RANGE_UJ),  # 2 J below the wrap
        "intel-rapl:0:0": ("core", 5, INTEL_RANGE_UJ),  # inside the package: not added
        "intel-rapl:0:1": ("dram", 10_000_000, INTEL_RANGE_UJ),
        "intel-rapl:1": ("psys", 7, INTEL_RANGE_UJ),  # the whole platform: not added
    })
    monkeypatch.setenv(counters.POWERCAP_ENV, str(root))
    with EnergyMeter() as meter:
        assert [c.name for c in meter.counters] == ["package-0", "dram-0"]
        meter.begin()
        write(root / "intel-rapl:0" / "energy_uj", 3_000_000)  # wrapped: 2 J to the top + 3 J
        write(root / "intel-rapl:0:1" / "energy_uj", 12_500_000)
        meter.end()
        r = meter.reading()
    assert r["per_device_j"] == [5.0, 2.5]
    assert (r["source"], r["domains"], r["reason"]) == ("rapl", ["dram", "package"], None)


def test_windows_add_up_and_only_window_energy_counts(tmp_path, monkeypatch, no_counters):
    root = powercap_tree(tmp_path / "pc", {"intel-rapl:0": ("package-0", 0, INTEL_RANGE_UJ)})
    monkeypatch.setenv(counters.POWERCAP_ENV, str(root))
    f = root / "intel-rapl:0" / "energy_uj"
    with EnergyMeter() as meter:
        for before, after in ((1_000_000, 4_000_000), (9_000_000, 10_000_000)):
            write(f, before)  # energy between windows (the explanation steps, a new model) is not counted
            meter.begin()
            write(f, after)
            meter.end()
        assert meter.reading()["per_device_j"] == [4.0]
        assert meter.windows == 2


def test_the_wrap_period_sets_how_often_a_zone_is_read(tmp_path):
    root = powercap_tree(tmp_path / "pc", {"intel-rapl:0": ("package-0", 0, INTEL_RANGE_UJ),
                                           "intel-rapl:1": ("package-1", 0, 4_000_000_000)})
    big, small = counters.powercap_zones(root)[0]
    assert big.poll_s == 1.0  # 262 kJ at 1 kW wraps after 262 s: once a second is plenty
    assert small.poll_s == pytest.approx(4000 / 1000 / 4)  # 4 kJ: every second at most


def test_amd_energy_hwmon_sockets(tmp_path, monkeypatch, no_counters):
    hw = tmp_path / "hwmon" / "hwmon3"
    hw.mkdir(parents=True)
    (hw / "name").write_text("amd_energy\n")
    for i, (label, uj) in enumerate((("Esocket0", 1_000_000), ("Ecore000", 5), ("Esocket1", 2_000_000)), 1):
        (hw / f"energy{i}_label").write_text(label + "\n")
        write(hw / f"energy{i}_input", uj)
    monkeypatch.setenv(counters.HWMON_ENV, str(tmp_path / "hwmon"))
    with EnergyMeter() as meter:
        meter.begin()
        write(hw / "energy1_input", 8_000_000)
        write(hw / "energy3_input", 2_250_000)
        meter.end()
        r = meter.reading()
    assert r["devices"] == ["socket-0", "socket-1"] and r["per_device_j"] == [7.0, 0.25]
    assert r["source"] == "amd-energy"


def test_nvml_total_energy_counter(monkeypatch):
    import torch
    from fakes_gpu import cuda_from_host, fake_nvml

    host = fake_nvml(monkeypatch, gpus=["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    cuda_from_host(monkeypatch, host)
    with EnergyMeter(torch.device("cuda", 1)) as meter:
        meter.begin()
        host.gpus[1].energy_mj += 500_000
        host.gpus[0].energy_mj += 999_000  # another GPU: not this run's
        meter.end()
        r = meter.reading("rank 1")
    assert r["per_device_j"] == [500.0]
    assert (r["source"], r["devices"], r["domains"]) == ("nvml-total-energy", ["rank 1: GPU 1"], ["gpu"])


def test_nvml_power_is_integrated_where_the_gpu_has_no_energy_counter(monkeypatch):
    from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(name="Tesla P100-PCIE-16GB", energy_mj=None, power_mw=200_000)])
    cuda_from_host(monkeypatch, host)
    found = counters.gpu_counters(0)
    assert found.source == "nvml-power-integrated" and found.reason is None
    found.counters[0].close()
    nv = host.module
    ticks = iter([0.0, 1.0, 3.0])
    c = counters.NvmlPowerIntegrated(nv, nv.nvmlDeviceGetHandleByIndex(0), "GPU 0", clock=lambda: next(ticks))
    host.gpus[0].power_mw = 300_000
    assert c.total_j() == pytest.approx(1.0 * (200 + 300) / 2)  # trapezoid over the first second
    host.gpus[0].power_mw = 100_000
    assert c.total_j() == pytest.approx(250 + 2.0 * (300 + 100) / 2)


def test_a_gpu_with_neither_counter_says_why(monkeypatch):
    from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(energy_mj=None, power_mw=None)])
    cuda_from_host(monkeypatch, host)
    found = counters.gpu_counters(0)
    assert found.counters == [] and "neither NVML's total-energy counter" in found.reason


def test_no_nvml_says_why(monkeypatch):
    monkeypatch.setattr(counters.nvml, "start", lambda: None)
    assert counters.gpu_counters(0).reason.startswith("no counter: NVML is not available")


def test_figures_by_hand():
    reading = {"source": "nvml-total-energy", "domains": ["gpu"], "devices": ["rank 0: GPU 0", "rank 1: GPU 1"],
               "per_device_j": [120.0, 80.0], "seconds": [2.0, 2.5], "reason": None}
    m, u, raw = energy.figures(reading, units_done=1000, unit="images")
    assert m == {"energy_j": 200.0, "energy_per_unit_j": 0.2, "units_per_joule": 5.0, "avg_power_w": 60.0 + 32.0}
    assert u == {"energy_j": "J", "energy_per_unit_j": "J/images", "units_per_joule": "images/J", "avg_power_w": "W"}
    assert raw["energy_per_device_j"] == [120.0, 80.0] and "per_device_j" not in raw["energy"]


def test_a_counter_that_did_not_move_gives_a_reason_not_zero():
    reading = {"source": "rapl", "domains": ["package"], "devices": ["package-0"], "per_device_j": [0.0],
               "seconds": [0.004], "reason": None}
    m, u, raw = energy.figures(reading, units_done=64, unit="images")
    assert m == {} and u == {} and "did not advance" in raw["energy"]["reason"]


def test_a_job_counts_each_gpu_once_and_each_host_cpu_once():
    from dlscale.distributed.worker import job_readings

    def rd(dev, domain, j):
        return {"source": "x", "domains": [domain], "devices": [dev], "per_device_j": [j], "seconds": [1.0], "reason": None}

    gpus = [{"host": "a", "energy": rd("rank 0: GPU 0", "gpu", 10)}, {"host": "a", "energy": rd("rank 1: GPU 1", "gpu", 20)}]
    assert energy.combine(job_readings(gpus))["per_device_j"] == [10, 20]
    cpus = [{"host": "a", "energy": rd("host a: package-0", "package", 30)},
            {"host": "a", "energy": rd("host a: package-0", "package", 31)},  # the same package, read by rank 1
            {"host": "b", "energy": rd("host b: package-0", "package", 40)}]
    assert energy.combine(job_readings(cpus))["per_device_j"] == [30, 40]
    missing = energy.combine([rd("x", "gpu", 1), energy.absent("rank 1: no counter: why")])
    assert missing["reason"] == "rank 1: no counter: why" and missing["per_device_j"] == []


def test_a_run_without_a_counter_records_why_and_no_energy(no_counters, db_path):
    from dlscale import api

    rec = api.train("tinycnn", batch_size=4, steps=2, warmup_steps=1, device="cpu", monitor_interval=0,
                    breakdown_steps=0)
    assert not any(k in rec.metrics for k in energy.UNITS)
    assert rec.raw["energy"]["reason"].startswith("no counter: no RAPL zone under")
    assert rec.raw["energy_per_device_j"] == []


class RampingCounter:
    """A package zone whose counter rises at ``watts`` in another thread (like a CPU drawing that power)."""

    def __init__(self, root: Path, watts: float, range_uj: int):
        self.root = powercap_tree(root, {"intel-rapl:0": ("package-0", 0, range_uj)})
        self.f, self.watts, self.range_uj = self.root / "intel-rapl:0" / "energy_uj", watts, range_uj
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(0.002):
            write(self.f, int((time.monotonic() - t0) * self.watts * 1e6) % self.range_uj)

    def __enter__(self) -> "RampingCounter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.slow
@pytest.mark.long
def test_two_rank_run_reports_joules_per_image_from_a_wrapping_counter(tmp_path, no_counters, monkeypatch,
                                                                       cli_subprocess):
    """Two CPU ranks on one host share its package: its energy is counted once. The fake counter
    rises at 10 W and wraps every 0.5 s (range 5 J), so the window spans several wraps."""
    with RampingCounter(tmp_path / "powercap", watts=10.0, range_uj=5_000_000) as ramp:
        res = cli_subprocess("train", "tinycnn", "--batch-size", "8", "--steps", "40", "--warmup-steps", "2",
                             "--nproc-per-node", "2", "--threads-per-rank", "1", "--monitor-interval", "0", "--device", "cpu",
                             "--breakdown-steps", "0", "--timeout", "120", "--format", "json",
                             env={counters.POWERCAP_ENV: str(ramp.root)})
    assert res.code == 0, res.stderr[-3000:]
    rec = json.loads(res.stdout)
    m, u, raw = rec["metrics"], rec["units"], rec["raw"]
    assert raw["energy"]["source"] == "rapl" and len(raw["energy_per_device_j"]) == 1  # one host: one package
    assert raw["energy"]["devices"][0].endswith(": package-0")
    images = 2 * 8 * 40
    assert m["energy_j"] == pytest.approx(sum(raw["energy_per_device_j"]))
    assert m["energy_per_unit_j"] == pytest.approx(m["energy_j"] / images)
    assert u["energy_per_unit_j"] == "J/images" and u["units_per_joule"] == "images/J"
    # 10 W over the metered window; counted twice (both ranks) it would be 20 W, a lost wrap far less.
    assert 7.0 < m["avg_power_w"] < 13.0
    assert m["energy_j"] == pytest.approx(10.0 * raw["energy"]["seconds"][0], rel=0.3)


@pytest.mark.long
def test_one_process_run_with_a_counter(tmp_path, no_counters, monkeypatch, db_path):
    from dlscale import api

    with RampingCounter(tmp_path / "powercap", watts=50.0, range_uj=INTEL_RANGE_UJ) as ramp:
        monkeypatch.setenv(counters.POWERCAP_ENV, str(ramp.root))
        rec = api.train("tinycnn", batch_size=4, steps=30, warmup_steps=1, device="cpu", monitor_interval=0,
                        breakdown_steps=0, repeat=2)
    m = rec.metrics
    assert rec.raw["energy"]["reason"] is None and m["energy_j"] > 0
    assert m["energy_per_unit_j"] == pytest.approx(m["energy_j"] / (4 * 30 * 2))
    assert m["units_per_joule"] == pytest.approx(1 / m["energy_per_unit_j"])
    assert 25.0 < m["avg_power_w"] < 75.0


def test_gemm_rows_have_gflop_per_joule(tmp_path, no_counters, monkeypatch, cli):
    p = tmp_path / "g.csv"
    p.write_text("m,n,k,a_t,b_t\n256,256,256,0,0\n")
    with RampingCounter(tmp_path / "powercap", watts=100.0, range_uj=INTEL_RANGE_UJ) as ramp:
        monkeypatch.setenv(counters.POWERCAP_ENV, str(ramp.root))
        r = cli("micro", "gemm", "--shapes", str(p), "--warmup", "1", "--iters", "200", "--device", "cpu",
                "--format", "json")
    assert r.code == 0, r.stderr
    row = json.loads(r.stdout)["rows"][0]
    assert row["gflops_per_j"] == pytest.approx(row["flops"] * row["reps"] / row["energy_j"] / 1e9)
    assert 50.0 < row["avg_power_w"] < 150.0


def test_inference_energy_per_batch_size_and_at_the_best(tmp_path, no_counters, monkeypatch, db_path):
    from dlscale import api

    with RampingCounter(tmp_path / "powercap", watts=20.0, range_uj=INTEL_RANGE_UJ) as ramp:
        monkeypatch.setenv(counters.POWERCAP_ENV, str(ramp.root))
        rec = api.infer("tinycnn", batch_sizes=(1, 8), iters=40, warmup=2, device="cpu")
    m = rec.metrics
    assert len(m["energy_per_unit_j_by_batch"]) == 2 and all(x > 0 for x in m["energy_per_unit_j_by_batch"])
    best = m["batch_sizes"].index(m["best_batch_size"])
    assert m["energy_per_unit_j"] == m["energy_per_unit_j_by_batch"][best]
    assert m["energy_per_unit_j"] == pytest.approx(m["energy_j"] / (m["best_batch_size"] * 40))
    assert rec.units["energy_per_unit_j_by_batch"] == "J/images"
    assert rec.raw["energy"]["source"] == "rapl"


class SetCounter(counters.Counter):
    """A counter whose total the test sets."""

    source = "rapl"

    def __init__(self) -> None:
        super().__init__("package-0", "package")
        self.j = 1000.0

    def total_j(self) -> float:
        return self.j


def test_energy_to_target_is_the_joules_at_the_target_point():
    from types import SimpleNamespace

    from dlscale.tta.epochs import Progress, Ranks, energy_outcome, run_energy

    c = SetCounter()
    p = Progress(t0=0.0, prior_j=50.0)  # resumed: 50 J before the checkpoint
    p.meter = EnergyMeter(found=counters.DeviceCounters([c]))
    p.meter.begin()
    s = SimpleNamespace(progress=p, ranks=Ranks())
    points = []
    for used, reached in ((3.6e6, False), (7.2e6, True)):  # 1 kWh per epoch
        c.j += used
        point = {"epoch": len(points) + 1, "energy_j": run_energy(s), "reached": reached}
        points.append(point)
    p.curve, p.hit = points, points[1]
    p.meter.end()
    p.meter.close()
    m, u, raw = energy_outcome(p)
    assert m["energy_to_target_kwh"] == pytest.approx((50 + 3.6e6 + 7.2e6) / 3.6e6)  # 3.0000139 kWh
    assert u == {"energy_j": "J", "energy_to_target_kwh": "kWh"} and raw["energy"]["source"] == "rapl"
    none = Progress(t0=0.0)
    none.meter = EnergyMeter(found=counters.DeviceCounters([], "no counter: here"))
    none.curve = [{"energy_j": None}]
    m, _, raw = energy_outcome(none)
    assert m == {} and raw["energy"]["reason"] == "no counter: here"


def test_imported_power(tmp_path):
    """An MLPerf power result: 8 GPUs at 28,000 images/s drawing 5,600 W; training to target in 1,800 s
    using 10.8 MJ."""
    from dlscale.importers.records import parse_file, to_record

    f = tmp_path / "power.csv"
    f.write_text("system,model,nodes,devices_per_node,throughput,time_to_accuracy_s,avg_power_w,energy_j\n"
                 "srv-a,resnet50,1,8,28000,,5600,\n"
                 "srv-a,resnet50,1,8,,1800,,10800000\n")
    thr, tta = (to_record(r, str(f), "mlperf") for r in parse_file(f, "csv"))
    assert thr.metrics["units_per_joule"] == pytest.approx(5.0) and thr.metrics["energy_per_unit_j"] == pytest.approx(0.2)
    assert thr.units["units_per_joule"] == "images/J" and thr.raw["energy"]["source"] == "imported (csv)"
    assert tta.metrics["energy_to_target_kwh"] == pytest.approx(3.0) and tta.metrics["avg_power_w"] == pytest.approx(6000)


@pytest.mark.long
def test_llm_decode_joules_per_generated_token(tmp_path, no_counters, monkeypatch):
    from dlscale.infer.llm import run_llm_inference

    with RampingCounter(tmp_path / "powercap", watts=30.0, range_uj=INTEL_RANGE_UJ) as ramp:
        monkeypatch.setenv(counters.POWERCAP_ENV, str(ramp.root))
        m, u, raw, _ = run_llm_inference("llama_tiny", batch_sizes=[1, 2], prompt_len=8, output_len=8,
                                         precision="fp32", device="cpu", warmup=1, iters=2)
    assert len(m["energy_per_unit_j_by_batch"]) == 2 and u["energy_per_unit_j"] == "J/tokens"
    assert m["energy_per_unit_j"] == pytest.approx(m["energy_j"] / (2 * 8 * 2))  # the headline (largest) batch
    assert raw["energy"]["source"] == "rapl"
