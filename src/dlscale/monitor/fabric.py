"""A GPU's links and limits through NVML: NVLinks and their error counters, the NVSwitch fabric, the
PCIe link against its maximum, the power limit against its default.

``snapshot`` reads them for one GPU (the health snapshot holds it under ``links``); ``warnings``
says what in it means the GPU would measure below a healthy one; ``grown`` compares two snapshots
of a run. Rules (docs/CLUSTER.md, "Health"):

- NVLink: fewer active links than the model's datasheet has (``nvlink.nominal``) is a link down;
  replay, recovery and CRC counters (summed over the active links, since the driver loaded) are
  reported, a recovery (the link retrained) warns, and any counter that grew during a run warns.
- Fabric (NVSwitch systems): read with ``nvmlDeviceGetGpuFabricInfoV`` and its struct's version set
  (v3, else v2 on a driver that answers ARGUMENT_VERSION_MISMATCH), or the unversioned call on a
  driver without the V one (``read_fabric``). NOT_SUPPORTED, or the state NOT_SUPPORTED, is a GPU
  without a fabric and says nothing; any other NVML error is a fault naming it (GPU_IS_LOST,
  UNKNOWN, ...), except those that only say this process could not ask (NO_PERMISSION, ...:
  ``unread``, an ERROR). A GPU not registered with the fabric manager (state not completed),
  registered with an error status, or whose health mask or summary says degraded bandwidth, an
  unhealthy route, a wrong configuration or a disconnected fabric manager is a fault.
- PCIe: a GPU drops to a lower generation when idle to save power, so the generation is judged only
  when NVML does not report the GPU idle (clock event reason ``gpu_idle``) and, in a run, from the
  samples under load; a narrower link than its maximum warns whenever seen; a slot that caps the GPU
  below its own maximum generation warns.
- Power: an enforced limit below the default (a cap someone or something set) warns.
"""

from __future__ import annotations

from typing import Any

from dlscale import nvlink
from dlscale.monitor import nvml

# nvmlNvLinkErrorCounter_t: the data-link counters NVML keeps per link
COUNTERS = {"replay": "NVML_NVLINK_ERROR_DL_REPLAY", "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
            "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT", "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# nvmlGpuFabricInfo healthMask fields (NVML_GPU_FABRIC_HEALTH_MASK_*): (name, shift, width, the values that are bad).
# A two-bit field is bad at 1 (TRUE); the incorrect-configuration field is bad from 2 (1 is NONE); the global
# fabric manager is bad at 2 (DISCONNECTED).
FABRIC_HEALTH = (("degraded_bandwidth", 0, 0x3, {1}), ("route_recovery", 2, 0x3, {1}),
                 ("route_unhealthy", 4, 0x3, {1}), ("access_timeout_recovery", 6, 0x3, {1}),
                 ("incorrect_configuration", 8, 0xF, set(range(2, 16))), ("fabric_manager_disconnected", 14, 0x3, {2}))
FABRIC_SUMMARY = {2: "unhealthy", 3: "limited_capacity"}  # v3's healthSummary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*)
UNREAD = "unread"


def _nvlinks(nv: Any, h: Any, notes: list[str], what: str, name: str | None,
             pci_id: int | None) -> dict[str, Any] | None:
    states = nvml.nvlink_states(nv, h)
    active = [link for link, up in enumerate(states) if up]
    if not states:
        return None
    errors: dict[str, int | None] = {}
    for key, const in COUNTERS.items():
        counter = getattr(nv, const)
        counts = [nvml.probe(nv, notes, f"{what} NVLink {link} {key} errors",
                             lambda link=link: int(nv.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)))
                  for link in active]
        errors[key] = sum(counts) if counts and all(c is not None for c in counts) else None
    model = nvlink.nominal(name, pci_id)
    return {"active": len(active), "present": len(states), "nominal": model[1] if model else None, "errors": errors}


def _fabric_structs(nv: Any) -> list[tuple[int, Any]]:
    """The versioned fabric structs the bindings have, newest first: (version word, struct class). The
    word is NVML_STRUCT_VERSION(GpuFabricInfo, N), ``sizeof(struct) | N << 24`` (nvml.h), which the
    caller sets in the struct's ``version`` field before the V call: the driver reads it to know how
    much to fill, and answers ARGUMENT_VERSION_MISMATCH for a version it does not know."""
    import ctypes

    found = []
    for n in (3, 2):
        struct = getattr(nv, f"c_nvmlGpuFabricInfo_v{n}_t", None) or (getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
                                                                        if n == 2 else None)
        if struct is not None:
            found.append((int(getattr(nv, f"nvmlGpuFabricInfo_v{n}", ctypes.sizeof(struct) | n << 24)), struct))
    return found


