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
    (FakeGpu(remapped=(0, 1, 0, 1)), "failed a row remap"),
    (FakeGpu(ecc={"volatile_corrected": 0, "volatile_uncorrected": 3, "aggregate_corrected": 0,
                  "aggregate_uncorrected": 3}), "3 uncorrected ECC errors"),
])
def test_a_sick_gpu_warns(monkeypatch, gpu, expect):
    fake_nvml(monkeypatch, gpus=[gpu])
    (g,) = health.check_host()["gpus"]
    assert any(expect in w for w in g["warnings"]), g["warnings"]


def test_a_row_remap_pending_is_advised_not_a_fault(monkeypatch):
    """NVIDIA: with a remap pending, work runs unaffected until the next reset applies it."""
    fake_nvml(monkeypatch, gpus=[FakeGpu(remapped=(0, 1, 1, 0))])
    (g,) = health.check_host()["gpus"]
    assert not any("row remap" in w for w in g["warnings"]), g["warnings"]
    assert any("row remap pending" in a and "next reset" in a for a in g["advisories"]), g["advisories"]
    after = {"remapped_rows": {"pending": True}}
    assert health.run_warnings({"gpu": "GPU 0", "before": {}, "after": after}) == []
    (a,) = health.run_advisories({"gpu": "GPU 0", "before": {}, "after": after})
    assert a.startswith("GPU 0 has a row remap pending")


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
    grown = {"ecc": {"volatile_uncorrected": 2, "aggregate_uncorrected": 7}, "remapped_rows": {"failure": True}}
    w = health.run_warnings({"gpu": "GPU 0", "before": clean, "after": grown, "samples": 10,
                             "throttle_samples": {"gpu_idle": 10, "sw_thermal_slowdown": 3}, "xid_events": [79]})
    assert len(w) == 4
    assert "sw_thermal_slowdown in 3 of 10 samples" in w[0] and "volatile uncorrected 0 -> 2" in w[1]
    assert "failed a row remap" in w[2] and "Xid 79" in w[3]
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


# -- links and limits (monitor/fabric.py) and Xid classes (monitor/xid.py) ----------------------------------------
def test_an_h100_with_two_nvlinks_down_warns_against_its_models_eighteen(monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(nvlinks=["switch"] * 16, nvlinks_down=2),
                                 FakeGpu(bus=0x28, nvlinks=["switch"] * 18)])
    sick, well = health.check_host()["gpus"]
    assert (sick["nvlink"]["active"], sick["nvlink"]["present"], sick["nvlink"]["nominal"]) == (16, 18, 18)
    assert any("2 of its 18 NVLinks down" in w for w in sick["warnings"]) and not well["warnings"]


def test_nvlink_counters_are_summed_over_the_active_links_and_a_recovery_warns(monkeypatch):
    import pynvml

    errors = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 2, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 1,
              pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 3}
    fake_nvml(monkeypatch, gpus=[FakeGpu(nvlinks=["switch"] * 18, nvlink_errors=errors)])
    (g,) = health.check_host()["gpus"]
    assert g["nvlink"]["errors"] == {"replay": 36, "recovery": 18, "crc_flit": 54, "crc_data": 0}  # 18 links each
    # a recovery since the driver loaded is history, not a fault now: an advisory (accept WARNs), not a warning
    assert any("recovered (retrained) 18 times" in w for w in g["advisories"]) and not g["warnings"]


@pytest.mark.parametrize("state, status, mask, expect", [
    (1, 0, 0, "not registered with the NVLink fabric (state not_started"),
    (3, 999, 0, "not registered with the NVLink fabric (state completed, status 999 UNKNOWN)"),
    (3, 0, 1 | 1 << 4, "fabric reports degraded_bandwidth, route_unhealthy"),
    (3, 0, 2 | 2 << 2 | 2 << 4 | 2 << 6, None),  # every health field FALSE: healthy
])
def test_the_nvswitch_fabric_state_and_health(monkeypatch, state, status, mask, expect):
    fake_nvml(monkeypatch, gpus=[FakeGpu(nvlinks=["switch"] * 18, fabric=(state, status, mask))])
    (g,) = health.check_host()["gpus"]
    assert g["fabric"]["state"] == {1: "not_started", 3: "completed"}[state]
    said = [w for w in g["warnings"] if "fabric" in w]
    assert said == [] if expect is None else (len(said) == 1 and expect in said[0]), said


def test_a_gpu_without_a_fabric_or_nvlink_says_nothing_of_them(monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(name="NVIDIA H100 PCIe", pci_device_id=0x2331)])
    (g,) = health.check_host()["gpus"]
    assert g["nvlink"] is None and g["fabric"] is None and not g["warnings"]


