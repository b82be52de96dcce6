"""Each acceptance figure over time, from acceptance records alone (``dlscale results history``, the report's plots).

An acceptance record holds every verdict with the figure's measured value, so a figure's history
is read from the ``accept`` records of a system without opening the checks' runs: one point per
acceptance, with the worst verdict the figure got there. ``device_series`` follows one device by
its identity instead (a GPU's UUID or serial, a machine's id: ``identity.identities``, kept in each
acceptance record's ``raw.devices``), wherever it was accepted. No torch.
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
            if row.get("check") == "drift":
                continue
            _add(out, row.get("key") or "", acc, row)
    return list(out.values())


def _add(out: dict[str, "Series"], key: str, acc: RunRecord, row: dict[str, Any]) -> None:
    """One verdict row into its series: a new point per acceptance, the worst verdict of its rows."""
    s = out.setdefault(key, Series(row["check"], row["figure"], row.get("subject"), row.get("unit") or "", key))
    last = s.points[-1] if s.points else None
    if last is not None and last.acceptance == acc.tag:
        if SEVERITY.get(row["status"], 0) > SEVERITY.get(last.status, 0):
            last.status = row["status"]
        return
    s.points.append(Point(acc.tag or acc.run_id, acc.created_at, row.get("measured"), row["status"]))


def device_rows(acc: RunRecord, want: str, exact: bool = True) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the device's identity, the verdict rows about it) in one acceptance record: ``want`` is the
    device's id (``identity.ident_id``; ``exact=False``: its UUID, serial, machine id or a prefix)."""
    from dlscale.accept.sources.identity import ident_id, ident_matches, row_device

    devices = (acc.raw or {}).get("devices") or {}
    keys = {k for k, ident in devices.items() if (ident_id(ident) == want if exact else ident_matches(ident, want))}
    if not keys:
        return None, []
    rows = [r for r in (acc.raw or {}).get("verdicts") or []
            if r.get("check") != "drift" and r.get("measured") is not None and row_device(r) in keys]
    return devices[next(iter(sorted(keys)))], rows


def device_values(accept_records: Iterable[RunRecord], device: str, check: str, figure: str) -> list[float]:
    """One device's values of one figure over the acceptances, oldest first (one per acceptance)."""
    out = []
    for acc in sorted((r for r in accept_records if r.kind == "accept"), key=lambda r: r.created_at):
        _, rows = device_rows(acc, device)
        hit = next((r for r in rows if r["check"] == check and r["figure"] == figure), None)
        if hit is not None:
            out.append(float(hit["measured"]))
    return out


def device_series(accept_records: Iterable[RunRecord], want: str) -> tuple[dict[str, Any] | None, list[Series]]:
    """(the device's identity, one series per figure of it) over every acceptance that saw it, whichever
    system it sat in; ``want``: its UUID, serial, machine id or a prefix of one."""
    ident, out = None, {}  # type: ignore[var-annotated]
    for acc in sorted((r for r in accept_records if r.kind == "accept"), key=lambda r: r.created_at):
        found, rows = device_rows(acc, want, exact=False)
        ident = ident or found
        for row in rows:
            _add(out, f"{row['check']}|{row['figure']}", acc, row)
    return ident, list(out.values())


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
