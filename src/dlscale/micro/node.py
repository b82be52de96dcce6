"""The node as a whole in a microbenchmark run: which cases run on every device at once (``schedule``:
the cases a plan gives one ``Case.group`` key, one per device), and the node's energy over their timed
windows (``Node``: each device's joules, the node's power), read as ``micro.concurrent`` opens and closes
the windows. docs/METRICS.md, "Every device at once".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

NODE_UNITS = {"node_devices": "devices", "node_energy_j": "J", "node_avg_power_w": "W",
              "node_power_by_device_w": "W", "node_metered_s": "s"}
METHOD = "one thread per device; each group's timed windows opened together and closed together (barriers)"


def schedule(cases: Sequence[Any]) -> list[list[Any]]:
    """The cases in plan order as groups that run at once: those sharing a ``group`` key together (in
    plan order, one per device), every other case alone."""
    out: list[list[Any]] = []
    at: dict[Any, int] = {}
    for c in cases:
        key = getattr(c, "group", None)
        if key is None:
            out.append([c])
        elif key in at:
            out[at[key]].append(c)
        else:
            at[key] = len(out)
            out.append([c])
    return out


def at_once_sums(rows: Sequence[dict[str, Any]], key: Sequence[str], rate: str) -> dict[tuple[Any, ...], float]:
    """Per case run on every device at once (rows with ``at_once``, identified by their ``key`` columns),
    its ``rate`` summed over the devices: the node's figure of that case."""
    sums: dict[tuple[Any, ...], float] = {}
    for r in rows:
        if r.get("at_once"):
            k = tuple(r[c] for c in key)
            sums[k] = sums.get(k, 0.0) + r[rate]
    return sums


class Node:
    """The devices of a run's grouped cases, an energy meter over all of them, and what it read."""

    def __init__(self, cases: Sequence[Any]):
        self.devices = list(dict.fromkeys(c.device for c in cases if getattr(c, "group", None) is not None))
        self.meter = None
        if self.devices:
            from dlscale.harness.energy_meter import EnergyMeter
            from dlscale.monitor.energy_counters import devices_counters

            self.meter = EnergyMeter(found=devices_counters(self.devices))
        self.joules = [0.0] * len(self.devices)
        self.seconds = 0.0
        self.groups = 0

    @staticmethod
    def runs(group: Sequence[Any]) -> bool:
        """Whether the group runs on every device at once (its cases carry a group key)."""
        return getattr(group[0], "group", None) is not None

    def time(self, group: Sequence[Any], time_one: Callable[[Any, Any], Any]) -> list[Any]:
        """``time_one(case, gate)`` for every case of the group at once (``concurrent.run_together``)."""
        from dlscale.micro.concurrent import run_together

        self.groups += 1
        return run_together([lambda gate, c=c: time_one(c, gate) for c in group], self.meter)

    def readings(self, group: Sequence[Any]) -> list[dict[str, Any]]:
        """Each case's device's energy reading over the group's windows (``harness.energy_meter``'s form), added
        to the node's totals; readings without a counter say why."""
        assert self.meter is not None
        r = self.meter.take()
        if r.get("reason"):
            return [r for _ in group]
        secs = max(r["seconds"] or [0.0])
        self.seconds += secs
        out = []
        for c in group:
            k = self.devices.index(c.device)
            self.joules[k] += r["per_device_j"][k]
            out.append({**r, "devices": [r["devices"][k]], "per_device_j": [r["per_device_j"][k]], "seconds": [secs]})
        return out

    def figures(self) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        """(metrics, units, raw) of the node over every grouped window: its devices, each device's average
        power and their sum, the energy; none (``raw.node.energy.reason`` says why) without counters or
        over windows too short for them."""
        if not self.devices:
            return {}, {}, {}
        from dlscale.harness import energy_meter as energy

        assert self.meter is not None
        reading = energy.absent(self.meter.reason) if self.meter.reason else {
            "source": self.meter.found.source, "domains": ["gpu"], "devices": [c.name for c in self.meter.counters],
            "per_device_j": list(self.joules), "seconds": [self.seconds] * len(self.devices), "reason": None}
        m, _, raw = energy.figures(energy.short_window(reading, self.meter.update_s), 1, "window")
        metrics: dict[str, Any] = {"node_devices": len(self.devices), "node_metered_s": self.seconds}
        if m:
            metrics.update(node_energy_j=m["energy_j"], node_avg_power_w=m["avg_power_w"],
                           node_power_by_device_w=[j / self.seconds for j in self.joules])
        units = {k: v for k, v in NODE_UNITS.items() if k in metrics}
        return metrics, units, {"node": {"devices": [str(d) for d in self.devices], "method": METHOD,
                                         "groups": self.groups, "energy": raw["energy"],
                                         "energy_per_device_j": raw["energy_per_device_j"]}}

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
