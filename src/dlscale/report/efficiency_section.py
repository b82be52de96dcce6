"""The report's energy and cost section: per model, which system gives the most sample units per kWh
and per dollar (``analysis.efficiency.ranking``), with the price and energy source each figure came from."""

from __future__ import annotations

from collections.abc import Sequence

from dlscale.format import fmt_fixed, fmt_num
from dlscale.record import RunRecord
from dlscale.report.model import Section, TableData


def efficiency_section(records: Sequence[RunRecord]) -> Section | None:
    """None when no run has a per-joule or per-dollar figure."""
    from dlscale.analysis.efficiency import has_efficiency, ranking

    if not has_efficiency(records):
        return None
    rows = ranking(records)
    tables = []
    for unit in dict.fromkeys(r["unit"] for r in rows):
        tables.append(TableData(
            ["model", "system", f"{unit}/s", f"{unit} per kWh", "rank (kWh)", f"{unit} per $", "at $/device-h",
             "rank ($)", "runs"],
            [[r["model"], r["system"], fmt_fixed(r["throughput"]), _f(r["units_per_kwh"]), _f(r["rank_per_kwh"]),
              _f(r["units_per_dollar"]), _f(r.get("price_per_hour")), _f(r["rank_per_dollar"]), str(r["runs"])]
             for r in rows if r["unit"] == unit],
            caption=f"{unit}: per kWh and per dollar"))
    sources = sorted({str((r.raw.get("energy") or {}).get("source")) for r in records
                      if (r.raw.get("energy") or {}).get("source")})
    prices = sorted({str((r.raw.get("cost") or {}).get("source")) for r in records if r.raw.get("cost")})
    notes = ([f"Energy measured by: {', '.join(sources)}."] if sources else []) + \
            ([f"Prices: {'; '.join(prices)}."] if prices else [])
    return Section(
        "Energy and cost per result",
        "Per model, each system's sample units per kWh (units per joule x 3.6e6, energy over the measured window "
        "of the devices the run used) and per dollar (throughput x 3600 / (price per device-hour x devices)), "
        "ranked 1 for the most; a system without a counter or a price is listed unranked for that figure.",
        tables=tables, notes=notes)


def _f(v: object) -> str:
    return "-" if v is None else (str(v) if isinstance(v, int) else fmt_num(v))
