"""Energy over the measured window: read at the window's edges by the code that times it.

``EnergyMeter`` holds the run's counters (``monitor.energy_counters.counters_for``); ``begin()`` and ``end()``
bracket one measured window (the timed loops call them right after the synchronisations that open
and close it), and several windows (repeats, batch sizes) add up. A background thread reads the
counters that need it often enough (RAPL's wrap-around, sampled GPU power) and nothing else.
``reading()`` is what the record keeps in ``raw["energy"]``; ``figures()`` turns it into the
record's figures (docs/METRICS.md, "Energy and cost"). Where no counter exists, or one stops,
the figures are absent and ``raw["energy"]["reason"]`` says why: never a zero.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dlscale.monitor.energy_counters import Counter, DeviceCounters, counters_for

UNITS = {"energy_j": "J", "energy_per_unit_j": "J/{unit}", "units_per_joule": "{unit}/J", "avg_power_w": "W",
         "energy_to_target_kwh": "kWh"}


class EnergyMeter:
    def __init__(self, device: Any = None, found: DeviceCounters | None = None):
        self.found = found if found is not None else counters_for(device)
        self.counters: list[Counter] = list(self.found.counters)
        self.reason = self.found.reason
        self.joules = [0.0] * len(self.counters)
        self.seconds = 0.0
        self.windows = 0
        self._open: tuple[float, list[float]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        periods = [c.poll_s for c in self.counters if c.poll_s]
        if periods:
            self._thread = threading.Thread(target=self._poll, args=(min(periods),), name="dlscale-energy", daemon=True)
            self._thread.start()

    def _read(self) -> list[float] | None:
        try:
            return [c.total_j() for c in self.counters]
        except Exception as e:  # noqa: BLE001 - a counter that breaks leaves the run without energy, not failed
            self.reason = f"energy counter stopped: {type(e).__name__}: {e}"
            self.counters = []
            return None

    def _poll(self, period: float) -> None:
        while not self._stop.wait(period):
            if self.counters:
                self._read()

    def begin(self) -> None:
        if self.counters:
            e = self._read()
            self._open = (time.monotonic(), e) if e is not None else None

    def end(self) -> None:
        if self._open is None:
            return
        t0, e0 = self._open
        self._open = None
        e1 = self._read()
        if e1 is None:
            return
        self.joules = [j + b - a for j, a, b in zip(self.joules, e0, e1)]
        self.seconds += time.monotonic() - t0
        self.windows += 1

    @property
    def update_s(self) -> float:
        """The longest update period of the run's counters (0 without counters)."""
        return max((c.update_s for c in self.counters), default=0.0)

    def so_far(self) -> float | None:
        """Joules of the windows closed so far plus the open one up to now; None without counters."""
        if not self.counters or self._open is None:
            return None
        e = self._read()
        return None if e is None else sum(self.joules) + sum(b - a for a, b in zip(self._open[1], e))

    def take(self, label: str = "") -> dict[str, Any]:
        """``reading()`` of the windows since the last take, then start counting afresh (one per case)."""
        r = self.reading(label)
        self.joules, self.seconds, self.windows = [0.0] * len(self.counters), 0.0, 0
        return r

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for c in self.counters:
            c.close()

    def __enter__(self) -> "EnergyMeter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def reading(self, label: str = "") -> dict[str, Any]:
        """``raw["energy"]``: the source, each device's joules and metered seconds, or why there are none."""
        reason = self.reason or (None if self.windows else "no counter read: no measured window closed")
        have = reason is None
        prefix = f"{label}: " if label else ""
        return {"source": self.found.source if have else None,
                "domains": sorted({c.domain for c in self.counters}) if have else [],
                "devices": [prefix + c.name for c in self.counters] if have else [],
                "per_device_j": list(self.joules) if have else [],
                "seconds": [self.seconds] * len(self.counters) if have else [],
                "reason": reason and prefix + reason}


def combine(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """Several processes' readings (ranks, nodes) as one; any reading without energy makes the sum absent."""
    missing = list(dict.fromkeys(r["reason"] for r in readings if r.get("reason")))
    if missing:
        return {**absent(missing[0] + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")),
                "domains": []}
    return {"source": ", ".join(sorted({s for r in readings for s in (r["source"] or "").split(", ") if s})),
            "domains": sorted({d for r in readings for d in r["domains"]}),
            "devices": [d for r in readings for d in r["devices"]],
            "per_device_j": [j for r in readings for j in r["per_device_j"]],
            "seconds": [s for r in readings for s in r["seconds"]], "reason": None}


MIN_UPDATE_PERIODS = 10  # a window's energy is given only when it spans this many counter updates


def short_window(reading: dict[str, Any], update_s: float, min_periods: int = MIN_UPDATE_PERIODS) -> dict[str, Any]:
    """``reading``, or an absent one saying why when its window is shorter than ``min_periods``
    update periods of its counters: a counter read at a window's edges is stale by up to one
    period at each edge, so the window's energy is off by up to ``update_s / window`` of itself."""
    secs = max(reading.get("seconds") or [0.0])
    if reading.get("reason") or not update_s or secs >= min_periods * update_s:
        return reading
    return {**absent(f"window {secs * 1e3:.3g} ms is shorter than {min_periods} x the {update_s * 1e3:g} ms update "
                     f"period of {reading.get('source')}: its energy would be off by up to "
                     f"{min(1.0, update_s / secs) if secs > 0 else 1.0:.0%}"), "domains": []}


def absent(reason: str) -> dict[str, Any]:
    return {"source": None, "domains": [], "devices": [], "per_device_j": [], "seconds": [], "reason": reason}


def figures(reading: dict[str, Any], units_done: float, unit: str,
            ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(metrics, units, raw) of a window's energy: ``E = Σ_d E_d``, ``E / units``, ``units / E``, ``Σ_d E_d / t_d``.

    ``units_done`` is the sample units processed in the metered windows, all devices together.
    A window whose counters did not move (shorter than their update period) has no figures.
    """
    reading = dict(reading)
    per = reading.get("per_device_j") or []
    if not reading.get("reason") and per and sum(per) <= 0:
        reading.update(absent(f"no energy counted: the counters did not advance over the {max(reading['seconds']):.3g} s "
                              "window (shorter than their update period); measure more steps"))
    raw = {"energy": {k: v for k, v in reading.items() if k != "per_device_j"},
           "energy_per_device_j": reading.get("per_device_j") or []}
    if reading.get("reason"):
        return {}, {}, raw
    total = sum(per)
    power = sum(j / t for j, t in zip(per, reading["seconds"]) if t > 0)
    metrics = {"energy_j": total, "energy_per_unit_j": total / units_done if units_done else None,
               "units_per_joule": units_done / total, "avg_power_w": power}
    return metrics, unit_names({k: UNITS[k] for k in metrics}, unit), raw


def unit_names(units: dict[str, str], unit: str) -> dict[str, str]:
    return {k: v.replace("{unit}", unit) for k, v in units.items()}
