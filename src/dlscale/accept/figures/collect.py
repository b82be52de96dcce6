"""From an acceptance's records to the figures its checks judge (pure: records in, figures out).

A ``Figure`` is one measured rate (higher is better) of one check, with the raw repeated
measurements of the same quantity it came from (``samples``, e.g. the rate of every measured
step, of every timed GEMM call), its 95% confidence interval, and what it is about: the system,
or one device, rank, node or link (``Subject``). Figures of one check, name and device model in
one run are peers (``peer_group``): the one slow GPU shows against their median. ``key`` names a
figure across acceptances, so a baseline's figure is found by it. docs/METRICS.md ("Acceptance")
says which figure each check reads and why.

An acceptance of several hosts (``dlscale accept --executor slurm --nodes N``) runs every per-node
check on each: those figures' subjects carry their host ("gpu07 GPU 3"; a figure about the whole
node is about "gpu07"), and the ranks of a run across the hosts are named the same way, so a slow
GPU's verdicts in training, GEMM and health meet in one explanation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from dlscale.accept.figures.figure import Figure, Subject, Unreadable, on_host, sound
from dlscale.accept.figures.readers import READERS
from dlscale.accept.sources import dataparallel
from dlscale.record import RunRecord

__all__ = ["Figure", "Subject", "Unreadable", "ONE_RUN_ACROSS_NODES", "END_TO_END", "check_of", "scale_rungs",
           "figures", "read", "node_hosts"]

END_TO_END = ("train", "scale", "inference")  # checks whose figures are results: energy and cost ride beside
# the checks whose one run spans the nodes; every other check runs once per node
ONE_RUN_ACROSS_NODES = ("collectives_nodes", "links", "train_alone", "train")


def check_of(rec: RunRecord, rungs: set[str]) -> str | None:
    """Which check a record belongs to (None: not a check's record, e.g. the acceptance itself)."""
    if rec.kind in ("health", "inventory"):
        return rec.kind
    if rec.kind == "micro":
        if rec.workload == "collectives":
            cfg = rec.config or {}
            return "collectives_nodes" if (cfg.get("nodes") or 1) > 1 or cfg.get("emulated_nodes") else "collectives"
        return rec.workload if rec.workload in ("memory", "gemm", "p2p", "links", "burnin") else None
    if rec.kind == "train":
        if rec.run_id in rungs:
            return "scale"
        return "train_alone" if (rec.config or {}).get("parallel") == "none" else "train"
    return {"scale": "scale", "inference": "inference", "serving": "serving"}.get(rec.kind)


def scale_rungs(records: Iterable[RunRecord]) -> set[str]:
    """The run ids of every scale ladder's rungs (listed in its summary record)."""
    return {i for r in records if r.kind == "scale" for i in (r.raw or {}).get("run_ids") or []}


def figures(records: Sequence[RunRecord]) -> list[Figure]:
    """Every ok record's sound figures, in record order; on several hosts, each per-node figure names its host."""
    return read(records)[0]


def read(records: Sequence[RunRecord]) -> tuple[list[Figure], list[Unreadable]]:
    """Every ok record's figures (``figures``) and what could not be read from them (``Unreadable``):
    judging fails closed on those (docs/METRICS.md, "Acceptance: ERROR"). A sample that is not a
    finite number is dropped from its figure's samples."""
    rungs = scale_rungs(records)
    hosts = node_hosts(records)
    out: list[Figure] = []
    bad: list[Unreadable] = []
    for rec in records:
        check = check_of(rec, rungs)
        if rec.status != "ok" or check not in READERS:
            continue
        try:
            got = READERS[check](rec, check)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as e:
            bad.append(Unreadable(check, rec.run_id, f"its record cannot be read ({type(e).__name__}: {e})"))
            continue
        for f in got:
            f = on_host(f, hosts[rec.run_id]) if rec.run_id in hosts else f
            if not sound(f.value):
                bad.append(Unreadable(check, rec.run_id, f"measured {f.value!r}: not a positive finite rate",
                                      f.subject.label if f.subject else None, f.name))
                continue
            f.samples = [x for x in f.samples if isinstance(x, (int, float)) and math.isfinite(x)]
            out.append(f)
        bad += unmeasured_gpus(rec, check, [f for f in out if f.run_id == rec.run_id])
    out += dataparallel.figures(records, {r.run_id: check_of(r, rungs) for r in records})
    return out, bad


def unmeasured_gpus(rec: RunRecord, check: str, figs: Sequence[Figure]) -> list[Unreadable]:
    """The GPUs of the record's node with no figure of a name the other GPUs have, for the checks that run
    on every GPU (GEMM and memory): a GPU that vanished mid-check, or rows a record lost."""
    if check not in ("gemm", "memory"):
        return []
    n = ((rec.system or {}).get("accelerators") or {}).get("count") or 0
    out = []
    for name in dict.fromkeys(f.name for f in figs if f.subject and f.subject.kind == "device"):
        have = {f.subject.key.rsplit(" ", 1)[-1] for f in figs if f.name == name and f.subject}
        if not any(d.startswith("cuda:") for d in have):
            continue
        for i in range(int(n)):
            if f"cuda:{i}" not in have:
                out.append(Unreadable(check, rec.run_id, f"no {name} figure for GPU {i} ({len(have)} of {n} GPUs "
                                      "measured)", f"GPU {i}", name))
    return out


def node_hosts(records: Sequence[RunRecord]) -> dict[str, str]:
    """Run id -> host of every per-node check's run (not one of ``ONE_RUN_ACROSS_NODES``), where those runs
    come from more than one host (an acceptance of several nodes: every node runs them); else empty."""
    rungs = scale_rungs(records)
    hosts = {r.run_id: str((r.system or {}).get("hostname") or "?") for r in records
             if r.kind != "accept" and check_of(r, rungs) not in ONE_RUN_ACROSS_NODES}
    return hosts if len(set(hosts.values())) > 1 else {}


