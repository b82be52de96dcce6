"""Each acceptance figure over time, from acceptance records alone (``dlscale results history``, the report's plots).

An acceptance record holds every verdict with the figure's measured value, so a figure's history
is read from the ``accept`` records of a system without opening the checks' runs: one point per
acceptance, with the worst verdict the figure got there. No torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dlscale.record import RunRecord

SEVERITY = {"FAIL": 4, "ERROR": 3, "WARN": 2, "PASS": 1, "NO EXPECTATION": 0}


@dataclass
class Point:
    acceptance: str
    created_at: str
    value: float | None
    status: str


@dataclass
class Series:
    check: str
    figure: str
    subject: str | None
    unit: str
    key: str
    points: list[Point] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.figure} on {self.subject}" if self.subject else self.figure

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "figure": self.figure, "subject": self.subject, "unit": self.unit,
                "key": self.key, "points": [vars(p) for p in self.points]}


def series(accept_records: Iterable[RunRecord]) -> list[Series]:
    """One series per figure key, its points oldest first (one per acceptance: the worst verdict of its rows)."""
    out: dict[str, Series] = {}
    for acc in sorted((r for r in accept_records if r.kind == "accept"), key=lambda r: r.created_at):
        for row in (acc.raw or {}).get("verdicts") or []:
            key = row.get("key") or ""
            s = out.setdefault(key, Series(row["check"], row["figure"], row.get("subject"), row.get("unit") or "", key))
            last = s.points[-1] if s.points else None
            if last is not None and last.acceptance == acc.tag:
                if SEVERITY.get(row["status"], 0) > SEVERITY.get(last.status, 0):
                    last.status = row["status"]
                continue
            s.points.append(Point(acc.tag or acc.run_id, acc.created_at, row.get("measured"), row["status"]))
    return list(out.values())


def plot(all_series: list[Series], check: str, title: str) -> list[tuple[str, bytes]]:
    """The check's figures over the acceptances, one plot per unit: (unit, PNG) pairs."""
    from dlscale.report.plots import history

    mine = [s for s in all_series if s.check == check and any(p.value is not None for p in s.points)]
    accs = sorted({(p.created_at, p.acceptance) for s in mine for p in s.points})
    if not mine or len(accs) < 1:
        return []
    pos = {a: i for i, (_, a) in enumerate(accs)}
    ticks = [c[:16].replace("T", " ") for c, _ in accs]
    out = []
    for unit in dict.fromkeys(s.unit for s in mine):
        lines = {s.label: ([pos[p.acceptance] for p in s.points if p.value is not None],
                           [p.value for p in s.points if p.value is not None],
                           [p.status for p in s.points if p.value is not None]) for s in mine if s.unit == unit}
        out.append((unit, history(lines, ticks, unit, f"{title} over time")))
    return out
