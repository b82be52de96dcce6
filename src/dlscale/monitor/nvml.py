"""NVML access shared by the inventory (system_gpu.py), the monitor and the health checks.

``start()`` imports the bindings (nvidia-ml-py's ``pynvml``) and initialises NVML, or says None
where either is missing. ``cuda_gpus()`` maps each CUDA device to its NVML device: CUDA numbers
only the devices it can see (``CUDA_VISIBLE_DEVICES``) in its own order, NVML numbers every GPU
on the host by PCI address, so CUDA index i is NVML index i only by luck. The match is by UUID
(torch's device properties), then by PCI address, then by the ``CUDA_VISIBLE_DEVICES`` entry, and
only last by equal index, which the record then says. UUID comes first because of MIG: a GPU in
MIG mode is never a CUDA device itself, CUDA sees its instances, and each instance has the GPU's
PCI address but a UUID of its own ("MIG-..."), so only the UUID tells which instance a CUDA device
is; a GPU in MIG mode is never matched by PCI address or index, since its figures would be
the whole GPU's under an instance's name. ``probe()`` runs one NVML call: an NVMLError (a counter
this GPU or driver does not have) gives None, any other exception gives None and a note, so no
NVML surprise escapes into a run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


def load() -> Any | None:
    """The ``pynvml`` module, or None where nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def start() -> Any | None:
    """``pynvml`` with NVML initialised; None where the bindings, the library or the driver are missing."""
    nv = load()
    if nv is None:
        return None
    try:
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no libnvidia-ml: no NVML
        return None
    return nv


