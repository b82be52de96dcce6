"""GPU inventory: the CUDA devices and their NVML topology, the ``accelerators`` part of system.py's
inventory.

Each CUDA device is matched to its NVML device by UUID, then PCI address (monitor/nvml.py), so the
topology describes the GPUs (or MIG instances) the run uses: the GPU-GPU matrix (NVLinks, direct
or through NVSwitches, else the PCIe level), each GPU's PCIe link, power limit, clock, CPU affinity
and NVLinks (nvlink.py). Everything that can be absent (NVML, CUDA) is guarded and reported as
null; a probe that fails in an unexpected way leaves a line in ``notes`` instead of stopping the
run whose record this inventory is part of.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlscale import nvlink
from dlscale.monitor import nvml

_LEVELS = {0: "SAME_BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}  # nvmlGpuTopologyLevel_t


@dataclass
class _Links:
    """One GPU's NVLinks as NVML lists them."""

    peers: dict[str, int] = field(default_factory=dict)  # active links per peer GPU (by PCI bus id)
    switch: int = 0  # active links to NVSwitches
    active: int = 0
    present: int = 0  # links NVML answers for, active or not
    version: int | None = None  # nvmlDeviceGetNvLinkVersion of the first active link


def _nvlinks(nv: Any, h: Any, notes: list[str], what: str) -> _Links:
    """Every NVLink of one GPU: where each active one goes, and NVML's version of the first."""
    states = nvml.nvlink_states(nv, h)
    out = _Links(present=len(states), active=sum(states))
    for link in (k for k, up in enumerate(states) if up):
        if out.version is None:
            out.version = nvml.probe(nv, notes, f"{what} link {link} version",
                                     lambda link=link: int(nv.nvmlDeviceGetNvLinkVersion(h, link)))
        kind = nvml.probe(nv, notes, f"{what} link {link} remote type",
                          lambda link=link: nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link))
        if kind == getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
            out.switch += 1
            continue
        pci = nvml.probe(nv, notes, f"{what} link {link} remote PCI info",
                         lambda link=link: nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link))
        if pci is not None:
            bus = nvml.text(pci.busId).upper()
            out.peers[bus] = out.peers.get(bus, 0) + 1
    return out


def _gpu_matrix(nv: Any, gpus: list[nvml.NvmlGpu | None], links: list[_Links], notes: list[str]) -> list[list[str]]:
    """nvidia-smi-like GPU-GPU matrix: NV<links> (direct or through NVSwitches), else the PCIe level."""
    matrix = []
    for i, gi in enumerate(gpus):
        row = []
        for j, gj in enumerate(gpus):
            if i == j:
                row.append("X")
                continue
            if gi is None or gj is None:
                row.append("?")
                continue
            direct = links[i].peers.get((gj.bus_id or "").upper(), 0)
            via_switch = min(links[i].switch, links[j].switch)
            if direct or via_switch:
                row.append(f"NV{direct or via_switch}")
                continue
            lvl = nvml.probe(nv, notes, f"GPU {i}-{j} common ancestor",
                             lambda a=gi.handle, b=gj.handle: nv.nvmlDeviceGetTopologyCommonAncestor(a, b))
            row.append("?" if lvl is None else _LEVELS.get(int(lvl), str(lvl)))
        matrix.append(row)
    return matrix


def _gpu_entry(nv: Any, i: int, g: nvml.NvmlGpu | None, notes: list[str],
               links: _Links | None = None) -> dict[str, Any]:
    """One CUDA device's NVML facts: which NVML GPU it is, PCIe link, power limit, clock, CPU affinity,
    NVLinks (nvlink.facts: active, present, to switches, generation, the model's nominal count)."""
    entry: dict[str, Any] = {"index": i}
    if g is None:
        return {**entry, "nvml_index": None}
    h, what = g.handle, f"GPU {i}"
    entry.update(nvml_index=g.index, matched_by=g.matched_by, pci_bus_id=g.bus_id, uuid=g.uuid)
    if g.mig is not None:
        entry["mig_instance"] = g.mig  # the figures below are the instance's where NVML gives them
    probes: dict[str, Any] = {
        "name": lambda: nvml.text(nv.nvmlDeviceGetName(h)),
        "serial": lambda: nvml.text(nv.nvmlDeviceGetSerial(h)),
        "pci_device_id": lambda: int(nv.nvmlDeviceGetPciInfo(h).pciDeviceId) >> 16,
        "pcie_gen_max": lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie_width_max": lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h),
        "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        "sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "cpu_affinity": lambda: nvml.gpu_cpus(nv, h),
    }
    for key, fn in probes.items():
        value = nvml.probe(nv, notes, f"{what} {key}", fn)
        if value is not None:
            entry[key] = value
    if links is not None and links.present:
        entry["nvlink"] = nvlink.facts(entry.get("name"), entry.get("pci_device_id"), links.version, links.active,
                                       links.present, links.switch)
        if "note" in entry["nvlink"]:
            notes.append(f"{what}: {entry['nvlink']['note']}")
    return entry


def _nvml_topology(n: int, notes: list[str]) -> dict[str, Any] | None:
    """GPU-GPU links, CPU affinity and NVML facts of the ``n`` CUDA devices; None where NVML is absent.

    Whatever goes wrong inside becomes a line in ``notes``, never an exception.
    """
    nv = nvml.start()
    if nv is None:
        return None
    try:
        gpus = nvml.cuda_gpus(nv, n, notes)
        driver = nvml.probe(nv, notes, "driver version", lambda: nvml.text(nv.nvmlSystemGetDriverVersion()))
        links = [(nvml.probe(nv, notes, f"GPU {i} NVLinks", lambda g=g, i=i: _nvlinks(nv, g.handle, notes, f"GPU {i}"))
                  if g else None) or _Links() for i, g in enumerate(gpus)]
        matrix = nvml.probe(nv, notes, "GPU-GPU matrix", lambda: _gpu_matrix(nv, gpus, links, notes))
        return {"driver": driver, "gpu_gpu": matrix or [],
                "gpus": [_gpu_entry(nv, i, g, notes, links[i]) for i, g in enumerate(gpus)]}
    except Exception as e:  # noqa: BLE001 - the inventory reports what it can
        notes.append(f"NVML topology: {type(e).__name__}: {e}")
        return None
    finally:
        nvml.stop(nv)


def _device_entry(i: int) -> dict[str, Any]:
    import torch

    p = torch.cuda.get_device_properties(i)
    return {"index": i, "name": p.name, "memory_bytes": p.total_memory,
            "compute_capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count}


def accelerator_info() -> dict[str, Any]:
    """The CUDA devices and their NVML topology; a probe that fails leaves a line in ``notes``."""
    import torch

    notes: list[str] = []
    if not torch.cuda.is_available():
        return {"count": 0, "devices": [], "driver": None, "topology": None, "notes": notes}
    n = torch.cuda.device_count()
    devices = [nvml.probe(None, notes, f"CUDA device {i} properties", lambda i=i: _device_entry(i)) or {"index": i}
               for i in range(n)]
    topo = _nvml_topology(n, notes)
    return {"count": n, "devices": devices, "driver": topo and topo["driver"], "topology": topo, "notes": notes}


def accelerators_guarded() -> dict[str, Any]:
    """``accelerator_info``, or no devices and a note where it fails: the inventory is written regardless."""
    try:
        return accelerator_info()
    except Exception as e:  # noqa: BLE001 - a broken GPU stack must not stop the record being written
        return {"count": 0, "devices": [], "driver": None, "topology": None,
                "notes": [f"accelerator inventory failed: {type(e).__name__}: {e}"]}