def read_fabric(nv: Any, h: Any) -> Any:
    """The GPU's fabric info: the V call with the newest struct version this driver accepts (v3, then
    v2), else, on a driver without the V call, the unversioned ``nvmlDeviceGetGpuFabricInfo`` (no
    health mask). Raises what NVML raised (NOT_SUPPORTED: the GPU has no fabric)."""
    import ctypes

    mismatch, missing = (getattr(nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
                         getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))
    last: BaseException | None = None
    for version, struct in _fabric_structs(nv) if hasattr(nv, "nvmlDeviceGetGpuFabricInfoV") else []:
        info = struct()
        info.version = version
        try:
            nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
            return info
        except nv.NVMLError as e:
            if nvml.error_code(nv, e) not in (mismatch, missing):
                raise
            last = e
            if nvml.error_code(nv, e) == missing:
                break  # a driver older than the V call: the unversioned one below
    if not hasattr(nv, "nvmlDeviceGetGpuFabricInfo") or not hasattr(nv, "c_nvmlGpuFabricInfo_t"):
        if last is not None:
            raise last
        raise nv.NVMLError(missing)
    info = nv.c_nvmlGpuFabricInfo_t()
    nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    return info


def _fabric(nv: Any, h: Any, notes: list[str], what: str) -> dict[str, Any] | None:
    """The fabric's state and health (None: the GPU has no NVSwitch fabric), or what stopped NVML from
    reading it: ``error`` (the GPU or driver is in trouble: GPU_IS_LOST, UNKNOWN, ...) or ``unread``
    (nothing could be measured: no permission, a driver without the call). Only NOT_SUPPORTED, or
    the state NOT_SUPPORTED, means no fabric."""
    try:
        info = read_fabric(nv, h)
    except Exception as e:  # noqa: BLE001 - an NVML error is the fabric's finding; anything else a note
        code = nvml.error_code(nv, e)
        if code is None or code == getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
            notes.append(f"{what} fabric info: {type(e).__name__}: {e}" if code is None else
                         f"{what} fabric info: this driver has no fabric call (it predates NVSwitch fabric state)")
            return None
        if code == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
            return None
        return {UNREAD if code in _unread_codes(nv) else "error": nvml.error_name(nv, code), "code": code}
    state = int(info.state) & 0xFF  # nvmlGpuFabricState_t is an unsigned char (nvml.h); the bindings read 4 bytes
    if state == 0:
        return None
    status = int(info.status)
    mask = int(getattr(info, "healthMask", 0))
    health = [name for name, shift, width, bad in FABRIC_HEALTH if (mask >> shift) & width in bad]
    summary = FABRIC_SUMMARY.get(int(getattr(info, "healthSummary", 0)) & 0xFF)
    return {"state": FABRIC_STATES.get(state, str(state)), "status": status,
            "status_name": None if status == 0 else nvml.error_name(nv, status),
            "health": health + ([summary] if summary else []), "struct": int(getattr(info, "version", 0)) >> 24}


def _unread_codes(nv: Any) -> set[int]:
    """NVML errors that say only that this process could not ask (an ERROR: nothing measured), not that the
    GPU or its fabric is in trouble."""
    return {getattr(nv, f"NVML_ERROR_{k}", c) for k, c in (("NO_PERMISSION", 4), ("UNINITIALIZED", 1),
                                                          ("ARGUMENT_VERSION_MISMATCH", 25), ("DRIVER_NOT_LOADED", 9),
                                                          ("LIB_RM_VERSION_MISMATCH", 18), ("LIBRARY_NOT_FOUND", 12))}


def snapshot(nv: Any, h: Any, notes: list[str], what: str = "GPU", name: str | None = None,
             pci_id: int | None = None) -> dict[str, Any]:
    """NVLinks (active, present, the model's nominal count, error counters), fabric, PCIe link, power limits."""
    def get(key: str, fn: Any) -> Any:
        return nvml.probe(nv, notes, f"{what} {key}", fn)

    limit, default = (get(k, lambda f=f: f(h) / 1000) for k, f in (
        ("enforced power limit", nv.nvmlDeviceGetEnforcedPowerLimit),
        ("default power limit", nv.nvmlDeviceGetPowerManagementDefaultLimit)))
    return {
        "nvlink": _nvlinks(nv, h, notes, what, name, pci_id),
        "fabric": _fabric(nv, h, notes, what),
        "pcie": {"gen": get("PCIe generation", lambda: int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h))),
                 "gen_max": get("PCIe max generation", lambda: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h))),
                 "gen_gpu_max": get("GPU's max PCIe generation",
                                    lambda: int(nv.nvmlDeviceGetGpuMaxPcieLinkGeneration(h))),
                 "width": get("PCIe width", lambda: int(nv.nvmlDeviceGetCurrPcieLinkWidth(h))),
                 "width_max": get("PCIe max width", lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(h)))},
        "power": {"limit_w": limit, "default_w": default},
    }


def pcie_now(nv: Any, h: Any) -> tuple[int, int]:
    """The PCIe link's generation and width now (a run samples them under load)."""
    return int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)), int(nv.nvmlDeviceGetCurrPcieLinkWidth(h))


