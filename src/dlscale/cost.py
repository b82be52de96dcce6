"""What a result costs: a price per device-hour, and the run's cost figures (docs/METRICS.md, "Energy and cost").

A price comes from ``--price-per-hour`` or from a systems file, a YAML mapping of systems each with
the devices it holds and either its list price per hour or its capital cost, lifetime, utilisation,
power draw and electricity price, from which the hourly cost is derived::

    systems:
      cloud-8xh100: {devices: 8, price_per_hour: 98.32}
      my-server:    {devices: 8, capital_cost: 250000, lifetime_years: 4, utilisation: 0.8,
                     power_w: 6500, price_per_kwh: 0.12}

``hourly = capital_cost / (lifetime_years · 8760 h · utilisation) + power_w / 1000 · price_per_kwh``
for the whole system, ``/ devices`` per device-hour. A cost figure is recorded only beside the price
it came from (``raw["cost"]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.yamlfile import load_yaml

HOURS_PER_YEAR = 8760  # 365 days
FIELDS = ("devices", "price_per_hour", "capital_cost", "lifetime_years", "utilisation", "power_w", "price_per_kwh")
CAPITAL = ("capital_cost", "lifetime_years", "utilisation", "power_w", "price_per_kwh")
UNITS = {"price_per_hour": "$/h", "cost_per_million_units": "$/10^6 {unit}", "units_per_dollar": "{unit}/$",
         "cost_to_target": "$", "cost_of_run": "$"}


@dataclass(frozen=True)
class Price:
    """A price per device-hour and where it came from."""

    per_hour: float
    source: str


@dataclass(frozen=True)
class SystemCost:
    name: str
    devices: int
    price_per_hour: float | None = None  # the whole system's list price per hour
    capital_cost: float | None = None
    lifetime_years: float | None = None
    utilisation: float | None = None  # fraction of the lifetime the system does paid work
    power_w: float | None = None  # its average draw
    price_per_kwh: float | None = None

    def hourly(self) -> tuple[float, str]:
        """(the whole system's cost per hour, how it was derived)."""
        if self.price_per_hour is not None:
            return self.price_per_hour, f"list price {self.price_per_hour:g} $/h"
        assert self.capital_cost is not None and self.lifetime_years is not None and self.utilisation is not None
        assert self.power_w is not None and self.price_per_kwh is not None
        capital = self.capital_cost / (self.lifetime_years * HOURS_PER_YEAR * self.utilisation)
        power = self.power_w / 1000 * self.price_per_kwh
        return capital + power, (f"{self.capital_cost:g} $ / ({self.lifetime_years:g} y x {HOURS_PER_YEAR} h x "
                                 f"{self.utilisation:g}) + {self.power_w / 1000:g} kW x {self.price_per_kwh:g} $/kWh "
                                 f"= {capital:.4f} + {power:.4f} = {capital + power:.4f} $/h")

    def price(self, path: str) -> Price:
        hourly, how = self.hourly()
        if not priced(hourly / self.devices):  # finite fields can still overflow
            raise UsageError(f"--systems-file {path}: system {self.name} comes to {hourly / self.devices:g} $ per "
                             "device-hour; its fields must give a finite price > 0")
        return Price(hourly / self.devices, f"systems file {path}: system {self.name} ({how}; / {self.devices} devices)")


def priced(value: Any) -> bool:
    """A number a price (or a systems file's field) can be: finite and > 0 (inf would cost nothing per unit)."""
    import math

    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def check_price(value: float | None, what: str = "--price-per-hour") -> Price | None:
    if value is None:
        return None
    if not priced(value):
        raise UsageError(f"{what} must be a finite price per device-hour > 0, got {value}")
    return Price(float(value), "--price-per-hour")


def as_price(value: Any) -> Price | None:
    """A ``Price``, a number (a price per device-hour, as ``--price-per-hour``) or None."""
    return value if value is None or isinstance(value, Price) else check_price(value, "price")


def load_systems(path: str | Path) -> dict[str, SystemCost]:
    """Every system of a systems file; the first problem is a one-line ``FILE:LINE`` UsageError."""
    p = Path(path)
    doc, lines = load_yaml(p, f"--systems-file {p}: cannot read it")
    if not isinstance(doc, dict) or set(doc) != {"systems"} or not isinstance(doc["systems"], dict) or not doc["systems"]:
        raise lines.fail((), "a systems file is one mapping `systems:` of NAME: {devices: N, price_per_hour: X} or "
                             f"NAME: {{devices: N, {', '.join(f'{f}: ...' for f in CAPITAL)}}}")
    return {name: _system(name, spec, lines) for name, spec in doc["systems"].items()}


def _system(name: str, spec: Any, lines: Any) -> SystemCost:
    path = ("systems", name)
    if not isinstance(spec, dict):
        raise lines.fail(path, "must be a mapping of " + ", ".join(FIELDS))
    for k, v in spec.items():
        if k not in FIELDS:
            raise lines.fail(path + (k,), f"unknown field; known: {', '.join(FIELDS)}")
        if not priced(v):
            raise lines.fail(path + (k,), f"must be a finite number > 0, got {v!r}")
    if not isinstance(spec.get("devices"), int):
        raise lines.fail(path, "needs devices: the number of devices (GPUs, or 1 for a CPU host) the price covers")
    if "utilisation" in spec and spec["utilisation"] > 1:
        raise lines.fail(path + ("utilisation",), f"is a fraction of the lifetime (0-1], got {spec['utilisation']}")
    listed, capital = "price_per_hour" in spec, [f for f in CAPITAL if f in spec]
    if listed and capital:
        raise lines.fail(path + (capital[0],), "give price_per_hour or the capital fields, not both")
    if not listed and len(capital) < len(CAPITAL):
        missing = [f for f in CAPITAL if f not in spec]
        raise lines.fail(path, f"needs price_per_hour, or all of {', '.join(CAPITAL)} (missing {', '.join(missing)})")
    return SystemCost(name=name, **{k: float(v) if k != "devices" else v for k, v in spec.items()})


def resolve(price_per_hour: float | None = None, systems_file: str | None = None, system: str | None = None) -> Price | None:
    """The run's price: ``--price-per-hour``, or ``--system`` of ``--systems-file``; None when neither."""
    if price_per_hour is not None and systems_file is not None:
        raise UsageError("give --price-per-hour or --systems-file, not both")
    if system is not None and systems_file is None:
        raise UsageError("--system names a system of --systems-file; add --systems-file FILE")
    if systems_file is None:
        return check_price(price_per_hour)
    systems = load_systems(systems_file)
    if system is None and len(systems) > 1:
        raise UsageError(f"--systems-file {systems_file} has {len(systems)} systems: pick one with --system "
                         f"({', '.join(systems)})")
    name = system or next(iter(systems))
    if name not in systems:
        raise UsageError(f"--system {name}: not in {systems_file}; it has {', '.join(systems)}")
    return systems[name].price(str(systems_file))


def devices_priced(config: dict[str, Any]) -> int:
    """The devices a run occupied: its ranks on GPUs; its hosts (nodes) on CPUs; a server's, as its run says."""
    if config.get("server_devices"):  # a serving run: the devices of the server measured, not of the client
        return int(config["server_devices"])
    if str(config.get("device", "")).startswith("cuda"):
        return int(config.get("world_size") or 1)
    return int(config.get("nodes") or 1)


def figures(price: Price, metrics: dict[str, Any], units: dict[str, str], config: dict[str, Any],
            wall_s: float | None = None) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(metrics, units, raw) of a run's cost at ``price``: per million sample units, to the target,
    and of the whole run.

    ``cost_per_million_units = price · devices / 3600 · 10^6 / throughput`` (and its inverse
    ``units_per_dollar = throughput · 3600 / (price · devices)``);
    ``cost_to_target = price · devices · time_to_target / 3600``;
    ``cost_of_run = price · devices · wall_s / 3600``, ``wall_s`` the run's whole time on its devices
    (set-up, warm-up and measurement: what a sweep of such runs costs, summed).
    """
    devices = devices_priced(config)
    per_s = price.per_hour * devices / 3600
    out: dict[str, Any] = {"price_per_hour": price.per_hour}
    if wall_s is not None:
        out["cost_of_run"] = per_s * wall_s
    unit = (units.get("throughput") or "").removesuffix("/s")
    thr = metrics.get("throughput")
    if isinstance(thr, (int, float)) and thr > 0 and unit:
        out["cost_per_million_units"] = per_s * 1e6 / thr
        out["units_per_dollar"] = thr / per_s
    if isinstance(metrics.get("time_to_target"), (int, float)):
        out["cost_to_target"] = per_s * metrics["time_to_target"]
    raw = {"cost": {"price_per_hour": price.per_hour, "source": price.source, "devices": devices,
                    "wall_s": wall_s}}
    return out, {k: UNITS[k].replace("{unit}", unit) for k in out}, raw
