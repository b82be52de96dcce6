"""The clock and temperature of this process's CPUs, for the monitor (a burn-in on CPU ranks).

- clock (``cpu_clock_MHz``, the mean over the CPUs this process may run on): cpufreq's
  ``scaling_cur_freq`` (kHz) where the kernel has a cpufreq driver, else ``/proc/cpuinfo``'s
  ``cpu MHz`` lines, which on a virtual machine without cpufreq are the figure the hypervisor
  reports (often the nominal clock, not the running one: the monitor's notes say which was read);
- temperature (``cpu_temp_C``, the hottest sensor): thermal zones under ``/sys/class/thermal``
  whose type names a CPU package (``x86_pkg_temp``, ``cpu-thermal``, ``cpu_thermal``), else the
  hwmon drivers of CPUs (``coretemp``, ``k10temp``, ``zenpower``) under ``/sys/class/hwmon``.

What is absent is said once in ``notes`` (a VM usually exposes no sensor); ``DLSCALE_SYSFS_ROOT``
reads another tree (a test's).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SYSFS_ENV = "DLSCALE_SYSFS_ROOT"
CPU_ZONES = ("x86_pkg_temp", "cpu-thermal", "cpu_thermal", "soc_thermal")
CPU_HWMON = ("coretemp", "k10temp", "zenpower")


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


class CpuClockSource:
    """``read()`` -> ``{"cpu_clock_MHz": mean, "cpu_temp_C": max}`` of what exists here (see the module doc)."""

    def __init__(self, cpus: list[int] | None = None, root: str | None = None):
        self.root = Path(root or os.environ.get(SYSFS_ENV) or "/")
        self.cpus = cpus if cpus is not None else sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else list(range(os.cpu_count() or 1))
        self.notes: list[str] = []
        self.freq = [p for c in self.cpus
                     if (p := self.root / f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq").exists()]
        self.cpuinfo = None if self.freq else self.root / "proc/cpuinfo"
        if self.cpuinfo is not None:
            if self._cpuinfo_mhz():
                self.notes.append("CPU clock from /proc/cpuinfo's 'cpu MHz' (no cpufreq driver here; on a virtual "
                                  "machine it is the figure the hypervisor reports, not necessarily the running clock)")
            else:
                self.cpuinfo = None
                self.notes.append("CPU clock not recorded: no cpufreq driver and no 'cpu MHz' in /proc/cpuinfo")
        self.temps = self._sensors()
        if not self.temps:
            self.notes.append("CPU temperature not recorded: no CPU thermal zone (/sys/class/thermal) or hwmon "
                              "sensor (coretemp, k10temp, zenpower) is exposed here (virtual machines expose none)")

    def _cpuinfo_mhz(self) -> list[float]:
        text = _read(self.cpuinfo) if self.cpuinfo else None
        if not text:
            return []
        per = {}
        for block in text.split("\n\n"):
            n = re.search(r"^processor\s*:\s*(\d+)", block, re.M)
            mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", block, re.M)
            if n and mhz:
                per[int(n.group(1))] = float(mhz.group(1))
        return [per[c] for c in self.cpus if c in per] or list(per.values())

    def _sensors(self) -> list[Path]:
        zones = sorted((self.root / "sys/class/thermal").glob("thermal_zone*"))
        found = [z / "temp" for z in zones if _read(z / "type") in CPU_ZONES and (z / "temp").exists()]
        if found:
            return found
        hw = sorted((self.root / "sys/class/hwmon").glob("hwmon*"))
        return [t for h in hw if _read(h / "name") in CPU_HWMON for t in sorted(h.glob("temp*_input"))]

    def read(self) -> dict[str, float]:
        vals: dict[str, float] = {}
        mhz = [float(x) / 1e3 for p in self.freq if (x := _read(p))] if self.freq else self._cpuinfo_mhz()
        if mhz:
            vals["cpu_clock_MHz"] = sum(mhz) / len(mhz)
        temps = [float(x) / 1e3 for p in self.temps if (x := _read(p))]
        if temps:
            vals["cpu_temp_C"] = max(temps)
        return vals
