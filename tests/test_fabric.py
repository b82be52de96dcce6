"""The NVSwitch fabric read (monitor/fabric.py) on the fake NVML (tests/fakes_gpu.py), which answers as the
real driver does: the V call reads the struct's version word and fills that much, or answers
ARGUMENT_VERSION_MISMATCH; a driver without the V call answers FUNCTION_NOT_FOUND; NOT_SUPPORTED is a GPU
without a fabric. And the acceptance's verdict on a node whose fabric read errors."""

from __future__ import annotations

import ctypes

import pytest

from dlscale.monitor import fabric, health
from fakes_gpu import (ARGUMENT_VERSION_MISMATCH, GPU_IS_LOST, NOT_SUPPORTED, UNKNOWN, FakeGpu, FakeNVMLError,
                       cuda_from_host, fake_nvml)

SWITCHED = {"nvlinks": ["switch"] * 18}


def test_the_version_words_are_nvmls_struct_versions():
    import pynvml

    words = dict((w >> 24, (w, s)) for w, s in fabric._fabric_structs(pynvml))
    assert words[3] == (pynvml.nvmlGpuFabricInfo_v3, pynvml.c_nvmlGpuFabricInfo_v3_t)  # 0x3000028
    assert words[2][0] == pynvml.nvmlGpuFabricInfo_v2 == ctypes.sizeof(words[2][1]) | 2 << 24  # 0x2000024


def test_a_struct_without_its_version_is_refused_as_the_driver_refuses_it(monkeypatch):
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(fabric=(3, 0, 0), **SWITCHED)])
    info = host.module.c_nvmlGpuFabricInfo_v2_t()
    info.version = 0  # the struct passed as it was before: NVML cannot tell what it is
    with pytest.raises(FakeNVMLError) as e:
        host.module.nvmlDeviceGetGpuFabricInfoV(host.module.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert e.value.value == ARGUMENT_VERSION_MISMATCH


def test_bindings_whose_structs_leave_the_version_unset_still_read_it(monkeypatch):
    """The version is set by dlscale, not left to the bindings' constructor (which some releases lack)."""
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(fabric=(3, 0, 0), **SWITCHED)])
    for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t", "c_nvmlGpuFabricInfoV_t"):
        bare = type(name, (ctypes.Structure,), {"_fields_": getattr(host.module, name)._fields_})
        monkeypatch.setattr(host.module, name, bare)
        assert bare().version == 0
    (g,) = health.check_host()["gpus"]
    assert g["fabric"]["struct"] == 3 and not g["warnings"]


@pytest.mark.parametrize("versions, struct", [((2, 3), 3), ((2,), 2), ((), 0)])
def test_the_newest_version_the_driver_knows_else_the_unversioned_call(monkeypatch, versions, struct):
    fake_nvml(monkeypatch, gpus=[FakeGpu(fabric=(3, 0, 1), fabric_versions=versions, **SWITCHED)])
    (g,) = health.check_host()["gpus"]
    assert g["fabric"]["struct"] == struct and g["fabric"]["state"] == "completed"
    # the health mask comes with the versioned structs only; the unversioned call has none
    assert g["fabric"]["health"] == ([] if struct == 0 else ["degraded_bandwidth"])


@pytest.mark.parametrize("error, key, name", [(UNKNOWN, "error", "UNKNOWN"), (GPU_IS_LOST, "error", "GPU_IS_LOST"),
                                              (4, "unread", "NO_PERMISSION")])
def test_an_error_is_not_a_gpu_without_a_fabric(monkeypatch, error, key, name):
    fake_nvml(monkeypatch, gpus=[FakeGpu(fabric=(3, 0, 0), fabric_error=error, **SWITCHED)])
    (g,) = health.check_host()["gpus"]
    assert g["fabric"][key] == name
    faults = [w for w in g["warnings"] if "fabric" in w]
    if key == "error":
        assert len(faults) == 1 and f"NVML answered {name}" in faults[0] and not g["unread"]
    else:  # nothing was measured: what NVML would not let this process read
        assert not faults and g["unread"] == [f"GPU 0's NVSwitch fabric could not be read here (NVML {name}): its "
                                              "state is unknown"]


