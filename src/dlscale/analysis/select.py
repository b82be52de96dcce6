"""Selecting runs by a short string, for ``compare``, ``report --reference`` and ``accept --baseline`` (reads only; no torch).

A selector is filters joined by commas, all of which a run must pass:
``tag:NAME`` (a bare word is a tag), ``system:NAME`` (an imported system's name or a host name), ``model:NAME``, ``run:ID+ID`` (ids or unambiguous prefixes), ``ref:NAME`` (a
shipped reference dataset, read from the package; nothing is written), ``imported:yes|no``,
``kind:KIND`` (train, prediction, micro, ...).
Only runs with status ok are selected, and only measured ones unless ``kind:`` asks otherwise:
``prediction`` records (what ``dlscale predict`` modelled) join a selection only with
``kind:prediction``, so a modelled figure never enters a measured average. ``run:`` names records
of any kind.
"""

from __future__ import annotations

from dlscale.errors import UsageError
from dlscale.record import RunRecord

FILTERS = ("tag", "system", "model", "run", "ref", "imported", "kind")
NOT_MEASURED = ("prediction",)  # kinds a selection takes only when kind: names them
YES, NO = ("yes", "true", "1"), ("no", "false", "0")


def parse(selector: str) -> list[tuple[str, str]]:
    parts = []
    for item in filter(None, (s.strip() for s in selector.split(","))):
        name, sep, value = item.partition(":")
        if not sep:
            name, value = "tag", item
        if name not in FILTERS or not value:
            raise UsageError(f"bad selector {selector!r}: {item!r}; use {', '.join(f + ':VALUE' for f in FILTERS)}")
        if name == "imported" and value.lower() not in YES + NO:
            raise UsageError(f"bad selector {selector!r}: imported:{value}; use imported:yes or imported:no")
        parts.append((name, value))
    if not parts:
        raise UsageError("empty selector; e.g. tag:baseline or ref:seed001-table5,system:SN-8xV100-16GB-SXM2")
    return parts


def select(store, selector: str) -> list[RunRecord]:
    """The ok runs a selector names (from the store, or from a reference dataset for ref:)."""
    from dlscale.analysis.domains import system_label
    from dlscale.importers.records import reference_records

    filters = parse(selector)
    refs = [v for k, v in filters if k == "ref"]
    if len(refs) > 1:
        raise UsageError(f"selector {selector!r}: one ref: at a time")
    if refs:
        recs = reference_records(refs[0])
    else:
        run_ids = [i for k, v in filters if k == "run" for i in v.split("+")]
        if run_ids:
            recs = [store.get(i) for i in run_ids]
        else:
            tags = [v for k, v in filters if k == "tag"]
            recs = store.query(tag=tags or None, status="ok")
    for k, v in filters:
        if k == "tag" and refs:
            recs = [r for r in recs if r.tag == v]
        elif k == "system":
            recs = [r for r in recs if v in (system_label(r), (r.system or {}).get("hostname"), r.config.get("system"))]
        elif k == "model":
            recs = [r for r in recs if r.workload == v]
        elif k == "kind":
            recs = [r for r in recs if r.kind == v]
        elif k == "imported":
            want = v.lower() in YES
            recs = [r for r in recs if r.imported == want]
    if not any(k in ("kind", "run") for k, _ in filters):
        recs = [r for r in recs if r.kind not in NOT_MEASURED]
    recs = [r for r in recs if r.status == "ok"]
    if not recs:
        raise UsageError(f"selector {selector!r} matches no ok runs; see `dlscale results list`")
    return recs
