"""A GPU's links and limits through NVML: NVLinks and their error counters, the NVSwitch fabric, the
PCIe link against its maximum, the power limit against its default.

``snapshot`` reads them for one GPU (the health snapshot holds it under ``links``); ``warnings``
says what in it means the GPU would measure below a healthy one; ``grown`` compares two snapshots
of a run. Rules (docs/CLUSTER.md, "Health"):

- NVLink: fewer active links than the model's datasheet has (``nvlink.nominal``) is a link down;
  replay, recovery and CRC counters (summed over the active links, since the driver loaded) are
  reported, a recovery (the link retrained) warns, and any counter that grew during a run warns.
- Fabric (NVSwitch systems, ``nvmlDeviceGetGpuFabricInfoV``): a GPU not registered with the fabric
  manager, registered with an error, or whose health mask says degraded bandwidth or an unhealthy
  route warns; a GPU without a fabric says nothing.
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
# nvmlGpuFabricInfo healthMask fields whose value 1 (TRUE) is bad: (name, shift)
FABRIC_HEALTH = (("degraded_bandwidth", 0), ("route_recovery", 2), ("route_unhealthy", 4),
                 ("access_timeout_recovery", 6))


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


def _fabric(nv: Any, h: Any, notes: list[str], what: str) -> dict[str, Any] | None:
    struct = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
    if struct is None:
        return None

    def read() -> Any:
        import ctypes

        info = struct()
        nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
        return info

    info = nvml.probe(nv, notes, f"{what} fabric info", read)
    if info is None or int(info.state) == 0:
        return None  # no NVSwitch fabric here
    health = {name: (int(info.healthMask) >> shift) & 0x3 == 1 for name, shift in FABRIC_HEALTH}
    return {"state": FABRIC_STATES.get(int(info.state), str(int(info.state))), "status": int(info.status),
            "health": [name for name, bad in health.items() if bad]}


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
    fab = links.get("fabric")
    if fab and (fab["state"] != "completed" or fab["status"] != 0):
        out.append(f"{label} is not registered with the NVLink fabric (state {fab['state']}, status {fab['status']}): "
                   "check the fabric manager (systemctl status nvidia-fabricmanager)")
    elif fab and fab["health"]:
        out.append(f"{label}'s NVLink fabric reports {', '.join(fab['health'])}")
    p = links.get("pcie") or {}
    if p.get("width") and p.get("width_max") and p["width"] < p["width_max"]:
        out.append(f"{label}'s PCIe link runs at x{p['width']} of x{p['width_max']}: reseat the GPU or check "
                   "its riser")
    if not idle and p.get("gen") and p.get("gen_max") and p["gen"] < p["gen_max"]:
        out.append(f"{label}'s PCIe link runs at Gen{p['gen']} under load, below its Gen{p['gen_max']}")
    return out


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