def test_not_supported_or_the_state_not_supported_is_no_fabric(monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(fabric=(3, 0, 0), fabric_error=NOT_SUPPORTED), FakeGpu(bus=0x28, fabric=(0, 0, 0))])
    assert [(g["fabric"], g["warnings"], g["unread"]) for g in health.check_host()["gpus"]] == [(None, [], [])] * 2


@pytest.mark.parametrize("state, mask, summary, expect", [
    (2, 0, 0, "not registered with the NVLink fabric (state in_progress)"),
    (0xAB03, 0, 0, None),  # the padding after the one-byte state is not the state
    (3, 5 << 8, 0, "fabric reports incorrect_configuration"),  # INSUFFICIENT_NVLINKS
    (3, 1 << 8 | 2 << 14, 0, "fabric reports fabric_manager_disconnected"),
    (3, 1 << 8, 2, "fabric reports unhealthy"),  # v3's health summary
])
def test_state_health_mask_and_summary(monkeypatch, state, mask, summary, expect):
    fake_nvml(monkeypatch, gpus=[FakeGpu(fabric=(state, 0, mask), fabric_summary=summary, **SWITCHED)])
    (g,) = health.check_host()["gpus"]
    said = [w for w in g["warnings"] if "fabric" in w]
    assert said == [] if expect is None else (len(said) == 1 and expect in said[0]), said


def _judged(monkeypatch, db_path, tmp_path, gpus):
    from dlscale import api, system
    from dlscale.accept import acceptance as run
    from dlscale.accept.plan import spec
    from dlscale.monitor import kernlog

    (tmp_path / "kernel.log").write_text("")
    monkeypatch.setenv(kernlog.KERNEL_LOG_ENV, str(tmp_path / "kernel.log"))
    host = fake_nvml(monkeypatch, gpus=gpus)
    cuda_from_host(monkeypatch, host)
    monkeypatch.setattr(system, "_CACHE", None)
    return run.judge([api.health(tag="acc", db=str(db_path))], spec.builtin(True))


def test_the_acceptance_fails_a_node_whose_fabric_read_errors_and_passes_a_healthy_one(monkeypatch, db_path, tmp_path):
    from dlscale.accept.judging.verdict import exit_code

    healthy = [FakeGpu(bus=0x18 + 0x10 * i, fabric=(3, 0, 0), **SWITCHED) for i in range(2)]
    vs = _judged(monkeypatch, db_path, tmp_path, healthy)
    assert [v.status for v in vs] == ["PASS", "PASS"] and exit_code(vs) == 0
    sick = [FakeGpu(bus=0x18, fabric=(3, 0, 0), **SWITCHED), FakeGpu(bus=0x28, fabric=(3, 0, 0), fabric_error=UNKNOWN,
                                                                  **SWITCHED)]
    vs = _judged(monkeypatch, db_path, tmp_path, sick)
    assert [(v.subject, v.status) for v in vs] == [("GPU 0", "PASS"), ("GPU 1", "FAIL")] and exit_code(vs) == 1
    assert "NVSwitch fabric could not be read: NVML answered UNKNOWN" in vs[1].reason
    unread = [FakeGpu(bus=0x18, fabric=(3, 0, 0), fabric_error=4, **SWITCHED)]
    (v,) = _judged(monkeypatch, db_path, tmp_path, unread)
    assert v.status == "ERROR" and "NO_PERMISSION" in v.reason


def test_sysinfo_health_shows_a_lost_gpu_and_an_unreadable_fabric(cli, monkeypatch):
    fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, fabric=(3, 0, 0), fabric_error=UNKNOWN, **SWITCHED),
                                 FakeGpu(bus=0x28, lost=True)])
    res = cli("sysinfo", "--health")
    assert res.code == 0, res.stderr
    assert "unreadable (UNKNOWN)" in res.stdout and "LOST" in res.stdout
    assert "GPU 1 is lost: NVML answers GPU_IS_LOST" in " ".join(res.stdout.split())
