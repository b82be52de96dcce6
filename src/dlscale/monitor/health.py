"""GPU health through NVML: clock-throttle reasons, ECC counts, retired pages, row remapping, Xid events,
and (``check_host``) the state of each GPU's links: its PCIe link's width against the most it can
train to, and its active NVLinks against its peers of the same model on the host.

A snapshot reads what NVML holds now; a GPU that NVML answers GPU_IS_LOST for (fallen off the bus)
is ``lost``, a fault naming it, never a GPU with empty counters. A run takes one snapshot before
and one after, and at every monitor sample reads the clock-event (throttle) reasons and drains an
NVML event set registered for Xid critical errors (a 0 ms wait, so it never blocks; ``xid.XidWatch``,
a MIG instance's own events only). ``run_warnings`` turns that into the record's faults: a GPU
lost, that slowed itself down (thermal, power brake, HW slowdown), whose uncorrected ECC count
grew, that has a page retirement pending or a row remap failed, or that raised a hardware or
application Xid; ``run_advisories`` into what it recorded without a fault (Xid 63, 94: ``xid``'s
classes; a row remap pending until the next reset). ``check_host(kernel=True)`` also reads the kernel's Xid history since a mark
(``kernlog``) onto the GPUs it names. Every NVML call is guarded (nvml.probe): a counter the GPU
lacks is null, anything unexpected is a note; nothing here raises into a run.
"""

from __future__ import annotations

from typing import Any

from dlscale.format import fmt_count
from dlscale.monitor import fabric, nvml, xid

# nvmlClocksEventReason* bits (nvml.h; the same values as the older nvmlClocksThrottleReason* names).
# The last field says whether the reason means the GPU is slowing itself down because something is
# wrong (too hot, power brake asserted, HW slowdown) rather than idle, capped by a setting, or at
# its configured power limit (sw_power_cap, expected under a heavy load).
REASONS: tuple[tuple[int, str, bool], ...] = (
    (0x1, "gpu_idle", False),
    (0x2, "applications_clocks_setting", False),
    (0x4, "sw_power_cap", False),
    (0x8, "hw_slowdown", True),
    (0x10, "sync_boost", False),
    (0x20, "sw_thermal_slowdown", True),
    (0x40, "hw_thermal_slowdown", True),
    (0x80, "hw_power_brake_slowdown", True),
    (0x100, "display_clock_setting", False),
)
ALARMING = frozenset(name for _, name, bad in REASONS if bad)


def decode_reasons(mask: int) -> list[str]:
    names = [name for bit, name, _ in REASONS if mask & bit]
    known = sum(bit for bit, _, _ in REASONS)
    return names + ([f"unknown_0x{mask & ~known:x}"] if mask & ~known else [])


def throttle_mask(nv: Any, h: Any) -> int:
    """The current clock-event reasons (the newer NVML name where the bindings have it)."""
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) \
        or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return int(fn(h))


