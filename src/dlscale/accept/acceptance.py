"""``accept.run_suite``: plan the suite, run its checks, judge them, record the acceptance, write its outputs.

The acceptance is a run of kind ``accept`` tagged with the acceptance id (as every run of its
checks is): its config names the spec, the system and ``suite_hash`` (what was measured, so an
acceptance finds its baseline among those of the same system and suite; an emulated node's own
link rate or CPU quota is the emulated machine's state, like a fault on a real one, and is left
out of it, so a node set apart is judged against the healthy acceptances), and its raw holds every
verdict, the checks' run ids and the checks that did not run here. ``judge`` recomputes the
verdicts of any acceptance from the store, with the thresholds given (``dlscale accept judge``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.accept import expectations
from dlscale.accept.figures import collect
from dlscale.accept.judging import explain
from dlscale.accept.judging.verdict import (FAIL, NO_EXPECTATION, WARN, Verdict, counts, exit_code,
                                            judge as judge_figures, outcome)
from dlscale.accept.nodehealth import burnin_verdicts
from dlscale.accept.nodehealth.inventory import find_last as last_inventory, verdicts as inventory_verdicts
from dlscale.accept.plan import spec as specs, suite
from dlscale.accept.sources import dataparallel, drift
from dlscale.accept.sources.baseline import Baseline, find_baseline, selected_baseline, span, span_of
from dlscale.accept.sources.identity import identities
from dlscale.errors import UsageError, on_interrupt
from dlscale.log import info
from dlscale.record import RunRecord, config_hash, new_run_id


OWN_VERDICTS = ("health", "inventory")  # record kinds judged by their own rules, not as figures
NO_FIGURES = ("inventory",)  # checks that measure nothing a baseline holds: left out of suite_hash


@dataclass
class Acceptance:
    """What an acceptance found, and where its outputs are."""

    id: str
    record: RunRecord  # kind "accept"
    records: list[RunRecord]  # the checks' runs
    verdicts: list[Verdict]
    not_run: list[tuple[str, str]]
    warn_fails: bool = False
    out_dir: Path | None = None
    files: list[Path] = field(default_factory=list)
    node_action: str | None = None  # what --drain-on-fail / --resume-on-pass did to the Slurm node

    @property
    def outcome(self) -> str:
        return outcome(self.verdicts)

    @property
    def exit_code(self) -> int:
        """0 when something was judged and nothing FAILed or ERRORed (and, with warn_fails, nothing
        WARNed), else 1."""
        return exit_code(self.verdicts, self.warn_fails)


def judge(records: Sequence[RunRecord], sp: specs.Spec, base: Baseline | None = None,
          refs: Sequence[RunRecord] = (), missing: dict[str, str] | None = None,
          table: Sequence[Any] | None = None, known_good: dict[str, burnin_verdicts.KnownGood] | None = None) -> list[Verdict]:
    """Every verdict of an acceptance's records (pure): health, then the ERRORs (failed runs, the checks
    that did not finish, ``missing``: check -> why, figures that cannot be read, checks that gave no
    figure), the burn-in's bits (``known_good``: burnin_verdicts.find_known_good's), then each figure against
    its healthy figure (``table``: ``healthy.Row``s, default the shipped table), datasheet, baseline,
    reference and peers; then the explanations. On several nodes, a per-node check's verdicts name
    the node."""
    missing = missing or {}
    rungs = collect.scale_rungs(records)
    check_of = {r.run_id: collect.check_of(r, rungs) or r.kind for r in records}
    hosts = collect.node_hosts(records)
    figs, unreadable = collect.read(records)
    base = (base or Baseline()).fit(figs, records)
    exps = expectations.of_acceptance(figs, records, sp, base, refs, table)
    verdicts = [v for r in records if r.kind in OWN_VERDICTS and check_of[r.run_id] not in missing
                for v in _own_verdicts(r, sp, hosts.get(r.run_id), base.inventory.get(hosts.get(r.run_id)))]
    verdicts += explain.failed_run_verdicts([r for r in records if r.kind not in OWN_VERDICTS
                                             and check_of[r.run_id] not in missing
                                             and not burnin_verdicts.explained_failure(r)], check_of, hosts)
    runs: dict[str, list[RunRecord]] = {}
    for r in records:
        runs.setdefault(check_of[r.run_id], []).append(r)
    verdicts += explain.missing_run_verdicts(missing, runs)
    verdicts += explain.unreadable_verdicts(unreadable)
    verdicts += explain.figureless_verdicts(records, check_of, figs, unreadable, missing)
    verdicts += burnin_verdicts.verdicts(records, known_good or {}, sp.per_check.get(burnin_verdicts.CHECK), hosts)
    verdicts += judge_figures(figs, exps, sp.thresholds, sp.peers, sp.per_check)
    dataparallel.annotate(verdicts, figs)
    for v in verdicts:
        if v.status == NO_EXPECTATION and v.key in base.notes:
            v.reason = f"{base.notes[v.key]}; no healthy, datasheet, reference or peer figure either"
    order = list(specs.CHECKS) + ["links"]
    verdicts.sort(key=lambda v: order.index(v.check) if v.check in order else len(order))
    explain.explain(verdicts)
    return verdicts


def _own_verdicts(rec: RunRecord, sp: specs.Spec, host: str | None, last: tuple[RunRecord, str] | None
                  ) -> list[Verdict]:
    """A health or inventory record's verdicts, by their own rules (``host``: its node among several;
    ``last``: its inventory at its last sound acceptance)."""
    if rec.kind == "health":
        return explain.health_verdicts(rec, host)
    return inventory_verdicts(rec, sp.checks.get("inventory") or {}, host, last)


@dataclass
class Against:
    """What an acceptance is compared with, read from the store before anything runs."""

    baseline: str | None = None  # the --baseline selector (None: this system's last accepted figures)
    reference: str | None = None
    refs: list[RunRecord] = field(default_factory=list)
    healthy: str | None = None  # --refs: a lab's healthy-figures file, tried before the shipped table
    table: list[Any] = field(default_factory=list)  # refs.Row: the lab's, then the shipped


def against(baseline: str | None, reference: str | None, db: str | None, healthy: str | None = None) -> Against:
    """The baseline selector (its runs are read when the acceptance is judged, less those that ran at the
    same time), reference runs and healthy figures; an unwritable database, a bad selector or a bad
    healthy-figures file is a UsageError."""
    from dlscale.accept.sources import healthy as healthy_refs
    from dlscale.analysis.select import select
    from dlscale.store import Store

    table = healthy_refs.load(healthy)
    with Store.open(db) as store:
        if baseline:
            select(store, baseline)  # a selector that matches nothing is refused before anything runs
        return Against(baseline, reference, _reference(store, reference), healthy, table)


def new_acceptance_id() -> str:
    return f"accept-{new_run_id()}"


def accept(sp: specs.Spec, *, quick: bool = False, nodes: suite.EmulatedNodes | None = None, baseline: str | None = None,
           reference: str | None = None, out_dir: str | None = None, db: str | None = None,
           healthy: str | None = None) -> Acceptance | None:
    """Run the acceptance suite here (see the module doc); None on a rank other than 0 under a launcher."""
    from dlscale.system import collect_cached

    plan = suite.plan(sp, quick, nodes=nodes)  # every check's options validated before anything runs
    if not plan.checks:
        raise UsageError("no check of the spec can run here: " + "; ".join(f"{c}: {w}" for c, w in plan.not_run))
    vs = against(baseline, reference, db, healthy)
    acc_id = new_acceptance_id()
    started = time.monotonic()  # the budget counts the wait for another acceptance's lock
    with host_lock(acc_id, sp.budget_s * LOCK_SHARE if sp.budget_s else None):
        budget = f", budget {sp.budget_s:g} s" if sp.budget_s else ""
        info(f"dlscale accept {sp.name}: acceptance {acc_id}, checks {', '.join(p.check for p in plan.checks)}{budget}")
        for check, why in plan.not_run:
            info(f"  not run: {check}: {why}")
        with on_interrupt(lambda: interrupted(acc_id, db)):
            if plan.machine.launcher:  # a rank of the launcher's job: the checks across ranks run in place, in its group
                records, missing, seconds = [r for p in plan.checks for r in suite.run_check(p, acc_id, db)], {}, {}
            else:
                records, missing, seconds = run_bounded(plan.checks, sp, acc_id, db, t0=started)
        if not _rank_zero():
            return None
        return conclude(acc_id, sp, plan, records, collect_cached().get("hostname") or "?", vs, out_dir, db, missing,
                        seconds=seconds)


MIN_CHECK_S = 1.0  # less of the budget left than this: the check is not started
LOCK_SHARE = 1 / 3  # of the suite's budget, the most it waits for another acceptance's lock (then HostBusy)


def run_bounded(checks: Sequence[suite.PlannedCheck], sp: specs.Spec, acc_id: str, db: str | None,
                clock: Callable[[], float] | None = None, t0: float | None = None
                ) -> tuple[list[RunRecord], dict[str, str], dict[str, float]]:
    """Every check in its own process within its time limit and what is left of the suite's budget, one
    after the other whatever became of the one before; their records, check -> why for every check
    that did not finish (``check_process``), and check -> its seconds. ``clock``: seconds, default
    ``time.monotonic``; ``t0``: when the budget began (default now; before the lock's wait)."""
    from dlscale.accept.running import check_process

    clock = clock or time.monotonic
    t0 = clock() if t0 is None else t0
    records: list[RunRecord] = []
    missing: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for p in checks:
        limit, why = sp.time_limit(p.check), ""
        if sp.budget_s is not None:
            left = sp.budget_s - (clock() - t0)
            if left < MIN_CHECK_S:
                missing[p.check] = f"not started: the suite's budget of {sp.budget_s:g} s was spent"
                continue
            if left < limit:
                limit, why = left, f" (what was left of the suite's budget of {sp.budget_s:g} s)"
        ran = check_process.run(p, sp, acc_id, db, limit, why)
        records += ran.records
        seconds[p.check] = round(ran.seconds, 3)
        if ran.problem:
            info(f"dlscale accept: {p.check}: {ran.problem}")
            missing[p.check] = ran.problem
    return records, missing, seconds


def interrupted(acc_id: str, db: str | None) -> str:
    """What an acceptance stopped by Ctrl-C kept (its checks' runs, under its id) and how to go on."""
    from dlscale.store import Store

    with Store.open(db) as store:
        runs = store.query(tag=acc_id, newest_first=False)
    rungs = collect.scale_rungs(runs)
    checks = list(dict.fromkeys(collect.check_of(r, rungs) or r.kind for r in runs))
    again = "run the same `dlscale accept` again for the verdicts"
    if not runs:
        return f"acceptance {acc_id} recorded no run and judged nothing; {again}"
    return (f"acceptance {acc_id} kept {len(runs)} run(s) of {', '.join(checks)} (the interrupted check's as failed) "
            f"and judged nothing; `dlscale results list --tag {acc_id}` lists them; {again}")


def host_lock(acc_id: str, wait_s: float | None = None) -> Any:
    """This host's acceptance lock (``host_lock.host_lock``: a second acceptance waits for the first, at most
    ``wait_s``); none for a rank under a launcher, whose job holds the nodes and whose ranks share a host."""
    from contextlib import nullcontext

    from dlscale.accept.running import host_lock as locks
    from dlscale.distributed.env import launcher_of

    return nullcontext() if launcher_of() else locks.host_lock(acc_id, wait_s=wait_s)


def conclude(acc_id: str, sp: specs.Spec, plan: Any, records: list[RunRecord], system: str, vs: Against,
             out_dir: str | None, db: str | None, missing: dict[str, str] | None = None,
             inventory: dict[str, Any] | None = None, seconds: dict[str, float] | None = None) -> Acceptance:
    """Judge an acceptance's recorded runs, record the acceptance and write its outputs (``plan``: the
    checks that ran, each with ``.check`` and ``.options``, and ``.not_run``; ``system``: what its
    baseline is looked up by; ``inventory``: its record's system, default this machine's; ``seconds``:
    how long each check's process took)."""
    from dlscale.accept.outputs import artifacts
    from dlscale.store import Store

    suite_hash = hash_of(plan.checks)
    this = span_of(records)
    with Store.open(db) as store:
        base = (selected_baseline(store, vs.baseline, this) if vs.baseline else
                find_baseline(store, system, suite_hash, {f.key for f in collect.figures(records)}, this=this))
        base.inventory = last_inventory(store, vs.baseline, system, this)
        good = burnin_verdicts.find_known_good(store, records)
        folder = Path(out_dir) if out_dir else default_out(store, acc_id)
    verdicts = judge(records, sp, base, vs.refs, missing, vs.table or None, good)
    verdicts += drift.verdicts_of(records, verdicts, db, sp.thresholds)
    rec = _record(acc_id, sp, plan, records, verdicts, system, suite_hash, vs.baseline, vs.reference, db, missing,
                  inventory, seconds, healthy=vs.healthy)
    acc = Acceptance(acc_id, rec, records, verdicts, plan.not_run, sp.warn_fails)
    acc.out_dir = folder
    acc.files = artifacts.write(acc, db)
    info(f"dlscale accept {acc_id}: report, JUnit XML, records and manifest in {folder}")
    return acc


def default_out(store: Any, acc_id: str) -> Path:
    """Where an acceptance's outputs go without --out: ``acceptances/ID`` beside the results database
    (a Slurm acceptance's job files are there too)."""
    from dlscale.paths import beside_db

    return beside_db(store.path, "acceptances") / acc_id


def hash_of(checks: Sequence[suite.PlannedCheck]) -> str:
    """What an acceptance measured, to find its baseline by: every check's options, less the faults
    set into emulated nodes (a node's own link rate or CPU quota), the price (it changes no rate), and
    the inventory (no figure: a suite with it has the baselines of the same suite without it)."""
    from dlscale.sweep.fields import COST

    return config_hash({p.check: {k: v for k, v in p.options.items() if k not in suite.FAULTS and k not in COST}
                        for p in checks if p.check not in NO_FIGURES})


def rejudge(acceptance: str, sp: specs.Spec | None = None, *, baseline: str | None = None,
            reference: str | None = None, warn_fails: bool | None = None, out_dir: str | None = None,
            db: str | None = None, healthy: str | None = None) -> Acceptance:
    """The verdicts of a recorded acceptance computed again (new thresholds, another baseline or
    healthy-figures file; default the file it was judged with, where it is still there); nothing runs
    and nothing is recorded. ``acceptance``: its id (its tag) or a prefix of its record's run id."""
    from dlscale.accept.sources import healthy as healthy_refs
    from dlscale.store import Store

    with Store.open(db, create=False) as store:
        acc_rec = _find_acceptance(store, acceptance)
        sp = sp or _spec_of(acc_rec)
        records = [r for r in store.query(tag=acc_rec.tag, newest_first=False) if r.kind != "accept"]
        refs = _reference(store, reference or acc_rec.config.get("reference"))
        cfg = acc_rec.config
        this = span(store, acc_rec)
        base = (selected_baseline(store, baseline, this) if baseline else
                find_baseline(store, cfg.get("system"), cfg.get("suite_hash"),
                              {f.key for f in collect.figures(records)}, exclude=acc_rec.tag, this=this))
        base.inventory = last_inventory(store, baseline, cfg.get("system"), this, exclude=acc_rec.tag)
        good = burnin_verdicts.find_known_good(store, records, exclude=acc_rec.tag)
    lab = healthy or (cfg.get("healthy_refs") or {}).get("file")
    table = healthy_refs.load(lab if lab and (healthy or Path(lab).is_file()) else None)
    acc = Acceptance(acc_rec.tag, acc_rec, records, judge(records, sp, base, refs, (acc_rec.raw or {}).get("missing"),
                                                          table, good),
                     [tuple(x) for x in (acc_rec.raw or {}).get("not_run") or []],
                     sp.warn_fails if warn_fails is None else warn_fails)
    if out_dir:
        from dlscale.accept.outputs import artifacts

        acc.out_dir = Path(out_dir)
        acc.files = artifacts.write(acc, db)
    return acc


def _find_acceptance(store: Any, ident: str) -> RunRecord:
    hits = [r for r in store.query(tag=ident, kind="accept")]
    if hits:
        return hits[0]
    rec = store.get(ident)
    if rec.kind != "accept":
        raise UsageError(f"run {rec.run_id} is a {rec.kind} run, not an acceptance; see `dlscale results list --kind accept`")
    return rec


def _spec_of(rec: RunRecord) -> specs.Spec:
    """The spec an acceptance was judged with, from its record."""
    sp = specs.Spec.from_dict(rec.config.get("spec") or {})
    sp.name = sp.name or rec.workload
    return sp


def _reference(store: Any, selector: str | None) -> list[RunRecord]:
    if not selector:
        return []
    from dlscale.analysis.select import select

    return select(store, selector)


def healthy_of(lab: str | None) -> dict[str, Any]:
    """What the healthy figures were judged against: the lab file (path, sha256) and the shipped table's sha256."""
    import hashlib

    from dlscale.accept.sources.healthy import built_in_path

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    out: dict[str, Any] = {"built_in_sha256": sha(built_in_path())}
    if lab:
        out.update(file=str(Path(lab).resolve()), sha256=sha(Path(lab)))
    return out


def _rank_zero() -> bool:
    from dlscale.distributed.env import detect, launcher_of

    env = detect() if launcher_of() else None
    return env is None or env.rank == 0


def _record(acc_id: str, sp: specs.Spec, plan: Any, records: list[RunRecord], verdicts: list[Verdict], system: str,
            suite_hash: str, baseline: str | None, reference: str | None, db: str | None,
            missing: dict[str, str] | None = None, inventory: dict[str, Any] | None = None,
            seconds: dict[str, float] | None = None, healthy: str | None = None) -> RunRecord:
    """The acceptance's own record (kind ``accept``; ``missing``: the checks that did not finish, and why;
    ``seconds``: each check's time)."""
    from dlscale.harness.runner import Outcome, execute
    from dlscale.store import Store

    rungs = collect.scale_rungs(records)
    checks: dict[str, list[str]] = {}
    for r in records:
        checks.setdefault(collect.check_of(r, rungs) or r.kind, []).append(r.run_id)
    n = counts(verdicts)
    metrics = {"outcome": outcome(verdicts), "verdicts": len(verdicts),
               **{k.lower().replace(" ", "_"): v for k, v in n.items()}}
    units = {"verdicts": "verdicts", **{k.lower().replace(" ", "_"): "verdicts" for k in n}}
    config = {"spec": sp.to_dict(), "system": system, "suite_hash": suite_hash, "baseline": baseline,
              **dict(zip(("started_at", "ended_at"), span_of(records) or ())),
              "reference": reference, "checks": {p.check: p.options for p in plan.checks},
              "healthy_refs": healthy_of(healthy)}
    raw = {"verdicts": [v.to_dict() for v in verdicts], "check_runs": checks, "not_run": plan.not_run,
           "devices": identities(records), **({"missing": missing} if missing else {}),
           **({"check_seconds": seconds} if seconds else {})}
    with Store.open(db) as store:
        return execute(kind="accept", workload=sp.name, config=config, tag=acc_id, store=store, system=inventory,
                       body=lambda _rec: Outcome(metrics=metrics, units=units, raw=raw))