@pytest.mark.parametrize("gpu, expect, kind", [
    (FakeGpu(pcie=(5, 8)), "runs at x8 of x16", "warnings"),  # a lane width problem shows idle or not
    (FakeGpu(pcie=(1, 16), throttle=0x4), "runs at Gen1 under load, below its Gen5", "warnings"),
    (FakeGpu(pcie_max=(4, 16), pcie=(4, 16)), "slot limits its PCIe link to Gen4; the GPU can do Gen5", "advisories"),
    (FakeGpu(power_limit_mw=500_000), "power limit is 500 W, below its default 700 W", "advisories"),
])
def test_pcie_below_its_maximum_and_a_power_cap_warn(monkeypatch, gpu, expect, kind):
    """A link working below its own maximum is a fault; a slot or a power cap is how the GPU is set up."""
    fake_nvml(monkeypatch, gpus=[gpu])
    (g,) = health.check_host()["gpus"]
    assert any(expect in w for w in g[kind]), g
    other = "advisories" if kind == "warnings" else "warnings"
    assert not any(expect in w for w in g[other])


def test_accept_fails_a_fault_and_warns_on_a_setup(monkeypatch):
    from dlscale.accept.judging.explain import health_verdicts
    from dlscale.record import RunRecord

    fake_nvml(monkeypatch, gpus=[FakeGpu(pcie=(5, 8)), FakeGpu(bus=0x28, power_limit_mw=500_000), FakeGpu(bus=0x38)])
    rec = RunRecord(kind="health", workload="gpus", config={}, system={}, raw=health.check_host())
    got = [(v.status, v.reason[:40]) for v in health_verdicts(rec)]
    assert [s for s, _ in got] == ["FAIL", "WARN", "PASS"], got
    assert "x8 of x16" in got[0][1] and "power limit is 500 W" in got[1][1]


def test_an_idle_gpu_at_a_lower_pcie_generation_is_saving_power(monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(pcie=(1, 16), throttle=0x1)])
    (g,) = health.check_host()["gpus"]
    assert g["pcie"] == {"gen": 1, "gen_max": 5, "gen_gpu_max": 5, "width": 16, "width_max": 16}
    assert not g["warnings"]


def test_a_run_judges_the_pcie_generation_under_load_and_nvlink_error_growth(monkeypatch):
    import pynvml

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(nvlinks=["switch"] * 18, pcie=(1, 16), throttle=0x1)])
    cuda_from_host(monkeypatch, host)
    w = health.watch_gpu(0, [])
    w.start()
    host.gpus[0].throttle = 0x0  # busy, but its link stays at Gen4
    host.gpus[0].pcie = (4, 16)
    w.poll()
    host.gpus[0].throttle, host.gpus[0].pcie = 0x1, (1, 16)  # idle again at the end: Gen1 is no fault
    w.poll()
    host.gpus[0].nvlink_errors = {pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: 1}
    w.stop()
    rep = w.report()
    assert rep["pcie_under_load"] == {"samples": 1, "gen": 4, "width": 16}
    text = " ".join(w.warnings())
    assert "Gen4 under load, below its Gen5" in text and "crc_data 0 -> 18" in text


def test_xids_are_classed_as_the_programs_or_the_gpus():
    from dlscale.monitor import xid

    assert [xid.classify(c) for c in (13, 31, 43, 45, 68, 109)] == [xid.APPLICATION] * 6
    assert {xid.classify(c) for c in (63, 92, 94)} == {xid.RECORDED}
    assert {xid.classify(c) for c in (48, 64, 74, 79, 95, 119, 120, 999)} == {xid.HARDWARE}
    assert xid.describe([13, 79, 13]) == [
        {"xid": 13, "name": "graphics engine exception", "class": "application", "count": 2},
        {"xid": 79, "name": "GPU has fallen off the bus", "class": "hardware/driver", "count": 1}]
    hw, app = health.run_warnings({"gpu": "GPU 2", "xid_events": [13, 79, 13]})
    assert hw.startswith("GPU 2 raised hardware/driver Xid 79 (GPU has fallen off the bus)") and "suspect" in hw
    assert app.startswith("GPU 2 raised application Xid 13 (graphics engine exception)") and "not the GPU's" in app


def test_sysinfo_health_shows_links_and_limits(cli, monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(nvlinks=["switch"] * 16, nvlinks_down=2, fabric=(3, 0, 0),
                                         power_limit_mw=500_000)])
    res = cli("sysinfo", "--health")
    assert res.code == 0, res.stderr
    assert "16 of 18" in res.stdout and "completed" in res.stdout and "500 W (700 W)" in res.stdout
    assert "Gen5 x16 (Gen5 x16)" in res.stdout
