"""Energy counters: RAPL through powercap, AMD's hwmon energy counters, NVML's total energy or its power.

Each ``Counter`` gives the joules its device has used since some fixed moment (``total_j``), so
the energy of a window is the difference of two reads. ``counters_for(device)`` finds the ones
that measure a run's device, or says in one line why there is none:

- CUDA device: NVML's ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded, Volta
  and later); where the GPU lacks it, ``nvmlDeviceGetPowerUsage`` sampled every ``POWER_PERIOD_S``
  and integrated by the trapezoid rule (source ``nvml-power-integrated``).
- CPU: every RAPL package and DRAM zone under ``/sys/class/powercap`` (``DLSCALE_POWERCAP_ROOT``
  picks another tree, e.g. a test's); the counter wraps to 0 after ``max_energy_range_uj``, so
  each zone is read at least every ``wrap_period / 4`` (assuming at most ``MAX_ZONE_POWER_W``) and
  every decrease counts as one wrap. Without RAPL: the ``amd_energy`` hwmon driver's socket
  counters under ``/sys/class/hwmon`` (``DLSCALE_HWMON_ROOT``), which the driver keeps 64-bit.

Core and uncore zones are parts of their package and ``psys`` holds the whole platform, so neither
is added to the packages.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.monitor import nvml

POWERCAP_ENV = "DLSCALE_POWERCAP_ROOT"
HWMON_ENV = "DLSCALE_HWMON_ROOT"
POWERCAP_ROOT = "/sys/class/powercap"
HWMON_ROOT = "/sys/class/hwmon"
MAX_ZONE_POWER_W = 1000.0  # no RAPL zone draws more: the wrap period is at least range / 1 kW
POWER_PERIOD_S = 0.1  # NVML power sampling period where the GPU has no energy counter
# How often each counter's value changes (docs/METRICS.md, "Energy and cost"): a window's energy is
# off by up to one update period's worth, so only windows many periods long get a figure.
RAPL_UPDATE_S = 0.001  # RAPL's energy status: about every 1 ms (MSR_RAPL_POWER_UNIT time unit 976 us)
NVML_ENERGY_UPDATE_S = 0.1  # nvmlDeviceGetTotalEnergyConsumption: about every 100 ms (20-100 ms by GPU)


class Counter:
    """One device's cumulative energy. ``poll_s``: the longest gap between reads that keeps it exact."""

    source = ""
    poll_s: float | None = None
    update_s = 0.0  # how often the value the counter returns changes

    def __init__(self, name: str, domain: str):
        self.name, self.domain = name, domain

    def total_j(self) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class PowercapZone(Counter):
    """A RAPL zone: ``energy_uj`` read with its wrap-around at ``max_energy_range_uj`` unwrapped."""

    source = "rapl"
    update_s = RAPL_UPDATE_S

    def __init__(self, path: Path, name: str, domain: str):
        super().__init__(name, domain)
        self.path = path / "energy_uj"
        self.range_uj = int((path / "max_energy_range_uj").read_text())
        if self.range_uj <= 0:
            raise ValueError(f"{path}/max_energy_range_uj is {self.range_uj}")
        self.poll_s = max(0.01, min(1.0, self.range_uj / 1e6 / MAX_ZONE_POWER_W / 4))
        self._lock = threading.Lock()
        self._last = self._raw()
        self._uj = 0

    def _raw(self) -> int:
        return int(self.path.read_text())

    def total_j(self) -> float:
        """Joules since this reader opened the zone; a read below the last one is one wrap."""
        with self._lock:
            raw = self._raw()
            self._uj += wrapped_delta(self._last, raw, self.range_uj)
            self._last = raw
            return self._uj / 1e6


def wrapped_delta(before: int, after: int, range_uj: int) -> int:
    """Microjoules from ``before`` to ``after`` of a counter that wraps to 0 past ``range_uj``."""
    return after - before if after >= before else after + range_uj - before


class HwmonEnergy(Counter):
    """An ``amd_energy`` socket counter (``energyN_input``, µJ, kept 64-bit by the driver)."""

    source = "amd-energy"
    update_s = RAPL_UPDATE_S  # the same RAPL energy-status registers, read by the amd_energy driver

    def __init__(self, path: Path, name: str):
        super().__init__(name, "package")
        self.path = path

    def total_j(self) -> float:
        return int(self.path.read_text()) / 1e6


class NvmlTotalEnergy(Counter):
    source = "nvml-total-energy"
    update_s = NVML_ENERGY_UPDATE_S

    def __init__(self, nv: Any, handle: Any, name: str):
        super().__init__(name, "gpu")
        self.nv, self.h = nv, handle

    def total_j(self) -> float:
        return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) / 1e3


