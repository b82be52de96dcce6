"""A node's inventory at its last sound acceptance: what the inventory check compares the node with
when the spec gives no count (a GPU that fell off the bus, a CPU socket or DIMM lost since).

Read from the store: the newest acceptances of the same system (or those a ``--baseline`` selector
names), newest first, that ended before this one began, did not overlap it, and judged their own
inventory sound (no FAIL or ERROR of the ``inventory`` check on that node); their ``inventory``
run per node. The comparison itself is ``inventory.verdicts``'s (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.accept.expect import MAX_HISTORY, overlaps, span
from dlscale.accept.figures import node_hosts
from dlscale.accept.verdict import ERROR, FAIL
from dlscale.record import RunRecord

CHECK = "inventory"


def of_system(store: Any, system: str | None, this: tuple[str, str] | None,
              exclude: str | None = None) -> dict[str | None, tuple[RunRecord, str]]:
    """Node (None on one node) -> (its inventory run, "acceptance ID (date)") at the newest sound
    acceptance of ``system`` before ``this`` (its start and end; ``exclude``: its own tag)."""
    accs = [a for a in store.query(kind="accept", status="ok")
            if a.tag != exclude and (a.config or {}).get("system") == system]
    return newest(store, accs[:MAX_HISTORY], this)


def newest(store: Any, accs: Sequence[RunRecord], this: tuple[str, str] | None
           ) -> dict[str | None, tuple[RunRecord, str]]:
    """The same over ``accs`` (acceptance records, newest first), for every node they inventoried."""
    found: dict[str | None, tuple[RunRecord, str]] = {}
    for acc in accs:
        when = span(store, acc)
        if this and (overlaps(when, this) or when[1] > this[0]):
            continue  # measured at the same time, or after it (judging an old acceptance again)
        rows = (acc.raw or {}).get("verdicts") or []
        unsound = {r.get("subject") for r in rows if r.get("check") == CHECK and r.get("status") in (FAIL, ERROR)}
        runs = store.query(tag=acc.tag, status="ok")
        hosts = node_hosts(runs)
        for r in runs:
            host = hosts.get(r.run_id)
            if r.kind == CHECK and host not in found and host not in unsound:
                found[host] = (r, f"acceptance {acc.tag} ({when[0][:10]})")
        if None in found:
            break  # one node: its newest sound inventory is found
    return found


def find(store: Any, selector: str | None, system: str | None, this: tuple[str, str] | None,
         exclude: str | None = None) -> dict[str | None, tuple[RunRecord, str]]:
    """What ``of_system`` finds, or with a ``--baseline`` selector, the same among the acceptances it names."""
    if not selector:
        return of_system(store, system, this, exclude)
    from dlscale.analysis.select import select

    accs = sorted((r for r in select(store, selector) if r.kind == "accept" and r.status == "ok" and r.tag != exclude),
                  key=lambda r: r.created_at, reverse=True)
    return newest(store, accs, this)
