"""Verdicts that explain each other, and the verdicts that are not comparisons (health, ERRORs).

A verdict that is not PASS is explained by the other non-PASS verdicts about the same part:

- a device, rank or node: every other check's non-PASS verdict on the same device (``cuda:3``)
  or node, and the health check's findings on that GPU ("training alone throughput on GPU 3 is 11%
  below its peers; GEMM bf16 best rate on GPU 3 is 10% below its peers; health: GPU 3 reports
  hw_thermal_slowdown");
- a node's link: the slow node is named when its link alone is below ("node 2's link is below
  expectation, the other nodes' links are not"), and its other non-PASS verdicts;
- the system (an end-to-end check such as the short test on all devices, or a collective): the
  non-PASS verdicts of its parts, devices and links first; where it crosses the nodes (the
  collectives across them, training on all, the ladder) the slow node's link leads.

Pure functions over verdicts and records (docs/METRICS.md, "Acceptance: explanations").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dlscale.accept.figures.figure import Figure, Unreadable, device_subject, host_subject
from dlscale.accept.figures.readers import READERS
from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, PASS, WARN, Verdict, error
from dlscale.format import fmt_count
from dlscale.record import RunRecord

CHECKS = {  # check -> what it is called in sentences and tables
    "health": "health", "inventory": "inventory", "memory": "memory", "p2p": "GPU-GPU copies", "gemm": "GEMM",
    "collectives": "collectives in the node", "collectives_nodes": "collectives across nodes",
    "links": "links between nodes", "train_alone": "training alone", "train": "training on all devices",
    "scale": "scaling", "inference": "inference", "burnin": "burn-in",
}
PARTS = ("health", "inventory", "memory", "p2p", "gemm", "collectives", "collectives_nodes", "links", "train_alone",
         "burnin")
OVER_THE_LINKS = ("collectives_nodes", "train", "scale")  # system figures whose traffic crosses the nodes' links
MAX_RELATED = 6


def phrase(v: Verdict) -> str:
    """One clause saying what a verdict found."""
    if v.check == "health":
        return f"health: {v.subject or 'the system'} reports {v.reason}"
    if v.measured is None:
        return f"{CHECKS.get(v.check, v.check)}: {v.reason}"
    where = f" on {v.subject}" if v.subject else ""
    short = v.shortfall
    how = f"is {short:.0%} below {_exp_phrase(v)}" if short is not None else v.reason
    return f"{CHECKS.get(v.check, v.check)} {v.figure}{where} {how}"


def _exp_phrase(v: Verdict) -> str:
    from dlscale.accept.judging.verdict import PHRASES

    return PHRASES.get(v.expectation or "", "its expectation")


def health_verdicts(rec: RunRecord, host: str | None = None) -> list[Verdict]:
    """One verdict per GPU of a health record: FAIL with its warnings, else ERROR with what NVML would not
    let it read, else WARN with its advisories, else PASS (``host``: the record's node, named where the
    acceptance spans several)."""
    if rec.status != "ok":
        return failed_run_verdicts([rec], {rec.run_id: "health"}, {rec.run_id: host} if host else {})
    if not (rec.raw or {}).get("gpus"):  # fail closed: a health check that looked at nothing
        why = (rec.raw or {}).get("note") or "NVML listed no GPU"
        return [error("health", f"nothing was checked: {why}", figure="health", subject=host, run_ids=[rec.run_id])]
    topo = ((rec.system or {}).get("accelerators") or {}).get("topology") or {}
    cuda_of = {g.get("nvml_index"): g.get("index") for g in topo.get("gpus") or [] if g.get("nvml_index") is not None}
    out = []
    for g in (rec.raw or {}).get("gpus") or []:
        idx = cuda_of.get(g.get("index"))
        subject = device_subject(f"cuda:{idx}") if idx is not None else None
        subject = host_subject(subject, host) if host and subject else subject
        label = subject.label if subject else \
            f"{host + ' ' if host else ''}{g.get('label') or 'GPU ' + str(g.get('index')) + ' (NVML)'}"
        found, unread, advised = health_findings(g), list(g.get("unread") or []), list(g.get("advisories") or [])
        status = FAIL if found else ERROR if unread else WARN if advised else PASS
        out.append(Verdict(check="health", figure="health", subject=label, status=status,
                           measured=None, unit="", reason="; ".join(found or unread or advised)
                           if found or unread or advised else "no throttling, ECC, retired-page, row-remap, link, "
                                                              "limit or Xid problem",
                           run_ids=[rec.run_id], key=f"health|health|{subject.key if subject else label}",
                           subject_key=subject.key if subject else None, devices=list(subject.devices) if subject else []))
    return out


def health_findings(gpu: dict) -> list[str]:
    """What a GPU's health snapshot reports as wrong: its alarming clock reasons by name, then its other warnings."""
    from dlscale.monitor.health import ALARMING

    reasons = [r for r in gpu.get("throttle_reasons") or [] if r in ALARMING]
    others = [w for w in gpu.get("warnings") or [] if "slowing its clocks" not in w]
    return reasons + others if reasons or others else list(gpu.get("warnings") or [])