def warnings(links: dict[str, Any], label: str, idle: bool, since_load: bool = True) -> list[str]:
    """What in one snapshot of links and limits makes the GPU measure below a healthy one: its faults
    and how it is configured (``faults`` + ``configured``)."""
    return faults(links, label, idle) + configured(links, label, since_load)


def faults(links: dict[str, Any], label: str, idle: bool) -> list[str]:
    """Links working below the GPU's own: NVLinks down against the model's count, the fabric not
    registered or unhealthy, the PCIe link narrower than its maximum or, unless NVML reports the GPU
    ``idle`` (a lower generation then is its power saving), slower."""
    out = []
    nv = links.get("nvlink") or {}
    if nv.get("nominal") and nv["active"] < nv["nominal"]:
        out.append(f"{label} has {nv['nominal'] - nv['active']} of its {nv['nominal']} NVLinks down: its peer "
                   "and collective bandwidth is below the model's (nvidia-smi nvlink -s)")
    out.extend(_fabric_faults(links.get("fabric"), label))
    p = links.get("pcie") or {}
    if p.get("width") and p.get("width_max") and p["width"] < p["width_max"]:
        out.append(f"{label}'s PCIe link runs at x{p['width']} of x{p['width_max']}: reseat the GPU or check "
                   "its riser")
    if not idle and p.get("gen") and p.get("gen_max") and p["gen"] < p["gen_max"]:
        out.append(f"{label}'s PCIe link runs at Gen{p['gen']} under load, below its Gen{p['gen_max']}")
    return out


def _fabric_faults(fab: dict[str, Any] | None, label: str) -> list[str]:
    if not fab or fab.get(UNREAD):
        return []
    if fab.get("error"):
        return [f"{label}'s NVSwitch fabric could not be read: NVML answered {fab['error']}, which is a GPU or driver "
                "in trouble, not a GPU without a fabric (nvidia-smi -q -d FABRIC; the kernel log)"]
    if fab["state"] != "completed" or fab["status"] != 0:
        status = "" if fab["state"] != "completed" else f", status {fab['status']} {fab.get('status_name') or ''}"
        return [f"{label} is not registered with the NVLink fabric (state {fab['state']}{status.rstrip()}): check the "
                "fabric manager (systemctl status nvidia-fabricmanager)"]
    return [f"{label}'s NVLink fabric reports {', '.join(fab['health'])}"] if fab["health"] else []


def unread(links: dict[str, Any], label: str) -> list[str]:
    """What NVML would not let this process read (an ERROR: nothing was measured), e.g. the fabric under
    NO_PERMISSION."""
    fab = links.get("fabric") or {}
    return [f"{label}'s NVSwitch fabric could not be read here (NVML {fab[UNREAD]}): its state is unknown"] \
        if fab.get(UNREAD) else []


def configured(links: dict[str, Any], label: str, since_load: bool = True) -> list[str]:
    """How the GPU is set up or what it went through, which lowers its figures without a part being
    broken now: a power limit below the default, a slot below the GPU's PCIe generation, and (with
    ``since_load``) NVLink recoveries since the driver loaded. An acceptance WARNs on these."""
    out = []
    nv = links.get("nvlink") or {}
    if since_load and (nv.get("errors") or {}).get("recovery"):
        out.append(f"{label}'s NVLinks recovered (retrained) {nv['errors']['recovery']} times since the driver "
                   "loaded: a marginal link (nvidia-smi nvlink -e)")
    p = links.get("pcie") or {}
    if p.get("gen_max") and p.get("gen_gpu_max") and p["gen_max"] < p["gen_gpu_max"]:
        out.append(f"{label}'s slot limits its PCIe link to Gen{p['gen_max']}; the GPU can do Gen{p['gen_gpu_max']}")
    power = links.get("power") or {}
    if power.get("limit_w") and power.get("default_w") and power["limit_w"] < 0.99 * power["default_w"]:
        out.append(f"{label}'s power limit is {power['limit_w']:g} W, below its default {power['default_w']:g} W: "
                   "it runs capped (nvidia-smi -q -d POWER)")
    return out


def pcie_warnings(p: dict[str, Any], label: str, idle: bool) -> list[str]:
    """The PCIe link's faults alone (a run's samples under load)."""
    return faults({"pcie": p}, label, idle)


def grown(before: dict[str, Any], after: dict[str, Any], label: str) -> list[str]:
    """NVLink error counters that grew between two snapshots of a run."""
    a = ((before.get("nvlink") or {}).get("errors")) or {}
    b = ((after.get("nvlink") or {}).get("errors")) or {}
    up = {k: (a[k], b[k]) for k in COUNTERS if a.get(k) is not None and b.get(k) is not None and b[k] > a[k]}
    if not up:
        return []
    seen = ", ".join(f"{k} {x} -> {y}" for k, (x, y) in up.items())
    return [f"{label}'s NVLink error counters grew during the run ({seen}): a link is marginal; its peer and "
            "collective figures may be low (nvidia-smi nvlink -e)"]
