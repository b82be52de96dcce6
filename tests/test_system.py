"""The system inventory: parsers on fixed text, and the live inventory's shape."""

import json

from conftest import requires_cuda
from dlscale import system
from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml

CPUINFO_2S = "\n\n".join(
    f"processor\t: {i}\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\nphysical id\t: {i // 4}\n"
    f"core id\t\t: {(i % 4) // 2}\nflags\t\t: fpu avx avx2 fma avx512f avx512_vnni"
    for i in range(8)
)


def test_parse_cpuinfo_counts_sockets_cores_threads():
    info = system.parse_cpuinfo(CPUINFO_2S)
    assert info["sockets"] == 2
    assert info["physical_cores"] == 4  # 2 cores per socket, 2 threads per core
    assert info["logical_cpus"] == 8
    assert {"avx512f", "avx2", "avx512_vnni"} <= info["flags"]
    assert info["model"].endswith("2.40GHz")


def test_parse_cpulist():
    assert system.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert system.parse_cpulist("") == []


def test_live_inventory_shape_without_torch():
    inv = system.collect(with_torch=False)
    cpu = inv["cpu"]
    assert inv["hostname"] and cpu["logical_cpus"] >= 1 and cpu["architecture"]
    assert set(system.ISA_FLAGS) == set(cpu["isa"])
    assert inv["memory"]["total_bytes"] > 0
    assert inv["software"]["python"] and inv["software"]["dlscale"]


def test_sysinfo_command_json(cli):
    res = cli("sysinfo", "--format", "json")
    assert res.code == 0, res.stderr
    inv = json.loads(res.stdout)
    sw = inv["software"]
    assert sw["torch"].startswith("2.14") and "cuda" in sw and "cudnn" in sw and "nccl" in sw
    assert inv["accelerators"]["count"] == len(inv["accelerators"]["devices"])
    human = cli("sysinfo")
    assert human.code == 0 and "sockets / cores / threads" in human.stdout


@requires_cuda
def test_gpu_inventory_and_nvml_topology():
    inv = system.collect(with_torch=True)
    acc = inv["accelerators"]
    assert acc["count"] >= 1
    d = acc["devices"][0]
    assert d["name"] and d["memory_bytes"] > 0 and "." in d["compute_capability"]
    topo = acc["topology"]
    assert topo is not None, "NVML did not answer on a machine with a GPU"
    assert topo["driver"] and len(topo["gpu_gpu"]) == acc["count"]


# -- NVML topology on a fake host (tests/fakes_gpu.py) ------------------------------------------------
def _host(monkeypatch, n=4, **kw):
    gpus = [FakeGpu(bus=0x18 + 0x10 * i, cpus=[i], switch=i // 2, **kw) for i in range(n)]
    return fake_nvml(monkeypatch, gpus=gpus)


def test_nvlink_peers_come_back_through_the_real_nvml_function(monkeypatch):
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, nvlinks=[1] * 4), FakeGpu(bus=0x2A, nvlinks=[0] * 4)])
    cuda_from_host(monkeypatch, host)
    acc = system.collect()["accelerators"]
    assert acc["topology"]["gpu_gpu"] == [["X", "NV4"], ["NV4", "X"]]
    assert "nvmlDeviceGetNvLinkRemotePciInfo" in host.calls and not acc["notes"]


def test_nvswitch_links_count_as_nvlink_between_gpus(monkeypatch):
    host = _host(monkeypatch, n=2, nvlinks=["switch"] * 18)
    cuda_from_host(monkeypatch, host)
    assert system.collect()["accelerators"]["topology"]["gpu_gpu"] == [["X", "NV18"], ["NV18", "X"]]


def test_pcie_levels_without_nvlink(monkeypatch):
    cuda_from_host(monkeypatch, _host(monkeypatch, n=3))
    topo = system.collect()["accelerators"]["topology"]
    assert topo["gpu_gpu"] == [["X", "PXB", "SYS"], ["PXB", "X", "SYS"], ["SYS", "SYS", "X"]]


def test_cuda_visible_devices_maps_cuda_devices_to_their_nvml_gpus(monkeypatch):
    host = _host(monkeypatch)
    cuda_from_host(monkeypatch, host, visible=[2, 3])
    gpus = system.collect()["accelerators"]["topology"]["gpus"]
    assert [g["cpu_affinity"] for g in gpus] == [[2], [3]]  # NVML GPUs 2 and 3, not 0 and 1
    assert [(g["index"], g["nvml_index"], g["matched_by"]) for g in gpus] == [(0, 2, "UUID"), (1, 3, "UUID")]


