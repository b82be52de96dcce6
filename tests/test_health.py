"""GPU health (monitor/health.py) on a fake NVML: throttle reasons, ECC, retirement/remap, Xid, sysinfo --health."""

from __future__ import annotations

import json
import sys

import pytest

from dlscale.monitor import health
from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml


def test_reason_bits_are_nvmls():
    import pynvml

    for bit, name, _ in health.REASONS:
        camel = "".join(w.capitalize() for w in name.split("_"))  # hw_thermal_slowdown -> HwThermalSlowdown
        new = getattr(pynvml, f"nvmlClocksEventReason{camel}", None)
        old = getattr(pynvml, f"nvmlClocksThrottleReason{camel}", None)
        assert bit in (new, old), name
    assert health.decode_reasons(0x41) == ["gpu_idle", "hw_thermal_slowdown"]
    assert health.decode_reasons(0x10000) == ["unknown_0x10000"]


def test_healthy_idle_and_power_capped_gpus_give_no_warning(monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, throttle=0x1), FakeGpu(bus=0x28, throttle=0x4)])
    rep = health.check_host()
    assert [g["throttle_reasons"] for g in rep["gpus"]] == [["gpu_idle"], ["sw_power_cap"]]
    assert all(not g["warnings"] for g in rep["gpus"]) and not rep["notes"]
    assert rep["gpus"][0]["ecc"]["volatile_uncorrected"] == 0 and rep["gpus"][0]["remapped_rows"]["pending"] is False


@pytest.mark.parametrize("gpu,expect", [
    (FakeGpu(throttle=0x40), "hw_thermal_slowdown"),
    (FakeGpu(throttle=0x80), "hw_power_brake_slowdown"),
    (FakeGpu(throttle=0x8), "hw_slowdown"),
    (FakeGpu(retired=(0, 1, 1)), "page retirement pending"),
    (FakeGpu(remapped=(0, 1, 1, 0)), "row remap pending"),
    (FakeGpu(remapped=(0, 1, 0, 1)), "failed a row remap"),
    (FakeGpu(ecc={"volatile_corrected": 0, "volatile_uncorrected": 3, "aggregate_corrected": 0,
                  "aggregate_uncorrected": 3}), "3 uncorrected ECC errors"),
])
def test_a_sick_gpu_warns(monkeypatch, gpu, expect):
    fake_nvml(monkeypatch, gpus=[gpu])
    (g,) = health.check_host()["gpus"]
    assert any(expect in w for w in g["warnings"]), g["warnings"]


def test_counters_a_gpu_lacks_are_null_and_surprises_are_notes(monkeypatch):
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(ecc=None, retired=None, remapped=None)])
    host.fail["nvmlDeviceGetCurrentClocksEventReasons"] = RuntimeError("bad driver answer")
    rep = health.check_host()
    (g,) = rep["gpus"]
    assert g["ecc"] == dict.fromkeys(("volatile_corrected", "volatile_uncorrected", "aggregate_corrected",
                                      "aggregate_uncorrected"))
    assert g["retired_pages"] is None and g["remapped_rows"] is None and g["throttle_reasons"] is None
    assert any("bad driver answer" in n for n in rep["notes"])


def test_run_warnings_from_growth_pending_and_xid():
    clean = {"ecc": {"volatile_uncorrected": 0, "aggregate_uncorrected": 5}}
    grown = {"ecc": {"volatile_uncorrected": 2, "aggregate_uncorrected": 7}, "remapped_rows": {"pending": True}}
    w = health.run_warnings({"gpu": "GPU 0", "before": clean, "after": grown, "samples": 10,
                             "throttle_samples": {"gpu_idle": 10, "sw_thermal_slowdown": 3}, "xid_events": [79]})
    assert len(w) == 4
    assert "sw_thermal_slowdown in 3 of 10 samples" in w[0] and "volatile uncorrected 0 -> 2" in w[1]
    assert "row remap pending" in w[2] and "Xid 79" in w[3]
    assert health.run_warnings({"gpu": "GPU 0", "before": clean, "after": clean, "samples": 4,
                                "throttle_samples": {"sw_power_cap": 4, "gpu_idle": 1}}) == []


