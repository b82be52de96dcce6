"""A lab's own healthy figures: the figures its accepted fleet measured, written as a healthy-figures file.

``export(selector, out)`` reads the acceptances a selector picks (``dlscale results list --kind
accept``; e.g. ``kind:accept`` for all, ``system:gpu-node-07``, ``tag:ACCEPTANCE_ID``) but those that ended in
ERROR (a check could not measure, or measured nothing sound: never a healthy fleet's figure), takes from
each the figures with no proven shortfall against the figure's peers, baseline or reference (no
FAIL, no significant WARN there: a slow card among its peers is not a healthy figure); a shortfall
against the shipped healthy figures or the datasheet does not keep a figure out, since setting its
own figures is what a lab's file is for), and groups them by device model and what a row matches on
(check, figure, and the topology and options of ``EXPORT_WHEN``). A row's value is the geometric
mean of its group's values (every device and run of the fleet) and its tolerance the one-sided 95%
edge of their spread, ``1 - exp(-1.645 s)`` with s the SD of their logs (none with one value or no
spread: such a row is tested by the figure's own samples). The file has the shipped table's form
(``healthy.py``), each row's source naming the selection, the acceptances and the date, and
``dlscale accept --refs FILE`` judges against it before the shipped rows.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from dlscale.accept.judging.verdict import ERROR
from dlscale.accept.sources import healthy
from dlscale.errors import UsageError

MATCH = ("model", "batch_size", "precision", "channels_last", "image_size", "world_size")
EXPORT_WHEN = {"collectives": ("world_size", "max_size", "nvlinks"), "collectives_nodes": ("world_size", "max_size"),
               "p2p": ("path", "nvlinks"), "memory": ("pcie",), "train_alone": MATCH, "train": MATCH, "scale": MATCH,
               "inference": MATCH}


def gather(store: Any, selector: str) -> tuple[dict[tuple, list[float]], dict[tuple, str], list[Any]]:
    """(group -> values, group -> unit, the acceptances read) of the settled figures of the selection."""
    from dlscale.accept.figures.collect import figures
    from dlscale.analysis.select import select

    found = [r for r in select(store, selector) if r.kind == "accept" and r.status == "ok"]
    if not found:
        raise UsageError(f"selector {selector!r} matches no recorded acceptance (kind accept); see "
                         "`dlscale results list --kind accept`")
    accs = [r for r in found if (r.metrics or {}).get("outcome") != ERROR]
    if not accs:
        raise UsageError(f"the {len(found)} acceptance(s) of {selector!r} all ended in ERROR (a check could not "
                         "measure): none is exported as healthy; export acceptances that ended without ERROR")
    values: dict[tuple, list[float]] = {}
    units: dict[tuple, str] = {}
    for acc in accs:
        records = [r for r in store.query(tag=acc.tag, status="ok") if r.kind != "accept"]
        systems = {r.run_id: r.system or {} for r in records}
        keep = settled(acc)
        for f in figures(records):
            if f.key not in keep or not f.value > 0:
                continue
            facts = healthy.facts(f, systems.get(f.run_id) or {})
            if not facts.get("name"):
                continue
            when = tuple((k, facts[k]) for k in EXPORT_WHEN.get(f.check, ()) if facts.get(k) is not None)
            group = (str(facts["name"]), f.check, f.name, when)
            values.setdefault(group, []).append(f.value)
            units[group] = f.unit
    return values, units, accs


def settled(acc: Any) -> set[str]:
    """The figure keys of an acceptance with no proven shortfall but against a table (healthy, datasheet), and
    none judged ERROR."""
    rows = (acc.raw or {}).get("verdicts") or []
    bad = {r["key"] for r in rows if r.get("status") == ERROR or r.get("expectation") not in ("healthy", "datasheet")
           and (r.get("status") == "FAIL" or r.get("status") == "WARN" and r.get("significant", True))}
    return {r["key"] for r in rows if r.get("key")} - bad


def tolerance(values: list[float]) -> float | None:
    """1 - exp(-1.645 s), s the SD of the logs; None with fewer than two values or no spread."""
    if len(values) < 2:
        return None
    s = statistics.stdev([math.log(v) for v in values])
    return round(1 - math.exp(-healthy.Z95 * s), 4) if s > 0 else None


def document(selector: str, values: dict[tuple, list[float]], units: dict[tuple, str], accs: list[Any]) -> dict:
    from dlscale import __version__

    dates = sorted(a.created_at[:10] for a in accs)
    hosts = sorted({str((a.config or {}).get("system") or "?") for a in accs})
    today = time.strftime("%Y-%m-%d")
    models: dict[str, dict[str, Any]] = {}
    for (name, check, figure, when), vs in values.items():
        m = models.setdefault(name, {"model": name, "names": [name], "rows": []})
        row: dict[str, Any] = {
            "check": check, "figure": figure, "value": round(math.exp(statistics.fmean(math.log(v) for v in vs)), 6),
            "unit": units[(name, check, figure, when)], "basis": "typical", "tolerance": tolerance(vs),
            "topology": f"the lab's {', '.join(hosts)}",
            "source": f"lab export of {selector}: geometric mean of {len(vs)} value(s) from {len(accs)} accepted "
                      f"acceptance(s) of {', '.join(hosts)}, {dates[0]} to {dates[-1]}; exported by dlscale "
                      f"{__version__} on {today}"}
        if when:
            row["when"] = dict(when)
        m["rows"].append(row)
    return {"models": list(models.values())}


def export(selector: str, out: str, db: str | None = None, force: bool = False) -> dict[str, Any]:
    """Write the lab's healthy-figures file (the module doc) whole or not at all; returns its document."""
    import yaml

    from dlscale.paths import check_output, write_atomic
    from dlscale.store import Store

    path = check_output(out, "--out", db=db, force=force)
    with Store.open(db, create=False) as store:
        doc = document(selector, *gather(store, selector))
    if not doc["models"]:
        raise UsageError(f"the acceptances of {selector!r} settled no figure of a known device model: nothing to export")
    head = (f"# Healthy figures of a lab's fleet, exported by `dlscale accept refs export --from {selector}`.\n"
            "# Judge against it with `dlscale accept --refs THIS_FILE` (its rows come before the shipped ones).\n")
    write_atomic(path, head + yaml.safe_dump(doc, sort_keys=False, width=120), "--out")
    healthy.load(path)  # what was written reads back as a table
    return doc
