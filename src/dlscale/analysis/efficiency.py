"""Which system gives the most sample units per kWh and per dollar (reads records only; no torch).

Per model and sample unit, each system's mean of its runs' ``units_per_joule`` (shown per kWh:
× 3.6·10^6 J/kWh) and ``units_per_dollar`` (docs/METRICS.md, "Energy and cost"), ranked 1 for the
most. A system priced at two prices (one machine as bought and as rented) is two rows, each with
its price: a mean never spans prices. A system without a figure is listed unranked for it; a
ranking never mixes units or models.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dlscale.analysis import domains
from dlscale.analysis.domains import system_label

J_PER_KWH = 3.6e6
RANKED = ("units_per_kwh", "units_per_dollar")


def has_efficiency(records: Iterable[Any]) -> bool:
    return any(isinstance(r.metrics.get(k), (int, float)) for r in records for k in ("units_per_joule", "units_per_dollar"))


def ranking(records: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per (unit, model, system) with a per-joule or per-dollar figure, ranked within (unit, model)."""
    groups: dict[tuple[str, str, str, float | None], list[Any]] = {}
    for r in records:
        if r.status == "ok" and has_efficiency([r]):
            groups.setdefault((domains.sample_unit(r), r.workload, system_label(r), domains.price_of(r)), []).append(r)
    rows = []
    for (unit, model, system, price), recs in groups.items():
        per_j = domains.mean_of(recs, "units_per_joule")
        rows.append({"unit": unit, "model": model, "system": system, "price_per_hour": price, "runs": len(recs),
                     "throughput": domains.mean_of(recs, "throughput"),
                     "units_per_kwh": per_j * J_PER_KWH if per_j is not None else None,
                     "units_per_dollar": domains.mean_of(recs, "units_per_dollar")})
    for key in RANKED:
        for unit, model in {(r["unit"], r["model"]) for r in rows}:
            peers = sorted((r for r in rows if (r["unit"], r["model"]) == (unit, model) and r[key] is not None),
                           key=lambda r: -r[key])
            for i, r in enumerate(peers, 1):
                r[f"rank_{key.removeprefix('units_')}"] = i
    for r in rows:
        r.setdefault("rank_per_kwh", None)
        r.setdefault("rank_per_dollar", None)
    return sorted(rows, key=lambda r: (domains.UNIT_ORDER.index(r["unit"]) if r["unit"] in domains.UNIT_ORDER else 9,
                                       r["model"], r["rank_per_dollar"] or 1e9, r["rank_per_kwh"] or 1e9, r["system"],
                                       r["price_per_hour"] or 0))