def test_watch_over_a_run_on_the_mapped_gpu(monkeypatch):
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28)])
    cuda_from_host(monkeypatch, host, visible=[1])
    notes: list[str] = []
    w = health.watch_gpu(0, notes)
    assert w is not None and w.gpu.index == 1 and not notes
    w.start()
    host.gpus[1].throttle = 0x40
    host.xid(1, 48)
    host.xid(0, 13)  # another GPU's Xid is not this run's
    w.poll()
    host.gpus[1].ecc["volatile_uncorrected"] = 1
    w.stop()
    rep = w.report()
    assert rep["xid_events"] == [48] and rep["throttle_samples"] == {"hw_thermal_slowdown": 1}
    text = " ".join(w.warnings())
    assert "hw_thermal_slowdown" in text and "Xid 48" in text and "0 -> 1" in text


def test_watch_over_a_mig_instance_is_the_instances(monkeypatch):
    from fakes_gpu import FakeMig, cuda_from_mig

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, mig=[FakeMig("MIG-aaaaaaaa-1111-2222-3333-444455556666"),
                                                               FakeMig("MIG-bbbbbbbb-1111-2222-3333-444455556666")])])
    cuda_from_mig(monkeypatch, host, [(0, 1)])
    notes: list[str] = []
    w = health.watch_gpu(0, notes)
    assert w is not None and (w.gpu.index, w.gpu.mig, w.gpu.matched_by) == (0, 1, "UUID") and not notes
    w.start()
    w.poll()
    w.stop()
    rep = w.report()
    assert rep["mig_instance"] == 1
    # what NVML does not give per instance is null, not the GPU's own counters under the instance's name
    assert rep["before"]["ecc"]["volatile_uncorrected"] is None and rep["before"]["throttle_reasons"] is None
    assert not rep["notes"]
    (g,) = health.check_host()["gpus"]  # sysinfo --health: the GPU itself, in MIG mode
    assert g["mig_mode"] is True and g["ecc"]["volatile_uncorrected"] == 0


def test_no_nvml_no_watch(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert health.watch_gpu(0, []) is None
    assert health.check_host()["gpus"] == []


def test_sysinfo_health_human_and_json(cli, monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28, throttle=0x40, name="NVIDIA A100-SXM4-80GB")])
    res = cli("sysinfo", "--health")
    assert res.code == 0, res.stderr
    assert "NVIDIA A100-SXM4-80GB" in res.stdout and "hw_thermal_slowdown" in res.stdout
    assert "slowing its clocks" in res.stdout
    res = cli("sysinfo", "--health", "--format", "json")
    doc = json.loads(res.stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 1] and doc["gpus"][1]["warnings"]


def test_sysinfo_health_without_gpus_is_one_line(cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    res = cli("sysinfo", "--health")
    assert res.code == 0 and len(res.stdout.strip().splitlines()) == 1 and "no NVIDIA GPU" in res.stdout
    res = cli("sysinfo", "--health", "--format", "json")
    assert res.code == 0 and json.loads(res.stdout)["gpus"] == []


def test_a_narrow_pcie_link_and_a_gpu_with_fewer_nvlinks_than_its_peers_warn(monkeypatch):
    links = [1] * 18  # 18 NVLinks each (the peer's index stands for an NVSwitch port here)
    fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, nvlinks=links),
                                 FakeGpu(bus=0x28, nvlinks=links, nvlinks_down=[4, 9]),
                                 FakeGpu(bus=0x38, nvlinks=links, pcie_width=8)])
    rep = health.check_host()
    g0, g1, g2 = rep["gpus"]
    assert (g0["nvlinks_active"], g1["nvlinks_active"], g1["nvlinks_down"]) == (18, 16, [4, 9])
    assert (g2["pcie_width"], g2["pcie_width_max"], g2["pcie_gen"], g2["pcie_gen_max"]) == (8, 16, 5, 5)
    assert g0["warnings"] == []
    assert g1["warnings"] == ["GPU 1 has 16 of 18 NVLinks active (its peers of the same model have 18); down: 4, 9"]
    assert g2["warnings"] == ["GPU 2's PCIe link runs at x8 of x16: reseat the card or service its slot"]


def test_gpus_without_nvlink_or_of_another_model_are_not_short_of_links(monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, nvlinks=[1] * 12), FakeGpu(bus=0x28, name="NVIDIA L40S"),
                                 FakeGpu(bus=0x38, name="NVIDIA L40S")])
    rep = health.check_host()
    assert [g["nvlinks_active"] for g in rep["gpus"]] == [12, 0, 0] and all(not g["warnings"] for g in rep["gpus"])
