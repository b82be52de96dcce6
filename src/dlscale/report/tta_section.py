"""The report's time-to-quality sections: every tta run's quality curve and outcome, and seed 000's
table by domain and device count in time to train.

A tta record of an image classifier carries top-1; any other family's carries its task's metric
(``quality_metric``, ``quality_label``, ``higher_is_better`` in its config; docs/METRICS.md,
"Time to quality"). Curves of one metric share a plot; metrics never share an axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.format import fmt_fixed, fmt_pct
from dlscale.record import RunRecord
from dlscale.report import plots
from dlscale.report.model import Figure, Section, TableData


def quality_of(rec: RunRecord) -> dict[str, Any]:
    """label, target, best, higher_is_better and the (wall_s, value) curve of a tta record."""
    c, m = rec.config, rec.metrics
    if c.get("quality_metric"):
        pts = [(p["wall_s"], p["quality"]) for p in rec.raw.get("curve", []) if p.get("quality") is not None]
        return {"label": c["quality_label"], "target": c.get("target"), "best": m.get("best_quality"),
                "higher": bool(c.get("higher_is_better", True)), "curve": pts, "pct": False}
    pts = [(p["wall_s"], p["top1"]) for p in rec.raw.get("curve", []) if p.get("top1") is not None]
    return {"label": "top-1", "target": c.get("target_top1", m.get("target_top1")), "best": m.get("best_top1"),
            "higher": True, "curve": pts, "pct": True}


def _fmt(q: dict[str, Any], v: Any) -> str:
    """A quality figure: top-1 in %, any other metric to 4 significant digits (HR@10 0.7512, BLEU 95.38)."""
    if v is None:
        return "-"
    return fmt_pct(v, 1) if q["pct"] else f"{v:.4g}"


def tta_section(records: Sequence[RunRecord]) -> list[Section]:
    """Each run's outcome, then quality against wall-clock time: one section and plot per metric."""
    from dlscale.analysis.domains import family

    runs = [r for r in records if r.kind == "tta" and r.raw.get("curve")]
    if not runs:
        return []
    plotted: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    rows = []
    for r in runs:
        q, m = quality_of(r), r.metrics
        series = plotted.setdefault(q["label"], {})
        if q["curve"] and len(series) < 8:
            series[f"{r.workload} {r.run_id[-8:]}"] = ([t for t, _ in q["curve"]],
                                                      [v * 100 if q["pct"] else v for _, v in q["curve"]])
        op = ">=" if q["higher"] else "<="
        rows.append([r.run_id, family(r), r.workload, str(m.get("world_size") or 1), f"{q['label']} {op} {_fmt(q, q['target'])}",
                     "yes" if m.get("reached_target") else "no", fmt_fixed(m.get("time_to_target")),
                     str(m.get("epochs_to_target") or "-"), _fmt(q, q["best"])])
    main = Section("Time to quality", "Each run's outcome: the time to target runs from the run's start to the first "
                   "evaluation that reaches the target, set-up and evaluation included (docs/METRICS.md).",
                   tables=[TableData(["run id", "domain", "model", "devices", "target", "reached",
                                      "time to target (s)", "epochs", "best"], rows)])
    curves = [Section(f"Time to quality: {label} against time", f"Validation {label} against wall-clock time.",
                      figure=Figure(f"tta-{i}", plots.lines(s, "wall-clock time (s)",
                                                            label + (" (%)" if label == "top-1" else ""),
                                                            f"{label} against training time"), f"{label} against time"))
              for i, (label, s) in enumerate(plotted.items()) if s]
    return [main, *curves]
