"""The report's prediction section: predicted against measured scaling, per layout.

Reads ``prediction`` records (``dlscale predict``) and the ok ``train`` runs of the same test
(model, per-device batch, the sample's shape, precision) among the records the report was given; a
measured run matches a prediction at the same layout (nodes x devices per node) and, across
nodes, the same link label (``analysis.scaling.link_of``). Error = (predicted - measured) /
measured, per layout; measured efficiency = measured / (devices x the source run's throughput).
Throughputs are in each model's sample unit (images/s, tokens/s, samples/s), named per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.format import fmt_fixed, fmt_pct
from dlscale.record import RunRecord
from dlscale.report import plots
from dlscale.report.model import Figure, Section, TableData

TEST = ("batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "precision")


def _key(r: RunRecord) -> tuple:
    return (r.workload, *(r.config.get(k) for k in TEST))


def _where(r: RunRecord) -> tuple[str, str]:
    from dlscale.analysis.scaling import layout_of, link_of

    nodes, per_node = layout_of(r)
    return f"{nodes}x{per_node}", (link_of(r) or "-") if nodes > 1 else "-"


def matched(records: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """One row per prediction: its layout, link, predicted and mean measured throughput, error."""
    from dlscale.analysis.domains import rate_unit, sample_unit
    from dlscale.stats import mean

    measured: dict[tuple, list[float]] = {}
    for r in records:
        if r.kind == "train" and r.status == "ok" and isinstance(r.metrics.get("throughput"), (int, float)):
            measured.setdefault((_key(r), *_where(r)), []).append(r.metrics["throughput"])
    by_id = {r.run_id: r for r in records}
    rows = []
    for p in (r for r in records if r.kind == "prediction" and r.status == "ok"):
        layout, link = _where(p)
        got = measured.get((_key(p), layout, link))
        m = mean(got) if got else None
        pred = p.metrics.get("throughput")
        base = by_id.get(p.config.get("from_run"))
        x1 = base.metrics.get("throughput") if base is not None else None
        devices = p.config.get("world_size") or 1
        rows.append({"model": p.workload, "unit": rate_unit(sample_unit(p)), "from_run": p.config.get("from_run"),
                     "layout": layout, "link": link,
                     "devices": p.config.get("world_size"), "predicted": pred, "measured": m,
                     "error": (pred - m) / m if m and pred is not None else None,
                     "efficiency": p.metrics.get("efficiency"), "comm_fraction": p.metrics.get("comm_fraction"),
                     "measured_efficiency": m / (devices * x1) if m and x1 else None})
    return sorted(rows, key=lambda r: (r["model"], r["link"], r["devices"] or 0, r["layout"]))


def prediction_section(records: Sequence[RunRecord]) -> Section | None:
    rows = matched(records)
    if not rows:
        return None
    table = TableData(["model", "layout", "link", "unit", "predicted", "measured", "error", "predicted efficiency",
                       "measured efficiency", "predicted comm fraction"],
                      [[r["model"], r["layout"], r["link"], r["unit"], fmt_fixed(r["predicted"]), fmt_fixed(r["measured"]),
                        fmt_pct(r["error"], 1, signed=True) if r["error"] is not None else "-",
                        fmt_pct(r["efficiency"], 1), fmt_pct(r["measured_efficiency"], 1),
                        fmt_pct(r["comm_fraction"], 1)] for r in rows])
    points = [(f"{r['model']} {r['layout']}" + (f" {r['link']}" if r["link"] != "-" else ""),
               r["measured_efficiency"], r["efficiency"]) for r in rows
              if r["measured_efficiency"] is not None and r["efficiency"] is not None]
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    note = (f"median absolute error {fmt_pct(sorted(errs)[len(errs) // 2], 1)} over {len(errs)} measured layouts"
            if errs else "no measured run matches a predicted layout yet")
    png = plots.predicted(points[:12], "Scaling efficiency: predicted against measured (one point per layout)")
    return Section(
        "Predicted against measured scaling",
        "`dlscale predict` models one data-parallel step from a one-device run and link parameters "
        "(docs/METRICS.md, Prediction); error = (predicted - measured) / measured at the same layout and link.",
        figure=Figure("prediction", png, "predicted against measured scaling efficiency, per layout"),
        tables=[table], notes=[note])
