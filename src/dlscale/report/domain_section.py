"""The report's domain scaling section (seed 000, Figure 3): per family and model, by device count.

The figures come from ``analysis.domains.domain_table`` (derived in docs/METRICS.md, "Domain
scaling"): throughput at each device count in the family's own unit, the speed-up over the
smallest device count, the scaling efficiency, and the score over a reference system when the
report was given one (``dlscale report --reference SELECTOR``). One table per family and unit;
the plot shows speed-ups, which are ratios within one domain and so share an axis across units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.format import fmt_count, fmt_fixed, fmt_num, fmt_pct
from dlscale.record import RunRecord
from dlscale.report import plots
from dlscale.report.model import Figure, Section, TableData


def _rows(d: dict[str, Any], extra: Sequence[str] = ()) -> list[list[str]]:
    from dlscale.analysis.domains import describe

    label = describe(d)
    return [[label if i == 0 else "", str(r["devices"]), fmt_fixed(r["value"]), f"{r['speedup']:.2f}x",
             f"{r['device_ratio']:g}", fmt_pct(r["efficiency"], 1), "-" if r["score"] is None else f"{r['score']:.2f}x",
             *[fmt_num(r.get(m)) for m in extra],
             ", ".join(r["systems"]), (d["verdict"] or "-") if i == 0 else ""] for i, r in enumerate(d["rows"])]


# the per-joule and per-dollar columns beside a domain's metric ({unit}: the domain's sample unit)
EXTRA_COLUMNS = {"units_per_joule": "{unit} per J", "units_per_dollar": "{unit} per $",
                 "energy_to_target_kwh": "energy to train (kWh)", "cost_to_target": "cost to train ($)"}


def _reference_note(table: list[dict[str, Any]], label: str | None) -> str:
    found = [d for d in table if d["reference"] and d["reference"]["value"] is not None]
    notes = sorted({d["reference"]["note"] for d in table if d["reference"] and d["reference"]["note"]})
    text = (f"Scores are over the reference {label}: X_N / X_ref, X_ref its throughput for the same model and "
            f"sample shape at its smallest device count ({len(found)} of {fmt_count(len(table), 'domain')} {'has' if len(found) == 1 else 'have'} one).")
    return " ".join([text, *notes])


def domain_section(records: Sequence[RunRecord], reference: Sequence[RunRecord] | None = None,
                   reference_label: str | None = None, metric: str = "throughput") -> Section | None:
    """Seed 000's table for the report's train runs (``metric`` throughput) or tta runs (``metric``
    time_to_target); None when no domain has two device counts or a score."""
    from dlscale.analysis.domains import EFFICIENCY, domain_table, rate_unit

    timed = metric == "time_to_target"
    table = domain_table(records, reference, metric=metric, higher_is_better=not timed,
                         kinds=("tta",) if timed else None)
    shown = [d for d in table if len(d["rows"]) > 1 or any(r["score"] is not None for r in d["rows"])]
    if not shown:
        return None
    tables: dict[tuple[str, str], list[list[str]]] = {}
    series: dict[str, tuple[list[int], list[float]]] = {}
    many_systems = len({d["system"] for d in shown}) > 1
    extra = [m for m in EFFICIENCY[metric] if any(r.get(m) is not None for d in shown for r in d["rows"])]
    for d in shown:
        tables.setdefault((d["family"], d["sample_unit"]), []).extend(_rows(d, extra))
        if len(d["rows"]) > 1 and len(series) < 8:
            name = f"{d['model']} ({d['family']})" + (f" on {d['system']}" if many_systems else "")
            series[name] = ([r["devices"] for r in d["rows"]], [r["speedup"] for r in d["rows"]])
    fig = None
    if series:
        png = plots.speedups(series, "Speed-up over the smallest device count, per domain (dotted: ideal N / n0)")
        fig = Figure("domains", png, "speed-up against device count per domain")
    if timed:
        return _time_section(tables, fig, reference, shown, reference_label, extra)
    data = [TableData(["model and test", "devices", rate_unit(unit), "speed-up", "device ratio", "efficiency",
                       "score", *[EXTRA_COLUMNS[m].format(unit=unit) for m in extra], "systems", "scaling"], rows,
                      caption=f"{fam} ({rate_unit(unit)})")
            for (fam, unit), rows in tables.items()]
    notes = [_reference_note(shown, reference_label)] if reference is not None else []
    return Section(
        "Domain scaling by device count (seed 000, Figure 3)",
        "Per family and model: throughput at each device count in the family's own unit, speed-up = X_N / X_n0 over "
        "the smallest device count n0, efficiency = speed-up / (N / n0), and with --reference the MLPerf v0.5 "
        "score X_N / X_ref over a reference system. Scaling: linear = efficiency 90-105% at the largest count, "
        "super-linear above, flat = speed-up under 1.1x (seed 000's words for its domains).",
        figure=fig, tables=data, notes=notes)


def _time_section(tables: dict[tuple[str, str], list[list[str]]], fig: Figure | None,
                  reference: Sequence[RunRecord] | None, shown: list[dict[str, Any]],
                  reference_label: str | None, extra: Sequence[str] = ()) -> Section:
    """The same table in time to train (seed 000 ranks servers by MLPerf time to train per domain)."""
    if fig is not None:
        fig = Figure("domains-tta", fig.png, "time-to-train speed-up against device count per domain")
    data = [TableData(["model and test", "devices", "time to train (s)", "speed-up", "device ratio", "efficiency",
                       "score", *[EXTRA_COLUMNS[m] for m in extra], "systems", "scaling"], rows, caption=fam)
            for (fam, _unit), rows in tables.items()]
    notes = []
    if reference is not None:
        found = sum(1 for d in shown if d["reference"] and d["reference"]["value"] is not None)
        notes.append(f"Scores are over the reference {reference_label}: T_ref / T_N, T_ref its time to train the same "
                     f"model to the same target at its smallest device count ({found} of {fmt_count(len(shown), 'domain')} {'has' if found == 1 else 'have'} one).")
    return Section(
        "Time to train by domain and device count (seed 000)",
        "Per domain (family, model, target): the time to train T_N at each device count, speed-up = T_n0 / T_N over "
        "the smallest device count n0, efficiency = speed-up / (N / n0), and with --reference the MLPerf score "
        "T_ref / T_N over a reference system.", figure=fig, tables=data, notes=notes)
