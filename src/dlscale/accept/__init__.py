"""``dlscale accept``: does this server (or cluster) perform as it should, and if not, which part is wrong?

An application on the library, as the CLI is: it runs its checks through ``dlscale.api``, and
``api`` never imports it. Its functions here are what ``dlscale accept`` calls and what a notebook
calls: ``run_suite`` (the suite, judged), ``judge`` (a recorded acceptance judged again),
``verify`` (an output folder against its manifest), ``list_refs`` and ``export_refs`` (the
healthy figures, and a lab's own file of them).

Its rooms, in the order an acceptance passes through them:

- ``plan/``: the spec (checks, levels and their budgets, time limits, thresholds) and the suite (the
  checks that apply to this machine, with the ``dlscale.api`` call of each: ordinary recorded runs, all
  tagged with one acceptance id);
- ``running/``: each check in a process of its own within its time limit; one acceptance at a time per host;
- ``figures/``: each check's figures (with their raw samples) read from its records (pure);
- ``expectations.py`` and ``sources/``: where each figure's expectation comes from, every source in its
  order (healthy rows, datasheet, baseline, reference, the spec, the data-parallel rule, peers; a
  device's own history);
- ``judging/``: figure and expectation into PASS / WARN / FAIL / NO EXPECTATION, or ERROR where nothing
  sound was measured (verdicts fail closed), with ratio, threshold, confidence interval and significance,
  pure functions that can re-judge old records with new thresholds; verdicts that explain each other;
- ``outputs/``: the verdicts as JSON, JUnit XML, an HTML report and a sha256 manifest that ``verify``
  checks; a lab's own healthy-figures file;
- ``nodehealth/``: the node's inventory, its kernel's Xid history, the burn-in's verdicts, and draining
  or resuming the Slurm node an acceptance ran on;
- ``slurm.py``: the suite as one Slurm job, judged where it was submitted.

``acceptance.py`` runs them in turn and records a run of kind ``accept``. docs/METRICS.md ("Acceptance")
derives every figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.errors import UsageError

__all__ = ["run_suite", "judge", "verify", "list_refs", "export_refs"]


def run_suite(spec: str | None = None, *, quick: bool = False, level: int | None = None,
              baseline: str | None = None, reference: str | None = None, warn_fails: bool | None = None,
              out_dir: str | None = None, db: str | None = None, emulate_nodes: int | None = None,
              link_bandwidth: str | None = None, link_latency: str | None = None, node_link_bandwidth: Any = (),
              node_cpu_quota: Any = (), executor: str = "local", partition: str | None = None,
              nodes: int | None = None, gpus_per_node: int | None = None, time: str | int | None = None,
              refs: str | None = None, checks: str | Sequence[str] | None = None, drain_on_fail: bool = False,
              resume_on_pass: bool = False) -> Any:
    """The acceptance suite (``dlscale accept``): every check of ``spec`` (a YAML file; default the
    built-in ``level``: 1 seconds, health and inventory; 2 or ``quick`` minutes; 3, the default,
    everything with the burn-in) as ordinary recorded runs under one acceptance id, each check in its
    own process within its time limit and the level's budget, judged against the healthy figures of
    each device's model (``refs``: a lab's own file, tried before the shipped table), the datasheet,
    this system's baseline (``baseline``: a selector; default the accepted runs of the same system and
    suite where each figure passed), a ``reference`` selection and each device's peers.
    ``emulate_nodes`` (with the link rate and latency, and a node's own link rate or CPU quota as in
    ``Layout``) runs every check on nodes across that many emulated nodes, and the built-in suites
    add the collectives across them and every node's link. Returns an ``Acceptance``
    (``.verdicts``, ``.outcome``, ``.exit_code``, ``.out_dir`` with the report, JUnit XML and
    manifest), None on a rank other than 0 under a launcher. ``checks`` (a comma list or names) keeps
    only those checks of the spec; any check may be named, the burn-in (``burnin``) too, with its
    defaults where the spec has none.

    ``executor="slurm"`` runs the suite as one Slurm job (``accept.slurm``: ``nodes`` nodes of
    ``partition`` with ``gpus_per_node`` GPUs each, ``time`` minutes or ``[D-]H:MM[:SS]``) into
    ``db``, which the nodes must reach, waits for it and judges here. ``drain_on_fail`` and
    ``resume_on_pass`` make it this Slurm node's health check (``accept.nodehealth.drain``): a failed
    acceptance drains the node with its reason, a passed one resumes a node dlscale drained."""
    from dlscale.accept.nodehealth import drain
    from dlscale.accept import slurm
    from dlscale.accept.plan import spec as specs
    from dlscale.accept.acceptance import accept as run_accept
    from dlscale.accept.plan.suite import EmulatedNodes

    opts = slurm.options(executor, partition, nodes, gpus_per_node, time)  # bad combinations before anything
    emulated = EmulatedNodes(emulate_nodes, link_bandwidth, link_latency, node_link_bandwidth, node_cpu_quota)
    if opts is not None and emulated.emulate_nodes:
        raise UsageError("--executor slurm runs on the allocation's real nodes: leave out --emulate-nodes and the "
                         "emulated link and node options")
    if opts is not None and (drain_on_fail or resume_on_pass):
        raise UsageError("--drain-on-fail/--resume-on-pass act on the node the acceptance runs on: run `dlscale "
                         "accept --level 1` there (Slurm's HealthCheckProgram, prolog or epilog), not --executor slurm")
    level = specs.level_of(quick, level)
    sp = specs.load(spec) if spec else specs.builtin(level=level)
    if spec and level:
        sp.level, sp.budget_s = level, sp.budget_s or specs.BUDGET_S[level]
    if checks is not None:
        sp = sp.select(checks)
    quick = (sp.level or 3) <= 2
    if warn_fails is not None:
        sp.warn_fails = warn_fails
    node = drain.ready(drain_on_fail, resume_on_pass)
    if opts is not None:
        return slurm.accept_on_slurm(sp, opts, quick=quick, baseline=baseline, reference=reference, out_dir=out_dir,
                                     db=db, healthy=refs)
    acc = run_accept(sp, quick=quick, nodes=emulated, baseline=baseline, reference=reference, out_dir=out_dir, db=db,
                     healthy=refs)
    if acc is not None and node is not None:
        acc.node_action = drain.apply(acc, node, drain_on_fail, resume_on_pass)
    return acc


def judge(acceptance: str, *, spec: str | None = None, baseline: str | None = None, reference: str | None = None,
          warn_fails: bool | None = None, out_dir: str | None = None, db: str | None = None,
          refs: str | None = None) -> Any:
    """The verdicts of a recorded acceptance judged again from the store, with ``spec``'s thresholds
    (default: those it was judged with), another ``baseline``, ``reference`` or healthy-figures file
    ``refs``; nothing runs."""
    from dlscale.accept.plan import spec as specs
    from dlscale.accept.acceptance import rejudge

    return rejudge(acceptance, specs.load(spec) if spec else None, baseline=baseline, reference=reference,
                   warn_fails=warn_fails, out_dir=out_dir, db=db, healthy=refs)


def list_refs(model: str | None = None, refs: str | None = None) -> list[Any]:
    """The healthy figures acceptances are judged against (``refs``: a lab's file first, then the
    shipped table), those of models whose label or device name contains ``model``: ``healthy.Row``s."""
    from dlscale.accept.sources import healthy

    return healthy.listing(healthy.load(refs), model)


def export_refs(selector: str, out: str, db: str | None = None, force: bool = False) -> dict[str, Any]:
    """Write the healthy figures of the acceptances ``selector`` picks as a lab's own healthy-figures
    file ``out`` (``dlscale accept --refs OUT`` judges against it; an existing file only with ``force``,
    never a database); returns the document written."""
    from dlscale.accept.outputs.healthy_export import export

    return export(selector, out, db, force)


def verify(folder: str) -> tuple[int, list[str]]:
    """Check an acceptance's output folder against its manifest: (files that match, problems)."""
    from dlscale.accept.outputs import artifacts

    return artifacts.verify(folder)
