"""The acceptance's HTML report: the verdict table on top, then one section per check linking its runs
(``records/RUN_ID.json`` beside the report) and plotting its figures over the system's acceptances.

Reads the acceptance and its records only; renders through ``report.render`` (every string escaped there).
"""

from __future__ import annotations

from typing import Any

from dlscale.accept.judging.explain import CHECKS
from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, PASS, STATUSES, WARN, counts
from dlscale.accept.sources import history
from dlscale.format import fmt_num
from dlscale.report.model import Figure, Report, Section, TableData

COLUMNS = ["check", "figure", "on", "verdict", "measured", "expected", "from", "ratio", "warn / fail", "95% CI",
           "p", "energy / cost", "runs"]
MEANING = [
    f"{PASS}: within the warn threshold of its expectation.",
    f"{WARN}: below the warn threshold; or below the fail threshold but inside the measurement's noise (not "
    "significant at alpha), or without samples to tell the noise. Look, but it is not proven wrong.",
    f"{FAIL}: below the fail threshold and significantly so (one-sided p < alpha on the raw samples), or a health "
    "problem, or a run that failed. This part of the system does not perform as it should.",
    f"{ERROR}: nothing sound to judge: the check's run failed, ran past its time limit and was killed, recorded "
    "nothing or no figure, or a figure is not a positive finite number. It exits 1 like a FAIL: an acceptance "
    "that could not measure a part has not accepted it.",
    f"{NO_EXPECTATION}: nothing to compare with (no datasheet figure, baseline, reference or peer); this run is "
    "the baseline of the next acceptance of the same system and suite.",
]


def cells(v: Any) -> list[str]:
    """One verdict as the table's cells (also the terminal table's)."""
    return [CHECKS.get(v.check, v.check), v.figure, v.subject or "system", v.status,
            _val(v.measured, v.unit), _val(v.expected, v.unit), v.expectation or "-",
            "-" if v.ratio is None else f"{v.ratio:.3f}",
            "-" if v.warn is None else f"{v.warn * 100:.3g}% / {v.fail * 100:.3g}%",
            "-" if not v.ci95 else f"{fmt_num(v.ci95[0])} - {fmt_num(v.ci95[1])}",
            "-" if not v.test else f"{v.test['p']:.2g}", energy_text(v.energy), ", ".join(v.run_ids)]


def _val(x: float | None, unit: str) -> str:
    return "-" if x is None else f"{fmt_num(x)} {unit}".strip()


def energy_text(energy: dict[str, Any]) -> str:
    """'1.9 J/image, 412 W, $0.52 per 10^6 images' where the record carries them."""
    parts = []
    for key, fmt in (("energy_per_unit_j", "{v} {u}"), ("avg_power_w", "{v} W"),
                     ("cost_per_million_units", "${v} per 10^6 {unit}")):
        e = energy.get(key)
        if e:
            unit = str(e.get("unit", "")).split("/10^6 ")[-1].lstrip("$/").strip() or "units"
            parts.append(fmt.format(v=fmt_num(e["value"]), u=e.get("unit", ""), unit=unit))
    return ", ".join(parts) or "-"


def build_html(acc: Any, hist: list[history.Series]) -> str:
    from dlscale.report.render import to_html

    rec = acc.record
    n = counts(acc.verdicts)
    rep = Report(title=f"dlscale acceptance {acc.id}: {acc.outcome}",
                 subtitle=f"system {rec.config.get('system')}; spec {(rec.config.get('spec') or {}).get('name')}; "
                          f"recorded {rec.created_at[:19].replace('T', ' ')} UTC (run {rec.run_id})",
                 summary=[("outcome", acc.outcome), *((s, str(n[s])) for s in STATUSES),
                          ("checks run", str(len({v.check for v in acc.verdicts}))), ("not run", str(len(acc.not_run)))])
    rep.sections.append(verdict_section(acc))
    if acc.not_run:
        rep.sections.append(Section("Checks not run here", "Each with the reason it cannot run on this machine.",
                                    tables=[TableData(["check", "why"], [[CHECKS.get(c, c), w] for c, w in acc.not_run])]))
    for check in dict.fromkeys(v.check for v in acc.verdicts):
        rep.sections.append(check_section(acc, check, hist))
    rep.sections.append(Section("What the verdicts mean", "docs/METRICS.md (\"Acceptance\") derives every figure, "
                                "expectation and test.", notes=MEANING))
    return to_html(rep)


def verdict_section(acc: Any) -> Section:
    rows, links = [], []
    for v in acc.verdicts:
        rows.append(cells(v))
        run_link = f"records/{v.run_ids[0]}.json" if v.run_ids else None  # a check that recorded nothing: no run
        links.append([f"#check-{v.check}"] + [None] * (len(COLUMNS) - 2) + [run_link])
    why = [f"{v.status} {CHECKS.get(v.check, v.check)} {v.figure}{' on ' + v.subject if v.subject else ''}: "
           f"{v.reason}" + (f" -- related: {'; '.join(v.related)}" if v.related else "")
           for v in acc.verdicts if v.status in (FAIL, ERROR, WARN)]
    return Section("Verdicts", "Every check's figures against their expectations: the datasheet x a typical "
                   "fraction, this system's baseline, a reference, or the median of its peers. A FAIL needs the "
                   "shortfall past the fail threshold and significant; click a check for its runs and history.",
                   tables=[TableData(COLUMNS, rows, links=links)], notes=why, anchor="verdicts")


def check_section(acc: Any, check: str, hist: list[history.Series]) -> Section:
    mine = [v for v in acc.verdicts if v.check == check]
    run_ids = list(dict.fromkeys(((acc.record.raw or {}).get("check_runs") or {}).get(check) or
                                 [i for v in mine for i in v.run_ids[:1]]))
    by_id = {r.run_id: r for r in acc.records}
    runs = [[i, by_id[i].kind, by_id[i].workload, by_id[i].status, by_id[i].created_at[:19].replace("T", " "),
             by_id[i].error or ""] for i in run_ids if i in by_id]
    detail = [[v.figure, v.subject or "system", v.status, v.expectation or "-", v.source or "-", v.reason]
              for v in mine]
    figs = [Figure(f"history-{check}-{i}", png, f"{CHECKS.get(check, check)} over time ({unit})")
            for i, (unit, png) in enumerate(history.plot(hist, check, CHECKS.get(check, check)))]
    title = CHECKS.get(check, check)
    return Section(title[:1].upper() + title[1:], f"{len(mine)} verdict(s) from {len(runs)} run(s).",
                   tables=[TableData(["figure", "on", "verdict", "from", "source", "reason"], detail,
                                     caption="verdicts and the sources of their expectations"),
                           TableData(["run id", "kind", "workload", "status", "created (UTC)", "error"], runs,
                                     caption="runs (each links to its full record)",
                                     links=[[f"records/{r[0]}.json"] + [None] * 5 for r in runs])],
                   anchor=f"check-{check}", figures=figs)