def test_cuda_visible_devices_alone_places_devices_for_an_older_torch(monkeypatch):
    host = _host(monkeypatch)
    cuda_from_host(monkeypatch, host, visible=[3, 1], with_ids=False)
    gpus = system.collect()["accelerators"]["topology"]["gpus"]
    assert [(g["nvml_index"], g["matched_by"]) for g in gpus] == [(3, "CUDA_VISIBLE_DEVICES"), (1, "CUDA_VISIBLE_DEVICES")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{host.gpus[2].uuid[:12]},{host.gpus[0].uuid}")  # UUIDs, one a prefix
    gpus = system.collect()["accelerators"]["topology"]["gpus"]
    assert [g["nvml_index"] for g in gpus] == [2, 0]


def test_match_by_uuid_as_torch_prints_it():
    from dlscale.monitor.nvml import NvmlGpu, match_cuda

    gpus = [NvmlGpu(i, object(), (0, 0x18 + i, 0), None, f"GPU-{i}aaaaaaa-bbbb") for i in range(3)]
    assert match_cuda(gpus, 0, None, "2AAAAAAA-BBBB", None).index == 2
    assert match_cuda(gpus, 1, None, None, None).matched_by == "equal index (assumed)"
    assert match_cuda(gpus, 0, (0, 0x99, 0), None, ["MIG-abc"]) is None


def test_pci_address_places_a_device_when_torch_gives_no_uuid(monkeypatch):
    host = _host(monkeypatch)
    cuda_from_host(monkeypatch, host, visible=[2])
    import torch

    props = torch.cuda.get_device_properties
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d=None: (lambda p: (delattr(p, "uuid"), p)[1])(props(d)))
    (g,) = system.collect()["accelerators"]["topology"]["gpus"]
    assert (g["nvml_index"], g["matched_by"]) == (2, "PCI address")


def _mig_host(monkeypatch):
    from fakes_gpu import FakeMig

    mig = [FakeMig(f"MIG-{c * 8}-1111-2222-3333-444455556666") for c in "abc"]
    return fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28, mig=mig)])


def test_mig_instances_are_matched_by_uuid_not_to_their_gpu(monkeypatch):
    from fakes_gpu import cuda_from_mig

    host = _mig_host(monkeypatch)
    cuda_from_mig(monkeypatch, host, [(1, 2), (1, 0)])
    acc = system.collect()["accelerators"]
    gpus = acc["topology"]["gpus"]
    assert [(g["nvml_index"], g.get("mig_instance"), g["matched_by"]) for g in gpus] == [(1, 2, "UUID"), (1, 0, "UUID")]
    assert gpus[0]["uuid"] == host.gpus[1].mig[2].uuid and "MIG 1g.10gb" in gpus[0]["name"]
    assert "power_limit_w" not in gpus[0]  # NVML has none per instance; the GPU's is not the instance's


