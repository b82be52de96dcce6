"""Xids: what each class means for a verdict, the NVML watch over a run, and the kernel log's history.

Every Xid the driver raises is in one class, and the class decides the verdict (docs/CLUSTER.md,
"Xid classes"; NVIDIA's Xid catalogue, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
for the names and actions, and the A100 GPU memory error management guide,
docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt, "User Visible Statistics", for 48/63/64/94/95):

- ``application`` (13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
  45 preemptive cleanup, 68 video processor exception, 109 context switch timeout): the program's
  own fault (an illegal address, a killed process). NVIDIA's GPU device plugin for Kubernetes
  leaves a GPU healthy after these (NVIDIA/k8s-device-plugin, internal/rm/health.go). In a run's
  own watch the run is not to be trusted (a fault of the run); in the kernel's history they are
  other programs' and judge nothing.
- ``memory recorded`` (63: a row remap or page retirement recorded in the InfoROM; 92 a high rate
  of corrected single-bit errors; 94: a contained uncorrectable ECC error, whose program was ended
  and whose page was taken offline, the GPU needing no reset (Ampere and later, the guide's "Error
  Containment"); 160 memory marked for repair): the GPU recorded or contained a memory error and
  keeps working: a WARN, never a FAIL or a drain. What is left to do (a remap pending until a
  reset, a remap that failed) is NVML's row-remap state, which the health snapshot judges on its own.
- ``hardware/driver`` (every other code, known or not, as the device plugin treats them: 48 an
  uncorrectable ECC error, 64 a row-remap recording failure, 74 NVLink, 79 fallen off the bus,
  95 an uncontained ECC error, 119/120 GSP, ...): the GPU is suspect: a FAIL, which drains a node.

``XidWatch`` drains an NVML event set registered for Xid critical errors without waiting. NVML
registers events on a whole GPU only ("does not support per-instance event reporting using MIG
device handles", nvmlEventSetWait_v2), so the watch of a MIG instance registers its GPU and keeps
the events whose ``gpuInstanceId``/``computeInstanceId`` are its own, or that name no instance
(0xFFFFFFFF: the whole GPU's); another instance's Xid is recorded apart and blames nothing here.
A wait that answers GPU_IS_LOST is the GPU lost, never an empty queue. ``attach_history`` puts the
kernel's ``NVRM: Xid (PCI:dddd:bb:dd[ GPU-I:n]): NN, ...`` lines since a mark on the GPUs they name.
"""

from __future__ import annotations

import re
from typing import Any

from dlscale.monitor import nvml

APPLICATION = "application"
RECORDED = "memory recorded"
HARDWARE = "hardware/driver"
ANY_INSTANCE = 0xFFFFFFFF  # NVML_GPU_INSTANCE_ID_ANY / NVML_COMPUTE_INSTANCE_ID_ANY: the event is no one instance's

NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout error",
    119: "GSP RPC timeout",
    120: "GSP error",
    160: "GPU memory marked for repair",
}
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
RECORDED_XIDS = frozenset({63, 92, 94, 160})
ADVICE = {
    HARDWARE: "the GPU is suspect: see the kernel log (dmesg), drain it and run the vendor diagnostics",
    RECORDED: "a memory error the GPU recorded or contained; it keeps working (nvidia-smi -q -d ROW_REMAPPER "
              "says whether a remap waits for a reset)",
    APPLICATION: "the program's own fault (e.g. an illegal memory access or a killed process), not the GPU's",
}


def classify(code: int) -> str:
    """``APPLICATION``, ``RECORDED`` or ``HARDWARE`` (every code not known to be one of the others)."""
    code = int(code)
    return APPLICATION if code in APPLICATION_XIDS else RECORDED if code in RECORDED_XIDS else HARDWARE


def describe(codes: list[int]) -> list[dict[str, object]]:
    """Each distinct Xid with its name (where known), class and how often it came."""
    return [{"xid": c, "name": NAMES.get(c), "class": classify(c), "count": codes.count(c)}
            for c in sorted(set(int(x) for x in codes))]


def _line(codes: list[int], cls: str, label: str, when: str, advice: str) -> list[str]:
    mine = [d for d in describe(codes) if d["class"] == cls]
    if not mine:
        return []
    seen = ", ".join(f"{d['xid']}" + (f" ({d['name']})" if d["name"] else "") for d in mine)
    return [f"{label} raised {cls} Xid {seen} {when}: {advice}"]


def warnings(codes: list[int], label: str) -> list[str]:
    """A run's own Xids that make it untrustworthy: hardware/driver ones (the GPU is suspect) and
    application ones (the program's fault)."""
    return (_line(codes, HARDWARE, label, "during the run", ADVICE[HARDWARE] + "; do not trust this run")
            + _line(codes, APPLICATION, label, "during the run", ADVICE[APPLICATION] + "; the run is not to be trusted"))


def advisories(codes: list[int], label: str, when: str = "during the run") -> list[str]:
    """Xids of the recorded class: a WARN."""
    return _line(codes, RECORDED, label, when, ADVICE[RECORDED])


def history_faults(codes: list[int], label: str, when: str) -> list[str]:
    """Xids in the kernel's history that FAIL the GPU: the hardware/driver class alone (an application
    Xid there was another program's)."""
    return _line(codes, HARDWARE, label, when, ADVICE[HARDWARE])


