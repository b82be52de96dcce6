"""GPU health through NVML: clock-throttle reasons, ECC counts, retired pages, row remapping, Xid events,
and (``check_host``) the state of each GPU's links: its PCIe link's width against the most it can
train to, and its active NVLinks against its peers of the same model on the host.

A snapshot reads what NVML holds now. A run takes one snapshot before and one after, and at every
monitor sample reads the clock-event (throttle) reasons and drains an NVML event set registered
for Xid critical errors (a 0 ms wait, so it never blocks). ``run_warnings`` turns that into the
record's warnings: a GPU that slowed itself down (thermal, power brake, HW slowdown), whose
uncorrected ECC count grew, that has a page retirement or row remap pending or failed, or that
raised an Xid. Every NVML call is guarded (nvml.probe): a counter the GPU lacks is null, anything
unexpected is a note; nothing here raises into a run.
"""

from __future__ import annotations

from typing import Any

from dlscale.format import fmt_count
from dlscale.monitor import nvml

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


def snapshot(nv: Any, h: Any, notes: list[str], what: str = "GPU") -> dict[str, Any]:
    """Throttle reasons now, ECC counts, retired pages and row remapping of one GPU."""
    mask = nvml.probe(nv, notes, f"{what} clock event reasons", lambda: throttle_mask(nv, h))
    return {
        "throttle_reasons": None if mask is None else decode_reasons(mask),
        "ecc": _ecc(nv, h, notes, what),
        "retired_pages": _retired(nv, h, notes, what),
        "remapped_rows": _remapped(nv, h, notes, what),
    }


def snapshot_warnings(snap: dict[str, Any], label: str) -> list[str]:
    """What in one snapshot says the GPU should not be trusted with a benchmark."""
    out = []
    bad = [r for r in snap.get("throttle_reasons") or [] if r in ALARMING]
    if bad:
        out.append(f"{label} is slowing its clocks now ({', '.join(bad)}): check cooling and power before measuring")
    ecc = snap.get("ecc") or {}
    if ecc.get("volatile_uncorrected"):
        out.append(f"{label} has {ecc['volatile_uncorrected']} uncorrected ECC errors since the driver loaded: "
                   "drain it and run the vendor diagnostics")
    out.extend(_pending(snap, label))
    return out


def _pending(snap: dict[str, Any], label: str) -> list[str]:
    out = []
    pages, rows = snap.get("retired_pages") or {}, snap.get("remapped_rows") or {}
    if pages.get("pending"):
        out.append(f"{label} has a page retirement pending: reset the GPU (or reboot) to apply it")
    if rows.get("pending"):
        out.append(f"{label} has a row remap pending: reset the GPU (or reboot) to apply it")
    if rows.get("failure"):
        out.append(f"{label} failed a row remap: the GPU needs service")
    return out


def run_warnings(report: dict[str, Any]) -> list[str]:
    """Warnings for a run from its health report (see HealthWatch.report)."""
    label = report.get("gpu", "GPU")
    out = []
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
    if report.get("xid_events"):
        out.append(f"{label} raised Xid {', '.join(map(str, report['xid_events']))} during the run: "
                   "see the kernel log (dmesg) and do not trust this run")
    return out


class XidWatch:
    """An NVML event set registered for Xid critical errors, drained without waiting."""

    def __init__(self, nv: Any, handles: list[Any]):
        self.nv = nv
        self.set = nv.nvmlEventSetCreate()
        try:
            for h in handles:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self.set)
        except Exception:
            self.close()
            raise

    def drain(self, limit: int = 64) -> list[int]:
        """The Xid numbers of the events waiting now (NVML's 0 ms wait raises a timeout when none is)."""
        out = []
        for _ in range(limit):
            try:
                event = self.nv.nvmlEventSetWait(self.set, 0)
            except self.nv.NVMLError:
                break
            out.append(int(event.eventData))
        return out

    def close(self) -> None:
        if self.set is not None:
            try:
                self.nv.nvmlEventSetFree(self.set)
            except Exception:  # noqa: BLE001
                pass
            self.set = None


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
        self.xid: XidWatch | None = None

    def start(self) -> None:
        self.before = snapshot(self.nv, self.gpu.handle, self.notes, self.label)
        self.xid = nvml.probe(self.nv, self.notes, f"{self.label} Xid event registration",
                              lambda: XidWatch(self.nv, [self.gpu.handle]))

    def poll(self) -> None:
        mask = nvml.probe(self.nv, self.notes, f"{self.label} clock event reasons",
                          lambda: throttle_mask(self.nv, self.gpu.handle))
        if mask is not None:
            self.samples += 1
            for name in decode_reasons(mask):
                self.counts[name] = self.counts.get(name, 0) + 1
        if self.xid is not None:
            self.xids.extend(nvml.probe(self.nv, self.notes, f"{self.label} Xid events", self.xid.drain) or [])

    def stop(self) -> None:
        """The closing snapshot (the monitor's last sample has already polled)."""
        self.after = snapshot(self.nv, self.gpu.handle, self.notes, self.label)
        if self.xid is not None:
            self.xid.close()
            self.xid = None

    def report(self) -> dict[str, Any]:
        return {"gpu": self.label, "nvml_index": self.gpu.index, "mig_instance": self.gpu.mig,
                "matched_by": self.gpu.matched_by, "before": self.before, "after": self.after, "samples": self.samples,
                "throttle_samples": dict(self.counts), "xid_events": list(self.xids), "notes": list(self.notes)}

    def warnings(self) -> list[str]:
        return run_warnings(self.report())