def stop(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass


def nvlink_states(nv: Any, h: Any) -> list[bool]:
    """Whether each NVLink of a GPU is up, for every link it has: NVML answers for each of them (enabled
    or disabled) and errs past the last one, or at once on a GPU without NVLink."""
    states = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            states.append(nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED)
        except nv.NVMLError:
            break
    return states


def gpu_cpus(nv: Any, h: Any) -> list[int]:
    """The CPUs NVML names ideal for this GPU (its NUMA node's, as a bitmask of 64-bit words): the mask
    spans every CPU of the host, so its length comes from the host's CPU count, not this process's
    affinity."""
    words = max(1, -(-(os.cpu_count() or 64) // 64))
    mask = nv.nvmlDeviceGetCpuAffinity(h, words)
    return [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def error_code(nv: Any, e: BaseException) -> int | None:
    """The NVML return code an exception carries (``NVMLError.value``); None for any other exception."""
    nvml_error = getattr(nv, "NVMLError", None)
    if isinstance(nvml_error, type) and isinstance(e, nvml_error):
        return int(getattr(e, "value", -1))
    return None


def error_name(nv: Any, code: int) -> str:
    """NVML's name of a return code without its prefix: 15 -> "GPU_IS_LOST" (``NVML_ERROR_GPU_IS_LOST``)."""
    names = [k[len("NVML_ERROR_"):] for k, v in vars(nv).items() if k.startswith("NVML_ERROR_") and v == code]
    return min(names, key=len) if names else f"NVML error {code}"


def probe(nv: Any, notes: list[str], what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``; None when NVML says the GPU lacks it, None and a note on any other exception."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - an inventory or a run must outlive any NVML surprise
        if error_code(nv, e) is None:
            notes.append(f"{what}: {type(e).__name__}: {e}")
        return None


@dataclass
class NvmlGpu:
    index: int  # NVML's index (PCI order over the whole host); a MIG instance's is its GPU's
    handle: Any
    pci: tuple[int, int, int] | None  # (domain, bus, device)
    bus_id: str | None
    uuid: str | None
    matched_by: str = ""  # how the CUDA device was matched to it
    mig: int | None = None  # a MIG instance: its index on the GPU (nvmlDeviceGetMigDeviceHandleByIndex)
    mig_mode: bool = False  # a GPU in MIG mode: CUDA sees its instances, never the GPU itself

    @property
    def label(self) -> str:
        return f"NVML GPU {self.index}" + ("" if self.mig is None else f" MIG instance {self.mig}")


def host_gpus(nv: Any, notes: list[str], lost: list[int] | None = None) -> list[NvmlGpu]:
    """Every GPU NVML sees on this host, with its PCI address, UUID and MIG mode where NVML gives them.
    A GPU NVML counts but whose handle it answers ``GPU_IS_LOST`` for (fallen off the bus) is left out,
    and its index added to ``lost``."""
    gpus = []
    for i in range(probe(nv, notes, "NVML device count", lambda: nv.nvmlDeviceGetCount()) or 0):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception as e:  # noqa: BLE001 - a GPU NVML cannot open is reported, never raised
            if lost is not None and error_code(nv, e) == getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15):
                lost.append(i)
            elif error_code(nv, e) is None:
                notes.append(f"NVML GPU {i} handle: {type(e).__name__}: {e}")
            continue
        pci = probe(nv, notes, f"NVML GPU {i} PCI info", lambda h=h: nv.nvmlDeviceGetPciInfo(h))
        uuid = probe(nv, notes, f"NVML GPU {i} UUID", lambda h=h: text(nv.nvmlDeviceGetUUID(h)))
        mode = probe(nv, notes, f"NVML GPU {i} MIG mode", lambda h=h: nv.nvmlDeviceGetMigMode(h))  # pre-Ampere: None
        addr = (int(pci.domain), int(pci.bus), int(pci.device)) if pci is not None else None
        gpus.append(NvmlGpu(i, h, addr, text(pci.busId) if pci is not None else None, uuid,
                            mig_mode=mode is not None and int(mode[0]) == nv.NVML_DEVICE_MIG_ENABLE))
    return gpus


def mig_instances(nv: Any, gpus: list[NvmlGpu], notes: list[str]) -> list[NvmlGpu]:
    """The MIG instances of the GPUs in MIG mode, each with its own UUID and its GPU's PCI address.

    NVML numbers a GPU's instance slots 0 .. nvmlDeviceGetMaxMigDeviceCount - 1 and answers
    NOT_FOUND for an empty slot."""
    out = []
    for g in gpus:
        if not g.mig_mode:
            continue
        slots = probe(nv, notes, f"{g.label} MIG slots", lambda g=g: nv.nvmlDeviceGetMaxMigDeviceCount(g.handle))
        for k in range(int(slots or 0)):
            h = probe(nv, notes, f"{g.label} MIG instance {k}",
                      lambda g=g, k=k: nv.nvmlDeviceGetMigDeviceHandleByIndex(g.handle, k))
            if h is None:
                continue
            uuid = probe(nv, notes, f"{g.label} MIG instance {k} UUID", lambda h=h: text(nv.nvmlDeviceGetUUID(h)))
            out.append(NvmlGpu(g.index, h, g.pci, g.bus_id, uuid, mig=k))
    return out


def visible_devices(env: str | None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs); None when it is unset."""
    if env is None:
        return None
    return [e.strip() for e in env.split(",") if e.strip()]


def _uuid_key(u: str) -> str:
    """A UUID without NVML's "GPU-" or "MIG-" prefix, in lower case (torch prints it bare)."""
    u = u.strip().lower()
    return u[4:] if u.startswith(("gpu-", "mig-")) else u


def _cuda_ids(cuda_index: int) -> tuple[tuple[int, int, int] | None, str | None]:
    """(PCI domain, bus, device) and UUID of a CUDA device from torch, where torch has them."""
    import torch

    p = torch.cuda.get_device_properties(cuda_index)
    parts = (getattr(p, "pci_domain_id", None), getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None))
    addr = tuple(int(x) for x in parts) if all(x is not None for x in parts) else None
    uuid = getattr(p, "uuid", None)
    return addr, (str(uuid) if uuid else None)  # type: ignore[return-value]


def match_cuda(gpus: list[NvmlGpu], cuda_index: int, addr: tuple[int, int, int] | None, uuid: str | None,
               visible: list[str] | None) -> NvmlGpu | None:
    """The NVML device of CUDA device ``cuda_index``, with ``matched_by`` set; None if none fits.

    ``gpus`` holds the host's GPUs and their MIG instances. The UUID decides first: it is the only
    thing that tells a MIG instance from its GPU and its sibling instances. A GPU in MIG mode is
    never the answer, since CUDA cannot use it itself. A ``CUDA_VISIBLE_DEVICES`` index is CUDA's
    own numbering, which equals NVML's (PCI order) under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or on a
    host of identical GPUs; so it comes after UUID and PCI address.
    """
    by_uuid = next((g for g in gpus if uuid and g.uuid and _uuid_key(g.uuid) == _uuid_key(uuid)), None)
    if by_uuid is None and addr and any(g.mig_mode and g.pci == addr for g in gpus):
        return None  # an instance of that GPU, but which one only the UUID can say
    whole = [g for g in gpus if g.mig is None and not g.mig_mode]
    found: list[tuple[str, NvmlGpu | None]] = [
        ("UUID", by_uuid), ("PCI address", next((g for g in whole if addr and g.pci == addr), None))]
    if visible is not None and cuda_index < len(visible):
        entry = visible[cuda_index]
        if entry.isdigit():
            hit = next((g for g in whole if g.index == int(entry)), None)
        else:
            hit = next((g for g in gpus if g.uuid and _uuid_key(g.uuid).startswith(_uuid_key(entry))), None)
        found.append(("CUDA_VISIBLE_DEVICES", hit))
    elif visible is None:
        found.append(("equal index (assumed)", next((g for g in whole if g.index == cuda_index), None)))
    for how, g in found:
        if g is not None and not g.mig_mode:
            return replace(g, matched_by=how)
    return None


def _match_one(nv: Any, gpus: list[NvmlGpu], i: int, visible: list[str] | None, notes: list[str]) -> NvmlGpu | None:
    ids = probe(nv, notes, f"CUDA device {i} PCI address/UUID", lambda: _cuda_ids(i)) or (None, None)
    g = match_cuda(gpus, i, ids[0], ids[1], visible)
    if g is None:
        parent = next((p for p in gpus if p.mig_mode and ids[0] and p.pci == ids[0]), None)
        if parent is not None:
            notes.append(f"CUDA device {i} is a MIG instance of {parent.label}, but neither its UUID nor "
                         "CUDA_VISIBLE_DEVICES says which: its NVML figures are left out (the GPU's would be "
                         "the whole GPU's)")
        else:
            notes.append(f"CUDA device {i}: no NVML device matches its UUID, PCI address or CUDA_VISIBLE_DEVICES "
                         "entry: its NVML figures are left out")
    return g


def _host_devices(nv: Any, notes: list[str]) -> list[NvmlGpu]:
    gpus = host_gpus(nv, notes)
    return gpus + mig_instances(nv, gpus, notes)


def cuda_gpus(nv: Any, n: int, notes: list[str]) -> list[NvmlGpu | None]:
    """The NVML device (a GPU or a MIG instance) of each of the ``n`` CUDA devices (None where none matches)."""
    devices = _host_devices(nv, notes)
    visible = visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [_match_one(nv, devices, i, visible, notes) for i in range(n)]


def cuda_handle(nv: Any, cuda_index: int, notes: list[str]) -> NvmlGpu | None:
    """The NVML device of one CUDA device (the monitor's GPU)."""
    visible = visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return _match_one(nv, _host_devices(nv, notes), cuda_index, visible, notes)
