"""``dlscale accept``: run the acceptance suite and print its verdicts; ``verify DIR``; ``judge ID``."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from dlscale.cli.common import DbOpt, Format, FormatOpt, out, print_json
from dlscale.cli.distopts import BandwidthOpt, EmulateOpt, LatencyOpt, NodeBandwidthOpt, NodeQuotaOpt

HELP = """Does this server (or cluster) perform as it should, and if not, which part is wrong?

Runs the acceptance suite as ordinary recorded runs under one acceptance id: GPU health, memory
(host STREAM; device and pinned host copies per GPU), the GPU peer matrix, GEMM per precision on
every device, collectives in the node and across nodes, every node's link, the short test on
every device alone (all at once, so the slow one shows) and on all devices, the scale ladder, and
LoadGen offline inference; with --checks burnin also the burn-in: a seeded GEMM chain and LLM
training on every device at once, compared bit for bit across devices and with the known-good
run (silent data corruption), power, clocks, temperature and clock events recorded. Every figure
is judged against an expectation with its source: the healthy figure of the device's model and
topology (a shipped table with a source for every row, or a lab's own file first with --refs;
`dlscale accept refs` lists them), else the datasheet x a typical fraction (GPUs), this system's
own baseline (--baseline; default the
figure's last accepted runs of the same system and suite), a reference (--reference) and, per
device, node and link, the median of its peers. Verdicts: PASS, WARN, FAIL (past the fail
threshold and significant: beyond the healthy figure's tolerance, the spread between runs of that
figure on that class of device, or the samples of its peers; never inside the noise), NO
EXPECTATION (recorded as the baseline for next time) and ERROR (nothing sound to judge: the
check's run failed, ran past its time limit, recorded no figure, or a figure is NaN, infinite or
not a number). A device whose own series (by GPU UUID, or the machine's id) dropped over its last
acceptances is a WARN of check drift, classed GPU, HBM, host or network.

Levels, each within a fixed budget: --level 1 (seconds, no load: GPU health with the PCIe and
NVLink link states, and the inventory), --level 2 or --quick (minutes), --level 3 (everything with
the burn-in, the default). Every check runs in its own process within its time limit (the spec's
time_limit, else its default); one that hangs is killed with every process it started, is an
ERROR, and the suite goes on. As Slurm's HealthCheckProgram, prolog or epilog: `dlscale accept
--level 1 --drain-on-fail --resume-on-pass` (docs/CLUSTER.md).

Several nodes: under srun/torchrun/mpirun across nodes, or on this machine with --emulate-nodes K
(network namespaces joined by links shaped at --link-bandwidth, default 1gbit; --node-link-bandwidth
and --node-cpu-quota set one node apart): every check that runs ranks runs across the nodes, and
the collectives between them and every node's link (micro links) are judged too.

Prints the verdict table, writes the HTML report, JUnit XML, every record and a sha256 manifest
into --out (default acceptances/ACCEPTANCE_ID beside the results database). One acceptance at a
time runs on a host: a second one waits for the first. Exit code 0 when nothing FAILed or ERRORed,
1 on a FAIL or an ERROR (or a WARN with --warn-fails), 2 for bad input. `dlscale accept verify DIR` checks a folder against its manifest;
`dlscale accept judge ID` judges a recorded acceptance again (other thresholds or baseline) without
running anything. `dlscale accept refs [--model H100]` lists the healthy figures with their
sources; `dlscale accept refs export --from SELECTOR --out lab.yaml` writes a lab's accepted fleet
as its own healthy-figures file for --refs.

--executor slurm submits the whole suite as one Slurm job (whole nodes; with --nodes 2 or more the
checks across nodes span the job's nodes and every node runs the per-node checks), records every
run into --db (which the nodes must reach), waits with its progress on stderr, then judges here and
writes the same outputs with the same exit code (see docs/CLUSTER.md)."""

EPILOG = """Examples:\n\n
  dlscale accept --quick\n\n
  dlscale accept --checks burnin                        # the burn-in and silent-data-corruption check alone\n\n
  dlscale accept --level 1 --drain-on-fail --resume-on-pass --out /var/lib/dlscale/health   # Slurm health check\n\n
  dlscale accept --spec node.yaml --out acceptance/ --format json\n\n
  dlscale accept --baseline tag:accept-20261125T101500-1a2b3c4d --warn-fails\n\n
  dlscale accept --reference ref:seed001-table5,system:SN-8xV100-16GB-SXM2\n\n
  srun --nodes 2 --ntasks-per-node 8 dlscale accept     # across nodes: collectives, links, every GPU alone, all GPUs\n\n
  dlscale accept --executor slurm --partition gpu --nodes 2 --gpus-per-node 8 --db postgresql://db.lab/dlscale\n\n
  dlscale accept --quick --emulate-nodes 3 --link-bandwidth 1gbit --node-link-bandwidth 2=100mbit\n\n
  dlscale accept verify accept-20261125T101500-1a2b3c4d/\n\n
  dlscale accept refs --model "H100 SXM"\n\n
  dlscale accept refs export --from kind:accept --out lab.yaml; dlscale accept --quick --refs lab.yaml\n\n
  dlscale accept judge accept-20261125T101500-1a2b3c4d --spec stricter.yaml"""

ACTIONS = ("verify", "judge", "refs")
ExecutorOpt = Annotated[str, typer.Option("--executor", help="local: run the suite on this machine; slurm: submit it "
                                                            "as one Slurm job, wait, judge here.")]
PartitionOpt = Annotated[Optional[str], typer.Option("--partition", help="Slurm: the partition (default: the "
                                                     "cluster's).", show_default=False)]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", help="Slurm: nodes in the job; the checks across nodes span "
                                                 "them (default 1).", show_default=False)]
GpusPerNodeOpt = Annotated[Optional[int], typer.Option("--gpus-per-node", help="Slurm: GPUs per node to ask for "
                                                       "(default none: a CPU node).", show_default=False)]
TimeOpt = Annotated[Optional[str], typer.Option("--time", help="Slurm: the job's time limit, minutes or [D-]H:MM[:SS] "
                                                "(default 30 with --quick, else 180).", show_default=False)]
DrainOpt = Annotated[bool, typer.Option("--drain-on-fail", help="On a FAIL or ERROR, drain this Slurm node (scontrol) "
                                        "with a one-line reason starting 'dlscale:'.")]
ResumeOpt = Annotated[bool, typer.Option("--resume-on-pass", help="On a pass, return this Slurm node to service if "
                                         "dlscale drained it (its reason starts 'dlscale:').")]


def accept(
    action: Annotated[Optional[str], typer.Argument(help="verify DIR: check an output folder against its manifest; "
                                                        "judge ID: judge a recorded acceptance again; refs [export]: "
                                                        "list or export healthy figures. Nothing: run the suite.",
                                                   show_default=False)] = None,
    target: Annotated[Optional[str], typer.Argument(help="After verify: the folder; after judge: the acceptance id; "
                                                        "after refs: export (or nothing: list).",
                                                   show_default=False)] = None,
    level: Annotated[Optional[int], typer.Option("--level", help="1: seconds, no load (GPU health with PCIe and "
                                                 "NVLink states, inventory: Slurm's health check); 2: minutes (the "
                                                 "quick suite); 3: everything (default), each within its budget.",
                                                 show_default=False)] = None,
    quick: Annotated[bool, typer.Option("--quick", help="--level 2: the few-minute subset (level 1, memory, GEMM, "
                                                        "collectives in the node, the short test alone and on all "
                                                        "devices, inference) at smaller sizes.")] = False,
    spec: Annotated[Optional[str], typer.Option("--spec", help="A YAML spec: checks, their sizes, thresholds "
                                                               "(docs/CLUSTER.md).", show_default=False)] = None,
    checks: Annotated[Optional[str], typer.Option("--checks", help="Only these checks (comma list) of the suite or "
                                                  "--spec, e.g. gemm,memory; burnin (the burn-in and silent data "
                                                  "corruption check, in no built-in suite) runs only when named.",
                                                  show_default=False)] = None,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="Compare with these runs, e.g. tag:ACCEPTANCE_ID "
                                                    "or run:ID (default: this system's last accepted figures).",
                                                    show_default=False)] = None,
    reference: Annotated[Optional[str], typer.Option("--reference", help="Reference figures, e.g. "
                                                     "ref:seed001-table5,system:SN-8xV100-16GB-SXM2 or tag:imported.",
                                                     show_default=False)] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", "-o", help="Folder for the report, JUnit XML, records and "
                                                   "manifest (default acceptances/ACCEPTANCE_ID beside the results "
                                                   "database); refs export: the file.",
                                                   show_default=False)] = None,
    refs: Annotated[Optional[str], typer.Option("--refs", help="A lab's healthy-figures file (from `dlscale accept "
                                                "refs export`), tried before the shipped table.",
                                                show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="refs: only the models whose label or device name "
                                                 "contains this, e.g. H100.", show_default=False)] = None,
    from_: Annotated[Optional[str], typer.Option("--from", help="refs export: the acceptances to export, a selector "
                                                 "such as kind:accept or system:HOST.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="refs export: replace --out if it exists (never a "
                                        "database).")] = False,
    warn_fails: Annotated[Optional[bool], typer.Option("--warn-fails/--warn-passes", help="Whether a WARN exits 1 like "
                                                       "a FAIL (default: the spec's warn_fails, else no).",
                                                       show_default=False)] = None,
    executor: ExecutorOpt = "local",
    partition: PartitionOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    time: TimeOpt = None,
    drain_on_fail: DrainOpt = False,
    resume_on_pass: ResumeOpt = False,
    emulate_nodes: EmulateOpt = None,
    link_bandwidth: BandwidthOpt = None,
    link_latency: LatencyOpt = None,
    node_link_bandwidth: NodeBandwidthOpt = None,
    node_cpu_quota: NodeQuotaOpt = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale import accept as acceptance

    emulated = {"emulate_nodes": emulate_nodes, "link_bandwidth": link_bandwidth, "link_latency": link_latency,
                "node_link_bandwidth": node_link_bandwidth or (), "node_cpu_quota": node_cpu_quota or ()}
    _check_args(action, target, running=quick or level is not None or drain_on_fail or resume_on_pass
                or checks is not None, slurm=executor != "local" or {partition, nodes, gpus_per_node, time} != {None},
                refs_only=bool(model or from_ or force), emulated=any(emulated.values()))
    if action == "refs":
        raise typer.Exit(_refs(target, model, from_, out_dir, refs, db, fmt, force))
    if action == "verify":
        raise typer.Exit(_verify(target, fmt))
    if action == "judge":
        acc = acceptance.judge(target, spec=spec, baseline=baseline, reference=reference, warn_fails=warn_fails,
                               out_dir=out_dir, db=db, refs=refs)
    else:
        acc = acceptance.run_suite(spec, quick=quick, level=level, drain_on_fail=drain_on_fail,
                                   resume_on_pass=resume_on_pass, baseline=baseline, reference=reference,
                                   warn_fails=warn_fails, out_dir=out_dir, db=db, executor=executor,
                                   partition=partition, nodes=nodes, gpus_per_node=gpus_per_node, time=time,
                                   refs=refs, checks=checks, **emulated)
    if acc is None:  # a rank other than 0 under a launcher: rank 0 prints
        return
    show(acc, fmt)
    raise typer.Exit(acc.exit_code)


def _check_args(action: str | None, target: str | None, *, running: bool, slurm: bool, refs_only: bool,
                emulated: bool) -> None:
    """One line and exit 2 for an argument or option that does not go with the action (or with running the suite)."""
    from dlscale.errors import UsageError

    if action is not None and running:
        raise UsageError(f"--level, --quick, --checks, --drain-on-fail and --resume-on-pass are for running the suite; "
                         f"`dlscale accept {action}` runs nothing")
    if action is not None and slurm:
        raise UsageError(f"--executor and its Slurm options are for running the suite; `dlscale accept {action}` "
                         "reads the store here")
    if action is not None and action not in ACTIONS:
        raise UsageError(f"unknown action {action!r}: `dlscale accept` runs the suite; `dlscale accept verify DIR` "
                         "or `dlscale accept judge ID`")
    if action == "refs":
        return
    if refs_only:
        raise UsageError("--model, --from and --force are for `dlscale accept refs`")
    if action is not None and not target:
        raise UsageError(f"`dlscale accept {action}` needs the {'folder' if action == 'verify' else 'acceptance id'}")
    if action is None and target:
        raise UsageError(f"unexpected argument {target!r}; the suite takes options only (see --help)")
    if action is not None and emulated:
        raise UsageError(f"`dlscale accept {action}` runs nothing: leave out --emulate-nodes and the link and "
                         "node options")


def show(acc: Any, fmt: Format) -> None:
    """The verdict table first (or the JSON document), then why, what did not run, and where the report is."""
    from dlscale.accept.outputs.artifacts import document
    from dlscale.accept.outputs.report import COLUMNS, cells
    from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, WARN, counts

    if fmt == Format.json:
        print_json(document(acc))
        return
    colour = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "ERROR": "bold magenta"}
    t = Table(*COLUMNS[:-1], title=f"dlscale accept {acc.id}: {acc.outcome}", title_justify="left")
    for v in acc.verdicts:
        row = cells(v)[:-1]
        row[3] = f"[{colour[v.status]}]{v.status}[/]" if v.status in colour else v.status
        t.add_row(*row)
    out.print(t)
    for v in acc.verdicts:
        if v.status in (FAIL, ERROR, WARN):
            where = f" on {v.subject}" if v.subject else ""
            out.print(f"{v.status} {v.check} {v.figure}{where}: {v.reason}", markup=False)
            for r in v.related:
                out.print(f"    related: {r}", markup=False)
    unexpected: dict[str, int] = {}
    for v in acc.verdicts:
        if v.status == NO_EXPECTATION:
            unexpected[v.reason] = unexpected.get(v.reason, 0) + 1
    for reason, n in unexpected.items():
        out.print(f"{NO_EXPECTATION} ({n} verdict{'' if n == 1 else 's'}): {reason}", markup=False)
    for check, why in acc.not_run:
        out.print(f"not run: {check}: {why}", markup=False)
    n = counts(acc.verdicts)
    out.print(f"{acc.outcome}: " + ", ".join(f"{k} {c}" for k, c in n.items())
              + (f"; report {acc.out_dir}/report.html" if acc.out_dir else ""), markup=False)