def _ecc(nv: Any, h: Any, notes: list[str], what: str) -> dict[str, int | None]:
    kinds = {"corrected": nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "uncorrected": nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
    counters = {"volatile": nv.NVML_VOLATILE_ECC, "aggregate": nv.NVML_AGGREGATE_ECC}
    return {f"{c}_{k}": nvml.probe(nv, notes, f"{what} ECC {c} {k}",
                                   lambda e=e, t=t: int(nv.nvmlDeviceGetTotalEccErrors(h, e, t)))
            for c, t in counters.items() for k, e in kinds.items()}


def _retired(nv: Any, h: Any, notes: list[str], what: str) -> dict[str, Any] | None:
    causes = {"single_bit": nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
              "double_bit": nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR}
    out: dict[str, Any] = {k: nvml.probe(nv, notes, f"{what} retired pages ({k})",
                                         lambda c=c: len(nv.nvmlDeviceGetRetiredPages(h, c)))
                           for k, c in causes.items()}
    pending = nvml.probe(nv, notes, f"{what} retired pages pending",
                         lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
    out["pending"] = None if pending is None else bool(pending)
    return out if any(v is not None for v in out.values()) else None


def _remapped(nv: Any, h: Any, notes: list[str], what: str) -> dict[str, Any] | None:
    rows = nvml.probe(nv, notes, f"{what} remapped rows", lambda: nv.nvmlDeviceGetRemappedRows(h))
    if rows is None:
        return None  # pre-Ampere GPUs retire pages instead
    corr, unc, pending, failure = rows
    return {"correctable": int(corr), "uncorrectable": int(unc), "pending": bool(pending), "failure": bool(failure)}


def lost(nv: Any, h: Any) -> str | None:
    """"GPU_IS_LOST" where NVML says the GPU fell off the bus or is otherwise inaccessible, else None."""
    try:
        nv.nvmlDeviceGetUUID(h)  # answered for a GPU and a MIG instance alike, while it is there
    except Exception as e:  # noqa: BLE001
        if nvml.error_code(nv, e) == getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15):
            return "GPU_IS_LOST"
    return None


def lost_warning(label: str, why: str = "GPU_IS_LOST") -> str:
    return (f"{label} is lost: NVML answers {why} (it fell off the bus or is otherwise inaccessible, Xid 79): "
            "drain the node, then reset the GPU or reboot")


def snapshot(nv: Any, h: Any, notes: list[str], what: str = "GPU", name: str | None = None,
             pci_id: int | None = None) -> dict[str, Any]:
    """Throttle reasons now, ECC counts, retired pages and row remapping of one GPU, and its links and
    limits (``fabric.snapshot``: NVLinks against the model ``name``'s, fabric, PCIe, power limits);
    only ``lost`` for a GPU NVML has lost."""
    if lost(nv, h):
        return {"lost": "GPU_IS_LOST"}
    mask = nvml.probe(nv, notes, f"{what} clock event reasons", lambda: throttle_mask(nv, h))
    return {
        "throttle_reasons": None if mask is None else decode_reasons(mask),
        "ecc": _ecc(nv, h, notes, what),
        "retired_pages": _retired(nv, h, notes, what),
        "remapped_rows": _remapped(nv, h, notes, what),
        **fabric.snapshot(nv, h, notes, what, name, pci_id),
    }


def model(nv: Any, h: Any, notes: list[str], label: str) -> tuple[str | None, int | None]:
    """A GPU's name and PCI device id, which its datasheet rows are found by."""
    return (nvml.probe(nv, notes, f"{label} name", lambda: nvml.text(nv.nvmlDeviceGetName(h))),
            nvml.probe(nv, notes, f"{label} PCI device id", lambda: int(nv.nvmlDeviceGetPciInfo(h).pciDeviceId) >> 16))


def snapshot_warnings(snap: dict[str, Any], label: str) -> list[str]:
    """What in one snapshot says the GPU should not be trusted with a benchmark."""
    if snap.get("lost"):
        return [lost_warning(label, snap["lost"])]
    out = []
    reasons = snap.get("throttle_reasons")
    bad = [r for r in reasons or [] if r in ALARMING]
    if bad:
        out.append(f"{label} is slowing its clocks now ({', '.join(bad)}): check cooling and power before measuring")
    ecc = snap.get("ecc") or {}
    if ecc.get("volatile_uncorrected"):
        out.append(f"{label} has {ecc['volatile_uncorrected']} uncorrected ECC errors since the driver loaded: "
                   "drain it and run the vendor diagnostics")
    out.extend(_pending(snap, label))
    out.extend(fabric.faults(snap, label, idle=reasons is None or "gpu_idle" in reasons))
    return out


def snapshot_advisories(snap: dict[str, Any], label: str) -> list[str]:
    """What in one snapshot is the GPU's configuration or history rather than a fault now (a power cap,
    a slot below its PCIe generation, NVLink recoveries since the driver loaded): an acceptance WARNs."""
    return fabric.configured(snap, label) + _remap_pending(snap, label)


def _remap_pending(snap: dict[str, Any], label: str) -> list[str]:
    """A row remap pending (Ampere and later) is not a fault: until the next reset, error containment and
    dynamic page offlining keep the bad row out of use, and work runs at full accuracy and speed
    (NVIDIA's GPU memory error management guide, "Error Recovery and Response Flags")."""
    if not (snap.get("remapped_rows") or {}).get("pending"):
        return []
    return [f"{label} has a row remap pending: it takes effect at the GPU's next reset (work meanwhile runs "
            "unaffected); reset it at the next drain"]


def _pending(snap: dict[str, Any], label: str) -> list[str]:
    out = []
    pages, rows = snap.get("retired_pages") or {}, snap.get("remapped_rows") or {}
    if pages.get("pending"):
        out.append(f"{label} has a page retirement pending: reset the GPU (or reboot) to apply it")
    if rows.get("failure"):
        out.append(f"{label} failed a row remap: the GPU needs service")
    return out


def run_warnings(report: dict[str, Any]) -> list[str]:
    """A run's faults from its health report (see HealthWatch.report)."""
    label = report.get("gpu", "GPU")
    gone = report.get("lost") or (report.get("after") or {}).get("lost")
    out = [lost_warning(label, gone)] if gone else []
    counts, n = report.get("throttle_samples") or {}, report.get("samples") or 0
    bad = {r: c for r, c in counts.items() if r in ALARMING and c}
    if bad:
        seen = ", ".join(f"{r} in {c} of {fmt_count(n, 'sample')}" for r, c in sorted(bad.items()))
        out.append(f"{label} slowed its clocks during the run ({seen}): its figures are below what a healthy "
                   "GPU gives; check cooling and power (dlscale sysinfo --health)")
    before, after = report.get("before") or {}, report.get("after") or {}
    for counter in ("volatile_uncorrected", "aggregate_uncorrected"):
        a, b = (before.get("ecc") or {}).get(counter), (after.get("ecc") or {}).get(counter)
        if a is not None and b is not None and b > a:
            out.append(f"{label}: uncorrected ECC errors grew during the run ({counter.replace('_', ' ')} {a} -> {b})")
            break
    out.extend(_pending(after, label))
    out.extend(fabric.warnings(after, label, idle=True, since_load=False) + fabric.grown(before, after, label))
    load = report.get("pcie_under_load") or {}
    if load.get("samples"):
        out.extend(fabric.pcie_warnings({**(after.get("pcie") or {}), **load}, label, idle=False))
    out.extend(xid.warnings(report.get("xid_events") or [], label))
    return list(dict.fromkeys(out))


def run_advisories(report: dict[str, Any]) -> list[str]:
    """What a run's GPU recorded without a fault (Xid 63, 94, ...: ``xid.RECORDED``): an acceptance WARNs."""
    label = report.get("gpu", "GPU")
    return xid.advisories(report.get("xid_events") or [], label) + _remap_pending(report.get("after") or {}, label)


class HealthWatch:
    """One GPU's health over a run: snapshots at start and stop; throttle reasons and Xids at each poll."""

    def __init__(self, nv: Any, gpu: nvml.NvmlGpu, label: str):
        self.nv, self.gpu, self.label = nv, gpu, label
        self.notes: list[str] = []
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        self.samples = 0
        self.xids: list[int] = []
        self.xid: xid.XidWatch | None = None
        self.pcie: dict[str, int] = {"samples": 0}  # the PCIe link under load: highest generation, narrowest width
        self.model: tuple[str | None, int | None] = (None, None)
        self.closed: xid.XidWatch | None = None  # the watch after stop, for its lost and other instances' events

    def start(self) -> None:
        self.model = model(self.nv, self.gpu.handle, self.notes, self.label)
        self.before = snapshot(self.nv, self.gpu.handle, self.notes, self.label, *self.model)
        self.xid = nvml.probe(self.nv, self.notes, f"{self.label} Xid event registration",
                              lambda: xid.XidWatch(self.nv, self.gpu, self.notes))

    def poll(self) -> None:
        mask = nvml.probe(self.nv, self.notes, f"{self.label} clock event reasons",
                          lambda: throttle_mask(self.nv, self.gpu.handle))
        if mask is not None:
            self.samples += 1
            for name in decode_reasons(mask):
                self.counts[name] = self.counts.get(name, 0) + 1
        if mask is not None and not mask & 0x1:  # under load: the PCIe link is at the rate it can hold
            now = nvml.probe(self.nv, self.notes, f"{self.label} PCIe link",
                             lambda: fabric.pcie_now(self.nv, self.gpu.handle))
            if now is not None:
                p = self.pcie
                p["gen"], p["width"] = max(p.get("gen", 0), now[0]), min(p.get("width", now[1]), now[1])
                p["samples"] += 1
        if self.xid is not None:
            self.xids.extend(nvml.probe(self.nv, self.notes, f"{self.label} Xid events", self.xid.drain) or [])

    def stop(self) -> None:
        """The closing snapshot (the monitor's last sample has already polled)."""
        self.after = snapshot(self.nv, self.gpu.handle, self.notes, self.label, *self.model)
        if self.xid is not None:
            self.xid.close()
            self.closed, self.xid = self.xid, None

    def report(self) -> dict[str, Any]:
        watch = self.xid or self.closed
        return {"gpu": self.label, "nvml_index": self.gpu.index, "mig_instance": self.gpu.mig,
                "matched_by": self.gpu.matched_by, "before": self.before, "after": self.after, "samples": self.samples,
                "throttle_samples": dict(self.counts), "xid_events": list(self.xids),
                "xid_classes": xid.describe(self.xids), "pcie_under_load": dict(self.pcie), "notes": list(self.notes),
                "lost": (watch.lost if watch else None) or self.after.get("lost") or self.before.get("lost"),
                "xid_other_instances": list(watch.others) if watch else []}

    def warnings(self) -> list[str]:
        """Faults, then advisories: the run's notes."""
        return run_warnings(self.report()) + run_advisories(self.report())


def watch_gpu(cuda_index: int, notes: list[str]) -> HealthWatch | None:
    """A health watch for CUDA device ``cuda_index``; None (and a note why) where NVML cannot give one."""
    nv = nvml.start()
    if nv is None:
        return None  # the NVML source already says GPU monitoring is unavailable
    gpu = nvml.probe(nv, notes, f"GPU {cuda_index} health", lambda: nvml.cuda_handle(nv, cuda_index, notes))
    if gpu is None:
        return None
    return HealthWatch(nv, gpu, f"GPU {cuda_index}")


def check_host(kernel: bool = False, since: dict[str, Any] | None = None) -> dict[str, Any]:
    """``dlscale sysinfo --health``: a snapshot, the links' state and their faults (``warnings``), advisories
    and what could not be read (``unread``) for every GPU NVML sees on this host, and every GPU it lost;
    with ``kernel``, also the kernel's Xid history after the mark ``since`` (``kernlog.read``), on the
    GPUs it names (``xid.attach_history``)."""
    nv = nvml.start()
    if nv is None:
        return {"gpus": [], "note": "no NVIDIA GPU visible to NVML here (no driver or no nvidia-ml-py): "
                                    "nothing to check"}
    notes: list[str] = []
    lost_gpus: list[int] = []
    try:
        gpus = []
        for g in nvml.host_gpus(nv, notes, lost_gpus):
            label = f"GPU {g.index}"
            name, pci_id = model(nv, g.handle, notes, label)
            snap = snapshot(nv, g.handle, notes, label, name, pci_id)
            gpus.append({"index": g.index, "name": name, "pci_bus_id": g.bus_id, "uuid": g.uuid,
                         "mig_mode": g.mig_mode, **snap, "warnings": snapshot_warnings(snap, label),
                         "advisories": snapshot_advisories(snap, label), "unread": fabric.unread(snap, label)})
    finally:
        nvml.stop(nv)
    gpus += [{"index": i, "name": None, "lost": "GPU_IS_LOST", "warnings": [lost_warning(f"GPU {i}")],
              "advisories": [], "unread": []} for i in lost_gpus]
    out: dict[str, Any] = {"gpus": sorted(gpus, key=lambda g: g["index"]), "notes": notes}
    if kernel and gpus:
        from dlscale.monitor import kernlog

        out["kernel_xids"] = kernlog.read(since)
        xid.attach_history(out["gpus"], out["kernel_xids"])
    if not gpus:
        out["note"] = "NVML answered but lists no GPU: nothing to check"
    return out
