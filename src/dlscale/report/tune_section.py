"""Report section for tuning runs (kind ``tune``): the ablation table of each, and what was not searched.

Each knob's chosen value, throughput with its 95% CI, its gain at its step (over the incumbent of
that time) and its re-test at the end (the final configuration over the final configuration
without it), as ``dlscale tune`` printed them; the caption gives the gain of the closing
side-by-side of the start and the best. A record made before the closing check has no re-test
and is captioned with the product of its steps' gains, named as such. Reads records only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.analysis.domains import system_label
from dlscale.format import fmt_ci, fmt_count, fmt_fixed, fmt_gain
from dlscale.record import RunRecord
from dlscale.report.model import Section, TableData


def _ci(ci: Any) -> str:
    return fmt_ci(ci[0], ci[1], fmt_fixed) if isinstance(ci, list) and len(ci) == 2 else "-"


def _x(v: Any) -> str:
    return f"x{v:.2f}" if isinstance(v, (int, float)) else "-"


def _state(s: dict[str, Any]) -> str:
    return "reverted" if s.get("reverted") else "kept" if s.get("kept") else "not kept"


def ablation_table(rec: RunRecord) -> TableData:
    """One tune record's ablation table."""
    unit = rec.units.get("throughput_best", "samples/s")
    steps = rec.raw.get("ablation") or []
    rows = [[str(s.get("knob")), str(s.get("value")), fmt_fixed(s.get("throughput")), _ci(s.get("ci")),
             _x(s.get("gain", 1.0)), _x(s.get("retest")), _state(s), str(s.get("note") or "")] for s in steps]
    m = rec.metrics
    if "gain_pairs" in m:
        gain = (f"{fmt_gain(m.get('gain'), m.get('gain_ci95'))} over the starting configuration, measured side by "
                f"side ({fmt_count(m['gain_pairs'], 'pair')})")
    else:  # a record made before the closing check: its gain is the product of the steps' gains
        gain = f"x{m.get('gain', 1.0):.2f} over the starting configuration as the product of its steps' gains"
    caption = f"{rec.workload} on {system_label(rec)} (run {rec.run_id}): {gain}; best config {rec.raw.get('config_file', '-')}"
    return TableData(["knob", "value", f"throughput ({unit})", "95% CI", "gain at its step", "re-test at the end", "",
                      "note"], rows, caption)


def tune_section(ok: Sequence[RunRecord]) -> Section | None:
    """The tuning section; None when the store holds no tune runs."""
    tunes = [r for r in ok if r.kind == "tune"]
    if not tunes:
        return None
    notes = sorted({f"{r.workload}: not searched: {n}" for r in tunes for n in r.raw.get("not_searched") or []})
    return Section(
        title="Tuning: what each knob gave",
        intro=("Each row is a real short test; a change is kept only when its gain is clear of the measured noise. "
               "A row's gain is at its step of the search; each kept knob is re-tested at the end against the final "
               "configuration, and the gain of a tune is a side-by-side of the start and the best, not the product "
               "of the rows' gains (each the best of several noisy candidates)."),
        tables=[ablation_table(r) for r in tunes], notes=notes)