def test_a_mig_instance_no_uuid_identifies_is_left_out_with_a_note(monkeypatch):
    from fakes_gpu import cuda_from_mig

    host = _mig_host(monkeypatch)
    cuda_from_mig(monkeypatch, host, [(1, 1)], with_uuid=False)
    acc = system.collect()["accelerators"]
    assert acc["topology"]["gpus"][0]["nvml_index"] is None  # not the whole GPU 1 under an instance's name
    assert any("MIG instance of NVML GPU 1" in n for n in acc["notes"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # an index names the GPU, which CUDA cannot use in MIG mode
    assert system.collect()["accelerators"]["topology"]["gpus"][0]["nvml_index"] is None


def test_an_exception_inside_a_gpu_probe_is_a_note_not_a_crash(monkeypatch):
    host = _host(monkeypatch, n=2)
    cuda_from_host(monkeypatch, host)
    host.fail["nvmlDeviceGetMaxClockInfo"] = RuntimeError("driver returned garbage")
    host.fail["nvmlDeviceGetTopologyCommonAncestor"] = AttributeError("no such function")
    acc = system.collect()["accelerators"]
    assert acc["count"] == 2 and "sm_clock_max_mhz" not in acc["topology"]["gpus"][0]
    assert acc["topology"]["gpus"][0]["power_limit_w"] == 700.0  # the other probes still ran
    assert acc["topology"]["gpu_gpu"][0][1] == "?"
    assert any("driver returned garbage" in n for n in acc["notes"])
    assert any("no such function" in n for n in acc["notes"])


def test_collect_cached_survives_a_broken_nvml(monkeypatch):
    host = _host(monkeypatch, n=2)
    cuda_from_host(monkeypatch, host)
    host.fail["nvmlDeviceGetCount"] = KeyError("boom")
    host.fail["nvmlSystemGetDriverVersion"] = TypeError("bad")
    monkeypatch.setattr(system, "_CACHE", None)
    acc = system.collect_cached()["accelerators"]
    assert acc["count"] == 2 and [g["nvml_index"] for g in acc["topology"]["gpus"]] == [None, None]
    assert any("boom" in n for n in acc["notes"]) and any("bad" in n for n in acc["notes"])


def test_a_failing_cuda_query_leaves_a_note(monkeypatch):
    import torch

    cuda_from_host(monkeypatch, _host(monkeypatch, n=2))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: (_ for _ in ()).throw(RuntimeError("CUDA init failed")))
    acc = system.collect()["accelerators"]
    assert acc["count"] == 0 and "CUDA init failed" in acc["notes"][0]


def test_no_nvml_bindings_means_no_topology(monkeypatch):
    import sys

    cuda_from_host(monkeypatch, _host(monkeypatch, n=1))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    acc = system.collect()["accelerators"]
    assert acc["count"] == 1 and acc["topology"] is None


def test_isa_cap_takes_the_lowest_of_dlscale_aten_and_onednn_caps():
    assert system.isa_cap({}) is None
    assert system.isa_cap({"DLSCALE_CPU_ISA": "avx2"}) == {"level": "avx2", "set_by": ["DLSCALE_CPU_ISA=avx2"]}
    both = system.isa_cap({"ATEN_CPU_CAPABILITY": "avx512", "DNNL_MAX_CPU_ISA": "AVX2"})
    assert both == {"level": "avx2", "set_by": ["ATEN_CPU_CAPABILITY=avx512", "DNNL_MAX_CPU_ISA=AVX2"]}
    assert system.isa_cap({"ATEN_CPU_CAPABILITY": "default"})["level"] == "sse4_2"
    assert system.isa_cap({"DNNL_MAX_CPU_ISA": "AVX512_CORE_BF16"})["level"] == "avx512_bf16"
    # values that cap no x86 level (oneDNN's ALL, ATen's Power/s390x kernels) are not caps
    assert system.isa_cap({"DNNL_MAX_CPU_ISA": "ALL", "ATEN_CPU_CAPABILITY": "zvector"}) is None


def test_isa_cap_of_an_unknown_level_is_a_usage_error():
    import pytest

    from dlscale.errors import UsageError

    with pytest.raises(UsageError, match="DLSCALE_CPU_ISA='avx3'.*avx2"):
        system.isa_cap({"DLSCALE_CPU_ISA": "avx3"})


def test_effective_isa_drops_every_flag_above_the_cap():
    sapphire = {"sse4_2", "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"}
    capped = system.effective_isa(sapphire, {"level": "avx2", "set_by": []})
    assert {f for f, on in capped.items() if on} == {"sse4_2", "avx", "avx2", "fma"}
    assert system.effective_isa(sapphire, None) == {f: f in sapphire for f in system.ISA_FLAGS}
    # a cap above what the CPU has changes nothing: a cap never adds a flag
    zen3 = {"sse4_2", "avx", "avx2", "fma"}
    assert system.effective_isa(zen3, {"level": "amx", "set_by": []}) == system.effective_isa(zen3, None)


def test_live_inventory_reports_the_cap_beside_the_hardware(monkeypatch):
    monkeypatch.setenv("DLSCALE_CPU_ISA", "avx")
    cpu = system.cpu_info()
    assert cpu["isa_cap"]["level"] == "avx"
    assert not cpu["isa"]["avx2"] and not cpu["isa"]["avx512f"]
    assert set(cpu["isa_hardware"]) == set(system.ISA_FLAGS)


def test_the_inventory_names_the_slurm_job_it_ran_in(monkeypatch):
    from dlscale.system import collect

    for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NODEID",
              "SLURM_JOB_PARTITION"):
        monkeypatch.delenv(k, raising=False)
    assert collect(with_torch=False)["slurm"] is None
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert collect(with_torch=False)["slurm"] == {"job_id": "4711", "nodelist": "gpu[01-02]", "node_id": "1"}
