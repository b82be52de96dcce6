"""``api.accept``: plan the suite, run its checks, judge them, record the acceptance, write its outputs.

The acceptance is a run of kind ``accept`` tagged with the acceptance id (as every run of its
checks is): its config names the spec, the system and ``suite_hash`` (what was measured, so an
acceptance finds its baseline among those of the same system and suite; an emulated node's own
link rate or CPU quota is the emulated machine's state, like a fault on a real one, and is left
out of it, so a node set apart is judged against the healthy acceptances), and its raw holds every
verdict, the checks' run ids and the checks that did not run here. ``judge`` recomputes the
verdicts of any acceptance from the store, with the thresholds given (``dlscale accept judge``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.accept import explain, figures
from dlscale.accept import spec as specs
from dlscale.accept import suite
from dlscale.accept.expect import Baseline, expectations, find_baseline, selected_baseline
from dlscale.accept.verdict import FAIL, WARN, Expectation, Verdict, counts, judge as judge_figures, outcome
from dlscale.errors import UsageError
from dlscale.log import info
from dlscale.record import RunRecord, config_hash, new_run_id


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

    @property
    def outcome(self) -> str:
        return outcome(self.verdicts)

    @property
    def exit_code(self) -> int:
        """0 when nothing FAILed (and, with warn_fails, nothing WARNed), else 1."""
        bad = {FAIL, WARN} if self.warn_fails else {FAIL}
        return 1 if any(v.status in bad for v in self.verdicts) else 0


def judge(records: Sequence[RunRecord], sp: specs.Spec, base: Baseline | None = None,
          refs: Sequence[RunRecord] = (), missing: dict[str, str] | None = None) -> list[Verdict]:
    """Every verdict of an acceptance's records (pure): health, failed runs, the checks that recorded
    nothing (``missing``: check -> why), then each figure against its datasheet, baseline, reference
    and peers; then the explanations. On several nodes, a per-node check's verdicts name the node."""
    rungs = figures.scale_rungs(records)
    check_of = {r.run_id: figures.check_of(r, rungs) or r.kind for r in records}
    hosts = figures.node_hosts(records)
    figs = figures.figures(records)
    exps = expectations(figs, {r.run_id: r.system or {} for r in records}, base, refs)
    _spec_expectations(figs, sp, exps)
    verdicts = [v for r in records if r.kind == "health" for v in explain.health_verdicts(r, hosts.get(r.run_id))]
    verdicts += explain.failed_run_verdicts([r for r in records if r.kind != "health"], check_of, hosts)
    verdicts += explain.missing_run_verdicts(missing or {})
    verdicts += judge_figures(figs, exps, sp.thresholds, sp.peers, sp.per_check)
    order = list(specs.CHECKS) + ["links"]
    verdicts.sort(key=lambda v: order.index(v.check) if v.check in order else len(order))
    explain.explain(verdicts)
    return verdicts


def _spec_expectations(figs: Sequence[Any], sp: specs.Spec, exps: dict[int, list[Expectation]]) -> None:
    """What the spec itself expects: the serving check's ``expected_goodput``."""
    want = (sp.checks.get("serving") or {}).get("expected_goodput")
    for i, f in enumerate(figs):
        if want and f.check == "serving" and f.name == "goodput at SLO":
            exps.setdefault(i, []).append(Expectation("spec", float(want), f"acceptance spec {sp.name}: "
                                                                          f"expected_goodput {want:g} requests/s"))


@dataclass
class Against:
    """What an acceptance is compared with, read from the store before anything runs."""

    baseline: str | None = None  # the --baseline selector (None: this system's last accepted figures)
    reference: str | None = None
    chosen: Baseline | None = None
    refs: list[RunRecord] = field(default_factory=list)


def against(baseline: str | None, reference: str | None, db: str | None) -> Against:
    """The chosen baseline and reference runs; an unwritable database or a bad selector is a UsageError."""
    from dlscale.store import Store

    with Store.open(db) as store:
        return Against(baseline, reference, selected_baseline(store, baseline) if baseline else None,
                       _reference(store, reference))


def new_acceptance_id() -> str:
    return f"accept-{new_run_id()}"


def accept(sp: specs.Spec, *, quick: bool = False, nodes: suite.Nodes | None = None, baseline: str | None = None,
           reference: str | None = None, out_dir: str | None = None, db: str | None = None) -> Acceptance | None:
    """Run the acceptance suite here (see the module doc); None on a rank other than 0 under a launcher."""
    from dlscale.system import collect_cached

    plan = suite.plan(sp, quick, nodes=nodes)  # every check's options validated before anything runs
    if not plan.checks:
        raise UsageError("no check of the spec can run here: " + "; ".join(f"{c}: {w}" for c, w in plan.not_run))
    vs = against(baseline, reference, db)
    acc_id = new_acceptance_id()
    info(f"dlscale accept {sp.name}: acceptance {acc_id}, checks {', '.join(p.check for p in plan.checks)}")
    for check, why in plan.not_run:
        info(f"  not run: {check}: {why}")
    records = [r for p in plan.checks for r in suite.run_check(p, acc_id, db)]
    if not _rank_zero():
        return None
    return conclude(acc_id, sp, plan, records, collect_cached().get("hostname") or "?", vs, out_dir, db)


