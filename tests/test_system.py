"""The system inventory: parsers on fixed text, and the live inventory's shape."""

import json

from conftest import requires_cuda
from dlscale import system

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