class XidWatch:
    """An NVML event set registered for Xid critical errors on one GPU, drained without waiting; for a
    MIG instance, registered on its GPU and keeping the instance's own events (the module doc)."""

    def __init__(self, nv: Any, gpu: nvml.NvmlGpu, notes: list[str]):
        self.nv, self.notes = nv, notes
        self.instance: tuple[int, int] | None = None
        self.others: list[dict[str, int]] = []  # other MIG instances' Xids: seen, not this run's
        self.lost: str | None = None
        handle = gpu.handle
        if gpu.mig is not None:
            self.instance = (int(nv.nvmlDeviceGetGpuInstanceId(handle)), int(nv.nvmlDeviceGetComputeInstanceId(handle)))
            handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        self.set = nv.nvmlEventSetCreate()
        try:
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self.set)
        except Exception:
            self.close()
            raise

    def mine(self, event: Any) -> bool:
        """Whether an event is this watch's: every event on a whole GPU; on a MIG instance, the events of
        its own GPU and compute instance, or of none (the whole GPU's)."""
        if self.instance is None:
            return True
        gi = int(getattr(event, "gpuInstanceId", ANY_INSTANCE))
        ci = int(getattr(event, "computeInstanceId", ANY_INSTANCE))
        return gi == ANY_INSTANCE or (gi == self.instance[0] and ci in (ANY_INSTANCE, self.instance[1]))

    def drain(self, limit: int = 64) -> list[int]:
        """The Xid numbers of this watch's events waiting now (NVML's 0 ms wait answers TIMEOUT when none
        is; GPU_IS_LOST sets ``lost``; any other error is a note)."""
        out = []
        for _ in range(limit):
            try:
                event = self.nv.nvmlEventSetWait(self.set, 0)
            except Exception as e:  # noqa: BLE001 - an NVML answer is a finding, never an exception in a run
                code = nvml.error_code(self.nv, e)
                if code == getattr(self.nv, "NVML_ERROR_GPU_IS_LOST", 15):
                    self.lost = "GPU_IS_LOST"
                elif code != getattr(self.nv, "NVML_ERROR_TIMEOUT", 10):
                    self.notes.append(f"Xid events: {nvml.error_name(self.nv, code) if code is not None else e}")
                break
            if self.mine(event):
                out.append(int(event.eventData))
            else:
                self.others.append({"xid": int(event.eventData), "gpu_instance": int(event.gpuInstanceId),
                                    "compute_instance": int(event.computeInstanceId)})
        return out

    def close(self) -> None:
        if self.set is not None:
            try:
                self.nv.nvmlEventSetFree(self.set)
            except Exception:  # noqa: BLE001
                pass
            self.set = None


# -- the kernel log's Xid lines ---------------------------------------------------------------------------------------
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)([^)]*)\): (\d+)")


def parse(text: str) -> dict[str, Any] | None:
    """One kernel line's Xid: its number, the GPU's PCI address (domain, bus, device) and, under MIG, its
    GPU instance (``GPU-I:n``); None for any other line."""
    m = XID_LINE.search(text)
    if m is None:
        return None
    gi = re.search(r"GPU-I:(\w+)", m.group(4))
    return {"xid": int(m.group(5)), "pci": [int(m.group(k), 16) for k in (1, 2, 3)],
            "gpu_instance": int(gi.group(1), 16 if not gi.group(1).isdigit() else 10) if gi else None}


def pci_of(bus_id: str | None) -> list[int] | None:
    """(domain, bus, device) of NVML's bus id, "00000000:3B:00.0"."""
    m = re.match(r"([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)", bus_id or "")
    return [int(m.group(k), 16) for k in (1, 2, 3)] if m else None


def attach_history(gpus: list[dict[str, Any]], history: dict[str, Any]) -> None:
    """Each GPU's Xids of the kernel's history (``kernlog.read``'s events, parsed) as its ``xid_history``,
    its faults (``warnings``) and advisories; a history that could not be read is an advisory on every
    GPU; Xids of a PCI address no GPU here has (one lost to NVML) make an entry of their own."""
    when = history.get("window") or "in the kernel log"
    if history.get("unread"):
        for g in gpus:
            g.setdefault("advisories", []).append(f"the kernel's Xid history ({when}) could not be read: "
                                                  f"{history['unread']}")
        return
    events = history.get("events") or []
    placed: set[int] = set()
    for g in gpus:
        mine = [e for e in events if e["pci"] == pci_of(g.get("pci_bus_id"))]
        placed |= {id(e) for e in mine}
        _judge(g, [e["xid"] for e in mine], g.get("label") or f"GPU {g.get('index')}", when)
    for pci in sorted({tuple(e["pci"]) for e in events if id(e) not in placed}):
        codes = [e["xid"] for e in events if tuple(e["pci"]) == pci]
        if all(classify(c) == APPLICATION for c in codes):
            continue  # another program's fault on a GPU not listed here: nothing to judge
        where = "{:04x}:{:02x}:{:02x}".format(*pci)
        entry: dict[str, Any] = {"index": None, "label": f"the GPU at PCI {where}", "pci_bus_id": where,
                                 "warnings": [], "advisories": []}
        _judge(entry, codes, entry["label"], when)
        gpus.append(entry)


def _judge(g: dict[str, Any], codes: list[int], label: str, when: str) -> None:
    g["xid_history"] = describe(codes)
    g.setdefault("warnings", []).extend(history_faults(codes, label, when))
    g.setdefault("advisories", []).extend(advisories(codes, label, when))
