"""Report sections that appear when the store holds such runs: scaling ladders, layouts
(scale-up vs scale-out), time-to-accuracy curves and monitoring time series.

Each builder takes the ok records and returns a Section, a list of Sections or None; adding a
section is adding one function to ``BUILDERS``. Throughput sections come one per sample unit
(``analysis.domains.by_unit``): a ladder is one model, so one unit, but an axis or a table of
several ladders must not mix images/s with tokens/s. Ladders, efficiency and layout % difference come from
``analysis.scaling`` (per system: runs of two systems never share a ladder).
"""

from __future__ import annotations

from collections.abc import Sequence

from dlscale.analysis import domains
from dlscale.analysis.domains import system_label
from dlscale.analysis.formulas import ideal_throughput
from dlscale.format import fmt_fixed, fmt_pct
from dlscale.record import RunRecord
from dlscale.report import plots
from dlscale.report.model import Figure, Section, TableData


def _by_system(records: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    out: dict[str, list[RunRecord]] = {}
    for r in records:
        out.setdefault(system_label(r), []).append(r)
    return out


def _layout(s: str) -> str:
    return s.replace("x", " x ")


def _ladder_table(lad: dict, system: str) -> tuple[TableData, tuple[list[int], list[float], list[float]]] | None:
    """A ladder's table and plot series (best layout per device count); None below two points."""
    eff = [e for e in lad["efficiency"] if e["efficiency"] is not None]
    if len(eff) < 2:
        return None
    name = lad["label"] if f" on {system}" in lad["label"] else f"{lad['label']} on {system}"
    x1 = next(e["throughput"] for e in eff if e["devices"] == 1)
    rows = [[_layout(e["layout"]), str(e["devices"]), fmt_fixed(e["throughput"]),
             fmt_fixed(ideal_throughput(x1, e["devices"])), f"{e['speedup']:.2f}x", fmt_pct(e["efficiency"], 1),
             fmt_pct(e["intra_node_efficiency"], 1), fmt_pct(e["inter_node_efficiency"], 1)] for e in eff]
    best: dict[int, float] = {}
    for e in eff:  # one point per device count for the line: the best layout
        best[e["devices"]] = max(best.get(e["devices"], 0.0), e["throughput"])
    ns = sorted(best)
    return TableData([], rows, caption=name), (ns, [best[n] for n in ns], [ideal_throughput(x1, n) for n in ns])


def scaling_section(records: Sequence[RunRecord]) -> list[Section]:
    """One section per sample unit: every ladder's efficiency table, measured against ideal on one axis."""
    from dlscale.analysis import scaling

    sections = []
    for unit, unit_recs in domains.by_unit(records).items():
        rate = domains.rate_unit(unit)
        tables, series = [], {}
        systems = _by_system(unit_recs)
        for system, recs in sorted(systems.items()):  # two systems never share a ladder
            for lad in scaling.analyse(recs)["ladders"]:
                got = _ladder_table(lad, system)
                if got is None:
                    continue
                table, line = got
                table.columns = ["nodes x devices", "devices", rate, "ideal", "speed-up", "efficiency", "intra-node",
                                 "inter-node"]
                tables.append(table)
                batch = lad["test"].get("batch_size")
                short = lad["workload"] + (f" bs {batch}" if batch else "") + (f" on {system}" if len(systems) > 1 else "")
                series[short] = line
        if not tables:
            continue
        png = plots.scaling(dict(list(series.items())[:6]), f"Measured throughput against ideal (N x one device), {rate}",
                            ylabel=f"throughput ({rate})")
        sections.append(Section(
            f"Scaling efficiency against ideal: {rate}",
            "Scaling efficiency = X_N / (N x X_1): the throughput on N devices over N times the single-device "
            "throughput of the same test on the same system (seed 001, Figs. 26 and 28); intra-node = what one node "
            "of g devices keeps, inter-node = what spreading over n such nodes keeps (efficiency = intra x inter).",
            figure=Figure("scaling" if unit == "images" else f"scaling-{unit}", png,
                          f"measured and ideal throughput ({rate}) against device count"),
            tables=tables,
        ))
    return sections


def layouts_section(records: Sequence[RunRecord]) -> Section | None:
    """Scale-up against scale-out at equal device counts: one table per sample unit."""
    from dlscale.analysis import scaling

    tables = []
    for unit, unit_recs in domains.by_unit(records).items():
        rate = domains.rate_unit(unit)
        rows = []
        for comp in scaling.analyse(unit_recs)["comparisons"]:
            for r in comp["rows"]:
                up = _layout(r["scale_up"]) + (f" ({r['scale_up_system']})" if r.get("scale_up_system") else "")
                out = _layout(r["scale_out"]) + (f" ({r['scale_out_system']})" if r.get("scale_out_system") else "")
                rows.append([comp["label"], str(r["devices"]), up, fmt_fixed(r["scale_up_throughput"]), out,
                             fmt_fixed(r["scale_out_throughput"]), fmt_pct(r["pct_difference"], 1, signed=True)])
        if rows:
            tables.append(TableData(["test", "devices", "scale-up layout", rate, "scale-out layout", rate,
                                     "% difference"], rows, caption=rate))
    if not tables:
        return None
    return Section(
        "Scale-up vs scale-out",
        "The same number of devices in fewer nodes against spread over more nodes. "
        "% difference = (scale-up - scale-out) / scale-out, as seed 001 Table 5 (positive: scale-up faster; "
        "seed 002 found at most 8.5%).",
        tables=tables,
    )


def monitoring_section(records: Sequence[RunRecord]) -> Section | None:
    runs = [r for r in records if isinstance(r.raw.get("monitor"), dict) and r.raw["monitor"].get("columns")]
    if not runs:
        return None
    r = runs[0]
    cols = r.raw["monitor"]["columns"]
    names = [k for k in cols if k != "t_s" and any(isinstance(v, (int, float)) for v in cols[k])]
    shown = ([k for k in names if any(s in k for s in ("util", "pct", "percent"))] or names)[:4]
    series = {k: ([t for t, v in zip(cols["t_s"], cols[k]) if v is not None], [v for v in cols[k] if v is not None])
              for k in shown}
    rows = []
    for k in names:
        vals = [v for v in cols[k] if isinstance(v, (int, float))]
        show = (lambda x: f"{x / 2**20:,.0f} MiB") if k.endswith("_bytes") else fmt_fixed
        rows.append([k, str(len(vals)), show(sum(vals) / len(vals)) if vals else "-", show(max(vals)) if vals else "-"])
    return Section(
        "Monitoring during the run",
        f"Time series sampled during run {r.run_id} ({r.workload}); {len(runs)} run(s) in this report carry them.",
        figure=Figure("monitor", plots.lines(series, "time (s)", "value", f"Resource use during {r.workload}"),
                      "resource time series"),
        tables=[TableData(["series", "samples", "mean", "max"], rows)],
    )


def micro_section(records: Sequence[RunRecord]) -> Section | None:
    runs = [r for r in records if r.kind == "micro"]
    if not runs:
        return None
    rows = []
    for r in runs:
        shown = [(k, v) for k, v in r.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                 and r.units.get(k) and k != "cases"][:8]
        for k, v in shown:
            rows.append([r.workload, r.run_id, k, f"{v:,.4g}", r.units[k]])
    return Section("Microbenchmarks (phase 1)", "Headline figures of each dlscale micro run (GEMM, convolution, "
                   "RNN, memory, peer-to-peer, collectives); the per-case rows are in each record.",
                   tables=[TableData(["kind", "run id", "figure", "value", "unit"], rows)])


def _prediction_section(records: Sequence[RunRecord]) -> Section | None:
    from dlscale.report.predictions import prediction_section

    return prediction_section(records)


def _inference_sections(records: Sequence[RunRecord]) -> list[Section]:
    from dlscale.report.inference_section import inference_sections

    return inference_sections(records)


def _serving_sections(records: Sequence[RunRecord]) -> list[Section]:
    from dlscale.report.serving_section import serving_sections

    return serving_sections(records)


def _tta_sections(records: Sequence[RunRecord]) -> list[Section]:
    from dlscale.report.tta_section import tta_section

    return tta_section(records)


def _tune_section(records: Sequence[RunRecord]) -> Section | None:
    from dlscale.report.tune_section import tune_section

    return tune_section(records)


BUILDERS = (scaling_section, layouts_section, _prediction_section, _inference_sections, _serving_sections,
            _tune_section, micro_section, _tta_sections, monitoring_section)