def failed_run_verdicts(records: Sequence[RunRecord], check_of: dict[str, str],
                        hosts: dict[str, str] | None = None) -> list[Verdict]:
    """An ERROR for every check run that failed: nothing sound was measured (``hosts``: run id -> its
    node, where the acceptance spans several)."""
    out = []
    for r in records:
        if r.status != "ok":
            host, check = (hosts or {}).get(r.run_id), check_of.get(r.run_id, r.kind)
            out.append(error(check, f"the run failed: {r.error}", subject=host, run_ids=[r.run_id]))
    return out


def missing_run_verdicts(missing: dict[str, str], runs: dict[str, list[RunRecord]] | None = None) -> list[Verdict]:
    """An ERROR for every check that was to run and did not finish (``missing``: check -> why, e.g. "ran
    past its time limit of 60 s", "no run recorded: Slurm job 42 TIMEOUT: ..."), naming the runs it
    recorded before (``runs``: check -> its records), whose figures are judged on their own."""
    out = []
    for check, why in missing.items():
        mine = (runs or {}).get(check) or []
        ok = sum(r.status == "ok" for r in mine)
        had = (f"; before that it recorded {fmt_count(len(mine), 'run')} ({ok} ok"
               f"{', judged on their own' if ok else ''})" if mine else "")
        out.append(error(check, why + had, run_ids=[r.run_id for r in mine]))
    return out


def unreadable_verdicts(bad: Sequence[Unreadable]) -> list[Verdict]:
    """An ERROR for every figure an ok record should have given and did not (``collect.read``)."""
    return [error(u.check, u.reason, figure=u.figure, subject=u.subject, run_ids=[u.run_id]) for u in bad]


def figureless_verdicts(records: Sequence[RunRecord], check_of: dict[str, str], figs: Sequence[Figure],
                        bad: Sequence[Unreadable], skip: Iterable[str] = ()) -> list[Verdict]:
    """An ERROR for every check whose ok runs gave no figure at all (and nothing unreadable that says why):
    a check that measured nothing must not pass for want of a verdict."""
    have = {f.check for f in figs} | {u.check for u in bad} | set(skip)
    runs: dict[str, list[str]] = {}
    for r in records:
        check = check_of.get(r.run_id)
        if r.status == "ok" and check in READERS and check not in have:
            runs.setdefault(check, []).append(r.run_id)
    return [error(c, f"its {fmt_count(len(ids), 'run')} recorded no figure to judge", run_ids=ids)
            for c, ids in runs.items()]


def explain(verdicts: Sequence[Verdict]) -> None:
    """Fill each non-PASS verdict's ``related`` with the phrases of the verdicts that explain it."""
    bad = [v for v in verdicts if v.status not in (PASS, NO_EXPECTATION)]
    links, culprit = link_culprits(bad)
    for v in bad:
        if v.subject_key is not None:
            rel = [w for w in bad if w.key != v.key and _same_part(v, w, culprit)]
        else:  # the system: its parts' findings, devices and links first
            rel = [w for w in bad if w.key != v.key
                   and (w.subject_key is not None or (w.check in PARTS and w.check != v.check))]
            rel.sort(key=lambda w: (w.subject_key is None, PARTS.index(w.check) if w.check in PARTS else 99))
        phrases = list(dict.fromkeys(phrase(w) for w in rel))
        if v.check == "links" or (v.subject_key is None and v.check in OVER_THE_LINKS):
            phrases = links + phrases
        v.related = phrases[:MAX_RELATED]


def _same_part(v: Verdict, w: Verdict, culprit: int | None) -> bool:
    """Do two verdicts speak of the same device, or of a node and the links of that node when its link
    is the slow one (``culprit``)?"""
    if set(v.devices) & set(w.devices):
        return True
    if (v.check == "links") != (w.check == "links"):
        other = w if v.check == "links" else v
        return culprit is not None and culprit in other.nodes
    return False


def link_culprits(bad: Sequence[Verdict]) -> tuple[list[str], int | None]:
    """("node 2's link is below expectation, the other nodes' links are not", 2; on real nodes "gpu07's
    link ...") where one node's link
    is the slow one (a link verdict is about one node's link: ``readers.links_figures``), judged by
    the worst verdicts: one node's link FAILing names that node, whatever WARNs beside it; else the
    slow links by name and None."""
    slow = [v for v in bad if v.check == "links" and v.nodes]
    worst = [v for v in slow if v.status == FAIL] or slow
    names = {n: (v.subject or f"node {n}'s link").removesuffix("'s link") for v in worst for n in v.nodes}
    nodes = sorted(names)
    if not nodes:
        return [], None
    if len(nodes) > 1:
        return [f"slow links: {', '.join(names[n] for n in nodes)}"], None
    return [f"{names[nodes[0]]}'s link is below expectation, the other nodes' links are not"], nodes[0]