def conclude(acc_id: str, sp: specs.Spec, plan: Any, records: list[RunRecord], system: str, vs: Against,
             out_dir: str | None, db: str | None, missing: dict[str, str] | None = None,
             inventory: dict[str, Any] | None = None) -> Acceptance:
    """Judge an acceptance's recorded runs, record the acceptance and write its outputs (``plan``: the
    checks that ran, each with ``.check`` and ``.options``, and ``.not_run``; ``system``: what its
    baseline is looked up by; ``inventory``: its record's system, default this machine's)."""
    from dlscale.accept import outputs
    from dlscale.store import Store

    suite_hash = hash_of(plan.checks)
    with Store.open(db) as store:
        base = vs.chosen or find_baseline(store, system, suite_hash, {f.key for f in figures.figures(records)})
    verdicts = judge(records, sp, base, vs.refs, missing)
    rec = _record(acc_id, sp, plan, records, verdicts, system, suite_hash, vs.baseline, vs.reference, db, missing,
                  inventory)
    acc = Acceptance(acc_id, rec, records, verdicts, plan.not_run, sp.warn_fails)
    acc.out_dir = Path(out_dir or acc_id)
    acc.files = outputs.write(acc, db)
    return acc


def hash_of(checks: Sequence[suite.Planned]) -> str:
    """What an acceptance measured, to find its baseline by: every check's options, less the faults
    set into emulated nodes (a node's own link rate or CPU quota)."""
    return config_hash({p.check: {k: v for k, v in p.options.items() if k not in suite.FAULTS} for p in checks})


def rejudge(acceptance: str, sp: specs.Spec | None = None, *, baseline: str | None = None,
            reference: str | None = None, warn_fails: bool | None = None, out_dir: str | None = None,
            db: str | None = None) -> Acceptance:
    """The verdicts of a recorded acceptance computed again (new thresholds, another baseline); nothing runs
    and nothing is recorded. ``acceptance``: its id (its tag) or a prefix of its record's run id."""
    from dlscale.store import Store

    with Store.open(db) as store:
        acc_rec = _find_acceptance(store, acceptance)
        sp = sp or _spec_of(acc_rec)
        records = [r for r in store.query(tag=acc_rec.tag, newest_first=False) if r.kind != "accept"]
        refs = _reference(store, reference or acc_rec.config.get("reference"))
        cfg = acc_rec.config
        base = (selected_baseline(store, baseline) if baseline else
                find_baseline(store, cfg.get("system"), cfg.get("suite_hash"),
                              {f.key for f in figures.figures(records)}, exclude=acc_rec.tag))
    acc = Acceptance(acc_rec.tag, acc_rec, records, judge(records, sp, base, refs, (acc_rec.raw or {}).get("missing")),
                     [tuple(x) for x in (acc_rec.raw or {}).get("not_run") or []],
                     sp.warn_fails if warn_fails is None else warn_fails)
    if out_dir:
        from dlscale.accept import outputs

        acc.out_dir = Path(out_dir)
        acc.files = outputs.write(acc, db)
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


def _rank_zero() -> bool:
    from dlscale.distributed.env import detect, launcher_of

    env = detect() if launcher_of() else None
    return env is None or env.rank == 0


def _record(acc_id: str, sp: specs.Spec, plan: Any, records: list[RunRecord], verdicts: list[Verdict], system: str,
            suite_hash: str, baseline: str | None, reference: str | None, db: str | None,
            missing: dict[str, str] | None = None, inventory: dict[str, Any] | None = None) -> RunRecord:
    """The acceptance's own record (kind ``accept``; ``missing``: the checks that recorded nothing, and why)."""
    from dlscale.harness.runner import Outcome, execute
    from dlscale.store import Store

    rungs = figures.scale_rungs(records)
    checks: dict[str, list[str]] = {}
    for r in records:
        checks.setdefault(figures.check_of(r, rungs) or r.kind, []).append(r.run_id)
    n = counts(verdicts)
    metrics = {"outcome": outcome(verdicts), "verdicts": len(verdicts),
               **{k.lower().replace(" ", "_"): v for k, v in n.items()}}
    units = {"verdicts": "verdicts", **{k.lower().replace(" ", "_"): "verdicts" for k in n}}
    config = {"spec": sp.to_dict(), "system": system, "suite_hash": suite_hash, "baseline": baseline,
              "reference": reference, "checks": {p.check: p.options for p in plan.checks}}
    raw = {"verdicts": [v.to_dict() for v in verdicts], "check_runs": checks, "not_run": plan.not_run,
           **({"missing": missing} if missing else {})}
    with Store.open(db) as store:
        return execute(kind="accept", workload=sp.name, config=config, tag=acc_id, store=store, system=inventory,
                       body=lambda _rec: Outcome(metrics=metrics, units=units, raw=raw))
