"""System inventory: CPU, memory, accelerators and their topology, software versions.

The same dictionary is printed by ``dlscale sysinfo`` and stored in every run record.
Everything that can be absent (NVML, CUDA, a sysfs file) is guarded and reported as null.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve",
)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model name, sockets, physical cores, logical CPUs and flags from /proc/cpuinfo."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    model, flags = None, set()
    sockets, cores = set(), set()
    for b in blocks:
        fields = {}
        for line in b.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                fields[k.strip()] = v.strip()
        model = model or fields.get("model name") or fields.get("Model") or fields.get("cpu model")
        flags |= set((fields.get("flags") or fields.get("Features") or "").split())
        pid = fields.get("physical id", "0")
        sockets.add(pid)
        cores.add((pid, fields.get("core id", fields.get("processor"))))
    return {
        "model": model,
        "sockets": len(sockets) or None,
        "physical_cores": len(cores) or None,
        "logical_cpus": len(blocks) or None,
        "flags": flags,
    }


def cpu_info() -> dict[str, Any]:
    info = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    flags = info.pop("flags")
    if not info["model"]:
        info["model"] = platform.processor() or None
    try:
        import psutil

        info["physical_cores"] = info["physical_cores"] or psutil.cpu_count(logical=False)
        info["logical_cpus"] = info["logical_cpus"] or psutil.cpu_count(logical=True)
        freq = psutil.cpu_freq()
        info["max_mhz"] = round(freq.max, 1) if freq and freq.max else None
    except Exception:  # noqa: BLE001 - the inventory reports what it can
        info["max_mhz"] = None
    m = re.search(r"@\s*([\d.]+)\s*GHz", info["model"] or "")
    info["nominal_ghz"] = float(m.group(1)) if m else None
    info["affinity"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    info["isa"] = {f: (f in flags) for f in ISA_FLAGS}
    info["architecture"] = platform.machine()
    return info


def numa_info() -> list[dict[str, Any]]:
    nodes = []
    base = Path("/sys/devices/system/node")
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = parse_cpulist(_read(str(d / "cpulist")) or "")
        mem = _read(str(d / "meminfo")) or ""
        m = re.search(r"MemTotal:\s+(\d+)\s+kB", mem)
        nodes.append({"node": int(d.name[4:]), "cpus": cpus, "memory_bytes": int(m.group(1)) * 1024 if m else None})
    return nodes


def memory_info() -> dict[str, Any]:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total_bytes": vm.total, "available_bytes": vm.available}
    except Exception:  # noqa: BLE001
        return {"total_bytes": None, "available_bytes": None}


def _pkg_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def software_info(with_torch: bool = True) -> dict[str, Any]:
    from dlscale import __version__

    sw: dict[str, Any] = {
        "dlscale": __version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "torchvision": _pkg_version("torchvision"),
        "timm": _pkg_version("timm"),
    }
    if with_torch:
        import torch

        sw["torch"] = torch.__version__
        sw["cuda"] = torch.version.cuda
        sw["hip"] = getattr(torch.version, "hip", None)
        sw["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        nccl = None
        if torch.cuda.is_available():
            try:
                v = torch.cuda.nccl.version()
                nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception:  # noqa: BLE001
                nccl = None
        sw["nccl"] = nccl
        sw["mkldnn"] = torch.backends.mkldnn.is_available()
        sw["torch_threads"] = torch.get_num_threads()
    return sw


def _nvml_topology(n: int) -> dict[str, Any] | None:
    """GPU-GPU common ancestor / P2P and CPU affinity from NVML; None where NVML is absent."""
    try:
        import pynvml as nv
    except ImportError:
        return None
    try:
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver
        return None
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        levels = {
            getattr(nv, "NVML_TOPOLOGY_INTERNAL", 0): "SAME_BOARD",
            getattr(nv, "NVML_TOPOLOGY_SINGLE", 10): "PIX",
            getattr(nv, "NVML_TOPOLOGY_MULTIPLE", 20): "PXB",
            getattr(nv, "NVML_TOPOLOGY_HOSTBRIDGE", 30): "PHB",
            getattr(nv, "NVML_TOPOLOGY_NODE", 40): "NODE",
            getattr(nv, "NVML_TOPOLOGY_SYSTEM", 50): "SYS",
        }
        matrix: list[list[str]] = []
        for i in range(n):
            row = []
            for j in range(n):
                if i == j:
                    row.append("X")
                    continue
                try:
                    nvlinks = 0
                    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                        try:
                            if nv.nvmlDeviceGetNvLinkState(handles[i], link) == nv.NVML_FEATURE_ENABLED:
                                pci = nv.nvmlDeviceGetNvLinkRemotePciInfo_v2(handles[i], link)
                                if pci.busId == nv.nvmlDeviceGetPciInfo(handles[j]).busId:
                                    nvlinks += 1
                        except nv.NVMLError:
                            break
                    if nvlinks:
                        row.append(f"NV{nvlinks}")
                    else:
                        lvl = nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                        row.append(levels.get(lvl, str(lvl)))
                except nv.NVMLError as e:
                    row.append(f"?({e})")
            matrix.append(row)
        gpus = []
        for i, h in enumerate(handles):
            entry: dict[str, Any] = {"index": i}
            try:
                entry["pcie_gen_max"] = nv.nvmlDeviceGetMaxPcieLinkGeneration(h)
                entry["pcie_width_max"] = nv.nvmlDeviceGetMaxPcieLinkWidth(h)
            except nv.NVMLError:
                pass
            try:
                entry["power_limit_w"] = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
            except nv.NVMLError:
                pass
            try:
                entry["sm_clock_max_mhz"] = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)
            except nv.NVMLError:
                pass
            try:
                nodeset = nv.nvmlDeviceGetCpuAffinity(h, 4)
                cpus = [w * 64 + b for w, word in enumerate(nodeset) for b in range(64) if word >> b & 1]
                entry["cpu_affinity"] = cpus
            except nv.NVMLError:
                pass
            gpus.append(entry)
        driver = nv.nvmlSystemGetDriverVersion()
        return {
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "gpu_gpu": matrix,
            "gpus": gpus,
        }
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def accelerator_info() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"count": 0, "devices": [], "topology": None}
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({
            "index": i,
            "name": p.name,
            "memory_bytes": p.total_memory,
            "compute_capability": f"{p.major}.{p.minor}",
            "multiprocessors": p.multi_processor_count,
        })
    topo = _nvml_topology(len(devices))
    return {"count": len(devices), "devices": devices, "driver": topo and topo["driver"], "topology": topo}


def collect(with_torch: bool = True) -> dict[str, Any]:
    """The whole inventory. ``with_torch=False`` skips what needs torch (fast, for tests)."""
    inv: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu": cpu_info(),
        "numa": numa_info(),
        "memory": memory_info(),
        "software": software_info(with_torch),
        "argv": sys.argv[:],
    }
    inv["accelerators"] = accelerator_info() if with_torch else None
    return inv


_CACHE: dict[str, Any] | None = None


def collect_cached() -> dict[str, Any]:
    """The inventory, collected once per process (NVML and /proc reads are not free)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = collect(with_torch=True)
    import copy

    return copy.deepcopy(_CACHE)