def _refs(target: str | None, model: str | None, from_: str | None, out_file: str | None, refs: str | None,
          db: str | None, fmt: Format, force: bool = False) -> int:
    """`dlscale accept refs`: the healthy figures as a table (or JSON); `refs export`: a lab's file."""
    from dlscale import accept as acceptance
    from dlscale.errors import UsageError

    if target not in (None, "export"):
        raise UsageError(f"`dlscale accept refs {target}`: refs lists the healthy figures; `refs export --from "
                         "SELECTOR --out FILE` writes a lab's own")
    if target == "export":
        if not from_ or not out_file:
            raise UsageError("`dlscale accept refs export` needs --from SELECTOR (e.g. kind:accept) and --out FILE")
        doc = acceptance.export_refs(from_, out_file, db, force)
        n = sum(len(m["rows"]) for m in doc["models"])
        if fmt == Format.json:
            print_json({"file": out_file, "models": len(doc["models"]), "rows": n, "document": doc})
        else:
            out.print(f"wrote {out_file}: {n} healthy figure(s) of {len(doc['models'])} model(s); judge with "
                      f"`dlscale accept --refs {out_file}`", markup=False)
        return 0
    if from_ or force:
        raise UsageError(f"{'--from' if from_ else '--force'} is for `dlscale accept refs export`")
    rows = acceptance.list_refs(model, refs)
    if fmt == Format.json:
        print_json([r.to_dict() for r in rows])
        return 0
    t = Table("model", "check", "figure", "healthy", "basis", "tolerance", "when", "source",
              title=f"healthy figures ({len(rows)} rows)", title_justify="left")
    for r in rows:
        t.add_row(r.model, r.check, r.figure, f"{r.value:g} {r.unit}", r.basis,
                  "" if r.tolerance is None else f"{r.tolerance:g}",
                  r.when_text, r.source + (f" <{r.url}>" if r.url else ""))
    out.print(t)
    if not rows:
        out.print(f"(no healthy figure of a model matching {model!r})", markup=False)
    return 0


def _verify(folder: str, fmt: Format) -> int:
    from dlscale import accept as acceptance

    good, problems = acceptance.verify(folder)
    if fmt == Format.json:
        print_json({"folder": folder, "matched": good, "problems": problems, "ok": not problems})
    else:
        for p in problems:
            out.print(f"{folder}: {p}", markup=False)
        out.print(f"{folder}: {good} file(s) match the manifest" + (f"; {len(problems)} problem(s)" if problems else ""),
                  markup=False)
    return 1 if problems else 0