class NvmlPowerIntegrated(Counter):
    """``nvmlDeviceGetPowerUsage`` (mW) sampled every ``period`` s, integrated by the trapezoid rule."""

    source = "nvml-power-integrated"

    def __init__(self, nv: Any, handle: Any, name: str, period: float = POWER_PERIOD_S,
                 clock: Any = time.monotonic):
        super().__init__(name, "gpu")
        self.nv, self.h, self.clock = nv, handle, clock
        self.poll_s = self.update_s = period
        self._lock = threading.Lock()
        self._t, self._w = clock(), self._power_w()
        self._j = 0.0

    def _power_w(self) -> float:
        return self.nv.nvmlDeviceGetPowerUsage(self.h) / 1e3

    def total_j(self) -> float:
        with self._lock:
            t, w = self.clock(), self._power_w()
            self._j += (t - self._t) * (w + self._w) / 2
            self._t, self._w = t, w
            return self._j


@dataclass
class DeviceCounters:
    """The counters of a device, or why there are none (``reason``)."""

    counters: list[Counter]
    reason: str | None = None

    @property
    def source(self) -> str | None:
        return ", ".join(sorted({c.source for c in self.counters})) or None


def counters_for(device: Any) -> DeviceCounters:
    """The energy counters of ``device`` (a torch device): its GPU's, or this host's CPU packages."""
    if getattr(device, "type", "cpu") == "cuda":
        return gpu_counters(device.index or 0)
    return cpu_counters()


def devices_counters(devices: list[Any]) -> DeviceCounters:
    """The counters of several devices together (a node's GPUs, in their order), or why one has none."""
    found = [counters_for(d) for d in devices]
    missing = next((f.reason for f in found if f.reason), None)
    if missing is None:
        return DeviceCounters([c for f in found for c in f.counters])
    for f in found:
        for c in f.counters:
            c.close()
    return DeviceCounters([], missing)


def gpu_counters(cuda_index: int) -> DeviceCounters:
    nv = nvml.start()
    if nv is None:
        return DeviceCounters([], "no counter: NVML is not available (nvidia-ml-py not installed or no NVIDIA driver)")
    notes: list[str] = []
    gpu = nvml.cuda_handle(nv, cuda_index, notes)
    if gpu is None:
        return DeviceCounters([], "no counter: " + ("; ".join(notes) or f"no NVML device for CUDA device {cuda_index}"))
    name = f"GPU {cuda_index}"
    if nvml.probe(nv, notes, "NVML total energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)) is not None:
        return DeviceCounters([NvmlTotalEnergy(nv, gpu.handle, name)])
    if nvml.probe(nv, notes, "NVML power", lambda: nv.nvmlDeviceGetPowerUsage(gpu.handle)) is not None:
        return DeviceCounters([NvmlPowerIntegrated(nv, gpu.handle, name)])
    return DeviceCounters([], "no counter: this GPU has neither NVML's total-energy counter (Volta and later) nor its "
                     "power reading" + (f" ({'; '.join(notes)})" if notes else ""))


def cpu_counters() -> DeviceCounters:
    root = Path(os.environ.get(POWERCAP_ENV) or POWERCAP_ROOT)
    zones, problems = powercap_zones(root)
    if zones:
        return DeviceCounters(zones)
    hw_root = Path(os.environ.get(HWMON_ENV) or HWMON_ROOT)
    sockets = amd_energy_sockets(hw_root)
    if sockets:
        return DeviceCounters(sockets)
    why = "; ".join(problems) if problems else f"no RAPL zone under {root}"
    return DeviceCounters([], f"no counter: {why} and no amd_energy hwmon under {hw_root} "
                     "(a VM or container usually hides both)")


def powercap_zones(root: Path) -> tuple[list[Counter], list[str]]:
    """Every readable package and DRAM RAPL zone under ``root``, and why any other was left out."""
    zones: list[Counter] = []
    problems: list[str] = []
    if not root.is_dir():
        return zones, problems
    for z in sorted(root.iterdir(), key=lambda p: p.name):
        if not z.name.startswith("intel-rapl:") or not (z / "energy_uj").exists():
            continue
        try:
            label = (z / "name").read_text().strip()
        except OSError:
            continue
        package = z.name.split(":")[1]
        if label.startswith("package"):
            name, domain = label, "package"
        elif label == "dram":
            name, domain = f"dram-{package}", "dram"
        else:
            continue  # core, uncore: inside their package; psys: the whole platform
        try:
            zones.append(PowercapZone(z, name, domain))
        except PermissionError:
            problems.append(f"{z}/energy_uj is readable by root only (Linux 5.10 and later)")
        except (OSError, ValueError) as e:
            problems.append(f"{z}: {e}")
    return zones, problems


def amd_energy_sockets(root: Path) -> list[Counter]:
    out: list[Counter] = []
    if not root.is_dir():
        return out
    for hw in sorted(root.iterdir(), key=lambda p: p.name):
        try:
            if (hw / "name").read_text().strip() != "amd_energy":
                continue
        except OSError:
            continue
        for label_file in sorted(hw.glob("energy*_label")):
            label = label_file.read_text().strip()
            value = hw / label_file.name.replace("_label", "_input")
            if label.startswith("Esocket") and value.exists():
                out.append(HwmonEnergy(value, f"socket-{label[len('Esocket'):]}"))
    return out