def watch_gpu(cuda_index: int, notes: list[str]) -> HealthWatch | None:
    """A health watch for CUDA device ``cuda_index``; None (and a note why) where NVML cannot give one."""
    nv = nvml.start()
    if nv is None:
        return None  # the NVML source already says GPU monitoring is unavailable
    gpu = nvml.probe(nv, notes, f"GPU {cuda_index} health", lambda: nvml.cuda_handle(nv, cuda_index, notes))
    if gpu is None:
        return None
    return HealthWatch(nv, gpu, f"GPU {cuda_index}")


def link_state(nv: Any, h: Any, notes: list[str], what: str) -> dict[str, Any]:
    """One GPU's links now: the PCIe link's current and greatest generation and width, and its NVLinks
    (``nvlinks_active``; ``nvlinks_down``: the links NVML lists as disabled). NVML answers
    NOT_SUPPORTED past a GPU's last link, and for every link on a GPU without NVLink."""
    out: dict[str, Any] = {k: nvml.probe(nv, notes, f"{what} {k}", lambda fn=fn: int(fn(h))) for k, fn in (
        ("pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration), ("pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration),
        ("pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth), ("pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth))}
    active, down = 0, []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = nv.nvmlDeviceGetNvLinkState(h, link)
        except nv.NVMLError:
            break
        except Exception as e:  # noqa: BLE001 - a health check outlives any NVML surprise
            notes.append(f"{what} NVLink {link} state: {type(e).__name__}: {e}")
            break
        if state == nv.NVML_FEATURE_ENABLED:
            active += 1
        else:
            down.append(link)
    return {**out, "nvlinks_active": active, "nvlinks_down": down}


def link_warnings(gpus: list[dict[str, Any]]) -> dict[int, list[str]]:
    """NVML index -> what its links say is wrong: a PCIe link trained narrower than the GPU's widest
    (the generation drops at idle to save power, the width does not), or fewer NVLinks active than
    the GPU of the same model with the most on this host."""
    most: dict[str, int] = {}
    for g in gpus:
        most[g.get("name") or ""] = max(most.get(g.get("name") or "", 0), g.get("nvlinks_active") or 0)
    out: dict[int, list[str]] = {}
    for g in gpus:
        label, mine = f"GPU {g['index']}", []
        width, widest = g.get("pcie_width"), g.get("pcie_width_max")
        if width and widest and width < widest:
            mine.append(f"{label}'s PCIe link runs at x{width} of x{widest}: reseat the card or service its slot")
        peak, active = most[g.get("name") or ""], g.get("nvlinks_active") or 0
        if active < peak:
            down = g.get("nvlinks_down") or []
            mine.append(f"{label} has {active} of {peak} NVLinks active (its peers of the same model have {peak})"
                        + (f"; down: {', '.join(map(str, down))}" if down else ""))
        out[g["index"]] = mine
    return out


def check_host() -> dict[str, Any]:
    """``dlscale sysinfo --health``: a snapshot, the links' state and their warnings for every GPU NVML
    sees on this host."""
    nv = nvml.start()
    if nv is None:
        return {"gpus": [], "note": "no NVIDIA GPU visible to NVML here (no driver or no nvidia-ml-py): "
                                    "nothing to check"}
    notes: list[str] = []
    try:
        gpus = []
        for g in nvml.host_gpus(nv, notes):
            label = f"GPU {g.index}"
            name = nvml.probe(nv, notes, f"{label} name", lambda g=g: nvml.text(nv.nvmlDeviceGetName(g.handle)))
            snap = snapshot(nv, g.handle, notes, label)
            gpus.append({"index": g.index, "name": name, "pci_bus_id": g.bus_id, "uuid": g.uuid,
                         "mig_mode": g.mig_mode, **snap, **link_state(nv, g.handle, notes, label),
                         "warnings": snapshot_warnings(snap, label)})
    finally:
        nvml.stop(nv)
    for g in gpus:
        g["warnings"] += link_warnings(gpus)[g["index"]]
    out: dict[str, Any] = {"gpus": gpus, "notes": notes}
    if not gpus:
        out["note"] = "NVML answered but lists no GPU: nothing to check"
    return out
