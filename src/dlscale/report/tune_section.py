"""Report section for tuning runs (kind ``tune``): the ablation table of each, and what was not searched.

Each knob's chosen value, throughput with its 95% CI, the gain over the previous row and the
cumulative gain over the starting configuration (the product of the rows' gains), as ``dlscale
tune`` printed them. Reads records only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.analysis.compare import system_label
from dlscale.format import fmt_fixed
from dlscale.record import RunRecord
from dlscale.report.model import Section, TableData


def _ci(ci: Any) -> str:
    if isinstance(ci, list) and len(ci) == 2 and ci[0] is not None:
        return f"{fmt_fixed(ci[0])} - {fmt_fixed(ci[1]) if ci[1] is not None else 'inf'}"
    return "-"


def ablation_table(rec: RunRecord) -> TableData:
    """One tune record's ablation table."""
    unit = rec.units.get("throughput_best", "samples/s")
    rows = [[str(s.get("knob")), str(s.get("value")), fmt_fixed(s.get("throughput")), _ci(s.get("ci")),
             f"x{s.get('gain', 1.0):.2f}", f"x{s.get('cumulative', 1.0):.2f}", "kept" if s.get("kept") else "not kept",
             str(s.get("note") or "")] for s in rec.raw.get("ablation") or []]
    caption = (f"{rec.workload} on {system_label(rec)} (run {rec.run_id}): x{rec.metrics.get('gain', 1.0):.2f} over the "
               f"starting configuration; best config {rec.raw.get('config_file', '-')}")
    return TableData(["knob", "value", f"throughput ({unit})", "95% CI", "gain", "cumulative", "", "note"], rows, caption)


def tune_section(ok: Sequence[RunRecord]) -> Section | None:
    """The tuning section; None when the store holds no tune runs."""
    tunes = [r for r in ok if r.kind == "tune"]
    if not tunes:
        return None
    notes = sorted({f"{r.workload}: not searched: {n}" for r in tunes for n in r.raw.get("not_searched") or []})
    return Section(
        title="Tuning: what each knob gave",
        intro=("Each row is a real short test; a change is kept only when its gain is clear of the measured noise. "
               "The cumulative gain is the product of the kept rows' gains."),
        tables=[ablation_table(r) for r in tunes], notes=notes)
