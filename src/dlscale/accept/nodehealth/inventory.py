"""The inventory check: what a node must have, judged from its inventory (a record in, verdicts out), and the
node's inventory at its last sound acceptance, read from the store (``find_last``).

The check records the node's inventory (``dlscale.api.inventory``: a run of kind ``inventory``
whose metrics count the GPUs CUDA sees, the GPUs NVML lists on the host, the logical CPUs and the
memory) and is judged here against what the spec says the node has (``inventory: {gpus: 8,
gpu_model: H100, cpus: 224, memory_gib: 2000}``), and against itself: every GPU NVML lists on the
host must be a CUDA device where ``CUDA_VISIBLE_DEVICES`` hides none (a GPU that fell off the bus
or whose driver state broke is listed by one and not the other). A count below the spec's is a
FAIL, above it a WARN (the node is not the one the spec describes; memory is a least value, as
the kernel's share of it moves between boots). An item the spec does not give is held to the node's
inventory at its last sound acceptance (``find_last``: a GPU or CPU fewer than then is a FAIL,
one more a WARN; memory more than ``MEMORY_SLACK`` below it a FAIL), else NO EXPECTATION. Fast and
with no load: it belongs to level 1, the Slurm health check.

The last sound acceptance (``find_last``): the newest acceptances of the same system (or those a
``--baseline`` selector names), newest first, that ended before this one began, did not overlap it, and
judged their own inventory sound (no FAIL or ERROR of the ``inventory`` check on that node); their
``inventory`` run per node. What it catches with no count in the spec: a GPU that fell off the bus, a CPU
socket or DIMM lost since.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.accept.figures.collect import node_hosts
from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, PASS, WARN, Verdict, error
from dlscale.accept.sources.baseline import MAX_HISTORY, overlaps, span
from dlscale.record import RunRecord

# option -> (its type, the metric it is compared with, unit, what the item is called)
OPTIONS: dict[str, tuple[type | tuple[type, ...], str, str, str]] = {
    "gpus": (int, "gpus", "GPUs", "GPUs"),
    "cpus": (int, "cpus", "CPUs", "logical CPUs"),
    "memory_gib": ((int, float), "memory_gib", "GiB", "memory"),
    "gpu_model": (str, "", "", "GPU model"),
}


FLOORS = ("memory_gib",)  # items the spec gives as a least value, not an exact count
MEMORY_SLACK = 0.05  # memory below the last acceptance's by more than this is lost (a DIMM of 16 is 6.25%)


def check_options(options: dict[str, Any]) -> dict[str, str]:
    """Option -> what is wrong with it (empty: all good)."""
    bad = {}
    for k, v in options.items():
        if k not in OPTIONS:
            bad[k] = f"unknown option {k!r} of inventory; options: {', '.join(OPTIONS)}"
        elif isinstance(v, bool) or not isinstance(v, OPTIONS[k][0]):
            bad[k] = f"must be {'text' if OPTIONS[k][0] is str else 'a number'}, got {v!r}"
        elif not isinstance(v, str) and v <= 0:
            bad[k] = f"must be above 0, got {v!r}"
    return bad


def verdicts(rec: RunRecord, expect: dict[str, Any], host: str | None = None,
             last: tuple[RunRecord, str] | None = None) -> list[Verdict]:
    """The inventory record's verdicts: each counted item against the spec's (else against ``last``:
    the node's inventory run at its last sound acceptance, and where it came from), the GPU model, and
    CUDA against NVML (``host``: the record's node, named where the acceptance spans several)."""
    if rec.status != "ok":
        return [error("inventory", f"the run failed: {rec.error}", subject=host, run_ids=[rec.run_id])]
    m = rec.metrics or {}
    out = [_count(rec, key, expect.get(key), host) if key in expect or last is None else _since(rec, key, last, host)
           for key in ("gpus", "cpus", "memory_gib")]
    if expect.get("gpu_model"):
        out.append(_model(rec, str(expect["gpu_model"]), host))
    nvml, cuda = m.get("nvml_gpus"), m.get("gpus")
    if isinstance(nvml, int) and isinstance(cuda, int) and nvml and not (rec.raw or {}).get("cuda_visible_devices"):
        out.append(_verdict(rec, "CUDA devices vs NVML", host, PASS if cuda == nvml else FAIL, cuda, "GPUs",
                            f"CUDA sees {cuda} of the {nvml} GPUs NVML lists"
                            + ("" if cuda == nvml else ": a GPU is not usable (driver, Xid, fallen off the bus)"),
                            expected=nvml, kind="NVML"))
    return out


def _count(rec: RunRecord, key: str, want: Any, host: str | None) -> Verdict:
    _, metric, unit, name = OPTIONS[key]
    have = (rec.metrics or {}).get(metric)
    if not isinstance(have, (int, float)) or isinstance(have, bool):
        return error("inventory", f"the inventory has no {name} count ({have!r})", figure=name, subject=host,
                     run_ids=[rec.run_id])
    if want is None:
        return _verdict(rec, name, host, NO_EXPECTATION, have, unit, f"{have:g} {unit}; the spec gives no {key}")
    floor = key in FLOORS  # memory: at least what the spec gives (the kernel's share moves it between boots)
    status = PASS if have == want or floor and have > want else FAIL if have < want else WARN
    word = {PASS: "at least" if floor else "as the spec says", FAIL: "fewer than the spec's",
            WARN: "more than the spec's"}[status]
    return _verdict(rec, name, host, status, have, unit, f"{have:g} {unit}, {word} {want:g}", expected=want)


def _since(rec: RunRecord, key: str, last: tuple[RunRecord, str], host: str | None) -> Verdict:
    """A counted item the spec does not give, against the node's own count at its last sound acceptance."""
    _, metric, unit, name = OPTIONS[key]
    have, then = (rec.metrics or {}).get(metric), (last[0].metrics or {}).get(metric)
    if not isinstance(then, (int, float)) or isinstance(then, bool):
        return _count(rec, key, None, host)
    if not isinstance(have, (int, float)) or isinstance(have, bool):
        return _count(rec, key, then, host)  # the ERROR of a missing count
    if key in FLOORS:
        lost = have < then * (1 - MEMORY_SLACK)
        status = FAIL if lost else PASS
        word = (f"{then - have:.1f} {unit} less than at" if lost else
                f"within {MEMORY_SLACK:.0%} of what it had at" if have < then else "at least what it had at")
    else:
        status = PASS if have == then else FAIL if have < then else WARN
        word = {PASS: "as at", FAIL: f"{then - have:g} fewer than at", WARN: f"{have - then:g} more than at"}[status]
    return _verdict(rec, name, host, status, have, unit, f"{have:g} {unit}, {word} {last[1]}", expected=then,
                    kind="baseline", source=f"{last[1]}: the node's inventory then")


def _model(rec: RunRecord, want: str, host: str | None) -> Verdict:
    names = (rec.raw or {}).get("gpu_names") or []
    wrong = [f"GPU {i} is {n}" for i, n in enumerate(names) if want.lower() not in str(n).lower()]
    if not names:
        wrong = ["no GPU"]
    return _verdict(rec, "GPU model", host, FAIL if wrong else PASS, None, "",
                    f"{'; '.join(wrong)}, not {want}" if wrong else f"every GPU is a {want}", kind="spec",
                    source=f"gpu_model: {want}")


def _verdict(rec: RunRecord, figure: str, host: str | None, status: str, measured: Any, unit: str, reason: str,
             expected: Any = None, kind: str = "spec", source: str | None = None) -> Verdict:
    return Verdict(check="inventory", figure=figure, subject=host, status=status, measured=measured, unit=unit,
                   expected=expected, expectation=kind if expected is not None or source else None,
                   source=source or (f"the spec's inventory" if kind == "spec" and expected is not None else
                                     "NVML's GPU list" if kind == "NVML" else None),
                   reason=reason, run_ids=[rec.run_id], key=f"inventory|{figure}|{host or ''}")


# -- the node's inventory at its last sound acceptance (the store) -------------------------------------
CHECK = "inventory"


def _last_of_system(store: Any, system: str | None, this: tuple[str, str] | None,
              exclude: str | None = None) -> dict[str | None, tuple[RunRecord, str]]:
    """Node (None on one node) -> (its inventory run, "acceptance ID (date)") at the newest sound
    acceptance of ``system`` before ``this`` (its start and end; ``exclude``: its own tag)."""
    accs = [a for a in store.query(kind="accept", status="ok")
            if a.tag != exclude and (a.config or {}).get("system") == system]
    return _last_sound(store, accs[:MAX_HISTORY], this)


def _last_sound(store: Any, accs: Sequence[RunRecord], this: tuple[str, str] | None
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


def find_last(store: Any, selector: str | None, system: str | None, this: tuple[str, str] | None,
         exclude: str | None = None) -> dict[str | None, tuple[RunRecord, str]]:
    """What ``_last_of_system`` finds, or with a ``--baseline`` selector, the same among the acceptances it names."""
    if not selector:
        return _last_of_system(store, system, this, exclude)
    from dlscale.analysis.select import select

    accs = sorted((r for r in select(store, selector) if r.kind == "accept" and r.status == "ok" and r.tag != exclude),
                  key=lambda r: r.created_at, reverse=True)
    return _last_sound(store, accs, this)
