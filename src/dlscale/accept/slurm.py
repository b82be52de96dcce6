"""``dlscale accept --executor slurm``: the whole acceptance suite as one Slurm job, through the sweep's executor.

The submitter (a login node) checks what it can before submitting: the spec (``file:line``), every
check's options on a node of the allocation's shape (``--gpus-per-node`` GPUs, else a CPU node),
the combinations the allocation rules out, the baseline and reference selectors, the store. It
then submits one job through ``sweep.slurm`` (submitit; one task per node; the nodes exclusive with
all their CPUs and memory, and the task's step given all of it with ``srun --whole``, since an
acceptance measures them whole) named ``dlscale-accept-<id>``, waits for it with the
sweep's wait loop (``sweep.squeue``; a controller outage is waited through and said once when it
begins and once when it ends), saying on stderr where the job stands and each run as it is recorded, and then
judges the runs recorded under the acceptance id and writes the outputs as a local ``dlscale
accept`` does (``acceptance.conclude``). Ctrl-C cancels the job.

In the job each node's task runs the suite's parts with srun's step variables hidden, so dlscale
starts its own ranks as on a workstation:

- one node: the whole suite, as ``dlscale accept`` runs it there (part ``all``);
- several nodes: first the checks across the nodes (collectives between them, the short test on
  every device of the allocation alone and on all of them; part ``across``) as the ranks of
  torchrun on every node with c10d rendezvous on the first (``sweep.slurm.torchrun_on_node``),
  each rank running its checks in place as under srun; then the per-node checks on every node at
  once (part ``node``), each node's runs carrying its host, so that the judging names the node of
  every per-node verdict (``collect.node_hosts``).

A part is ``python -m dlscale.accept.slurm JOB_FILE PART`` (the job file: the acceptance id, the
spec, ``--quick``, the store, the node count), and the first node's part writes what it planned
(``plan-PART.json``: each check's options, the checks that cannot run there and why, the system)
beside the job's logs. On a node each check runs in its own process within its time limit, as a
local ``dlscale accept`` runs it (``acceptance.run_bounded``), and a check that did not finish is written
into ``problems-PART-NODE.json``; the checks across the nodes, in place in torchrun's ranks, are
bounded together by their limits summed. A planned check that recorded no run (the job ended first:
its time limit, scancel, a crash), or that a node says did not finish, is an ERROR naming why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.accept.figures import collect
from dlscale.accept.plan import spec as specs, suite
from dlscale.accept.running import check_process
from dlscale.errors import UsageError
from dlscale.log import info
from dlscale.procs import die_with_parent, end_tree
from dlscale.record import RunRecord
from dlscale.sweep.slurmspec import SlurmOptions, minutes

JOB_PREFIX = "dlscale-accept-"
MODULE = "dlscale.accept.slurm"
DEFAULT_TIME_MIN = {True: 30, False: 180}  # --quick, the full suite: the job's limit unless --time says
# what the allocation itself sets for the checks across its nodes: a spec that sets them is refused
SET_BY_ALLOCATION = ("emulate_nodes", "nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port")
PART_NAMES = {"all": "the suite", "across": "the checks across the nodes", "node": "the per-node checks"}
JOB_CHECK = "slurm job"  # the verdict of a job that failed while every planned check recorded a run


def options(executor: str, partition: str | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
            time: str | int | None = None) -> SlurmOptions | None:
    """The job's resources for ``--executor slurm`` (None: the local executor); a bad value or a Slurm
    option without ``--executor slurm`` is one UsageError."""
    given = [f for f, v in (("--partition", partition), ("--nodes", nodes), ("--gpus-per-node", gpus_per_node),
                            ("--time", time)) if v is not None]
    if executor not in ("local", "slurm"):
        raise UsageError(f"unknown --executor {executor!r}; choose local (this machine) or slurm (one Slurm job)")
    if executor == "local":
        if given:
            raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --executor slurm; a local "
                             "`dlscale accept` runs on this machine (add --executor slurm to submit the suite)")
        return None
    if nodes is not None and nodes < 1:
        raise UsageError(f"--nodes must be 1 or more, got {nodes}")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node must be 0 or more, got {gpus_per_node}")
    try:
        time_min = minutes(time) if time is not None else None
    except ValueError as e:
        raise UsageError(f"--time {e}") from None
    return SlurmOptions(partition=partition, nodes=nodes or 1, gpus_per_node=gpus_per_node or None, time_min=time_min)


# -- what runs where ----------------------------------------------------------------------------------

def parts(sp: specs.Spec, nodes: int) -> list[tuple[str, specs.Spec]]:
    """The job's parts in the order they run, each with the spec of its checks (a part without checks
    is left out): one node runs ``all``; several run ``across`` (one job over the nodes) then ``node``."""
    if nodes == 1:
        return [("all", sp)]
    across = sp.only(suite.RUN_IN_PLACE)
    node = sp.only(c for c in sp.checks if c not in suite.RUN_IN_PLACE)
    return [(name, part) for name, part in (("across", across), ("node", node)) if part.checks]


def stand_in(part: str, opts: SlurmOptions) -> suite.MachineFacts:
    """A node of the allocation as the submitter pictures it (GPUs as asked), for checking the spec
    before submitting; in the job each part plans on the real node."""
    gpus = int(opts.gpus_per_node or 0)
    if part == "across":
        return suite.MachineFacts(gpus=gpus, launcher="torchrun", world_size=opts.nodes * max(1, gpus), nodes=opts.nodes)
    return suite.MachineFacts(gpus=gpus)


def check(sp: specs.Spec, quick: bool, opts: SlurmOptions) -> None:
    """Refuse, before submitting, a spec that cannot run on the allocation: a bad option value (at its
    ``file:line``), what the allocation sets itself, or no check that can run there."""
    if opts.nodes > 1:
        for name in suite.RUN_IN_PLACE:
            bad = next((k for k in sp.checks.get(name, {}) if k in SET_BY_ALLOCATION), None)
            if bad:
                raise sp.fail(("checks", name, bad), f"with --nodes {opts.nodes} {name} runs on the allocation's "
                                                     f"{opts.nodes} nodes (torchrun on each): leave {bad} out")
    runnable, not_run = [], []
    for part, part_spec in parts(sp, opts.nodes):
        plan = suite.plan(part_spec, quick, stand_in(part, opts))
        runnable += [p.check for p in plan.checks]
        not_run += plan.not_run
    if not runnable:
        raise UsageError(f"no check of the spec can run on {opts.nodes} node(s) with "
                         f"{opts.gpus_per_node or 0} GPU(s) each: " + "; ".join(f"{c}: {w}" for c, w in not_run))


# -- in the job ------------------------------------------------------------------------------------------

@dataclass
class AcceptJob:
    """What each task of the acceptance's job runs (pickled by submitit): the suite's parts on this node."""

    job_file: str
    nodes: int
    ranks_per_node: int  # the ranks of the checks across nodes: one per GPU, else one

    def __call__(self) -> dict[str, Any]:
        from dlscale.sweep.slurm import STEP_VARS, torchrun_on_node

        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # not checkpointable: it runs on until it ends or Slurm ends it
        sp = specs.Spec.from_dict(json.loads(Path(self.job_file).read_text())["spec"])
        env = {k: v for k, v in os.environ.items() if k not in STEP_VARS}
        failed = []
        for part, part_spec in parts(sp, self.nodes):
            launcher = (torchrun_on_node(self.nodes, self.ranks_per_node, env) if part == "across"
                        else [sys.executable])
            # the checks across the nodes run in place in torchrun's ranks: bounded together, by their limits summed
            limit = sum(part_spec.time_limit(c) for c in part_spec.checks) + check_process.GRACE_S if part == "across" \
                else None
            code = _part([*launcher, "-m", MODULE, self.job_file, part], env, limit)
            if code is None:
                failed.append(f"{PART_NAMES[part]} ran past their summed time limits ({limit:g} s) and were killed")
            elif code:
                failed.append(f"{PART_NAMES[part]} exited with {code}")
        if failed:
            raise RuntimeError(f"node {os.environ.get('SLURM_NODEID', '0')}: {'; '.join(failed)}")
        return {"node": os.environ.get("SLURM_NODEID", "0")}


def _part(cmd: list[str], env: dict[str, str], limit_s: float | None) -> int | None:
    """Run one part's process to its end, or past ``limit_s`` end it with its tree; its exit code (None: ended)."""
    proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent(), start_new_session=limit_s is not None)
    try:
        return proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        end_tree(proc.pid, check_process.GRACE_S)
        proc.wait()
        return None


def run_part(job_file: str, part: str) -> None:
    """One part of the suite on this node (or as this rank): plan it here, write the plan (first node,
    rank 0), run its checks under the acceptance id: on a node, each in its own process within its
    time limit (``acceptance.run_bounded``) and holding the host's acceptance lock, writing why a check did
    not finish into ``problems-PART-NODE.json``; as a rank, in place."""
    from dlscale.accept import acceptance
    from dlscale.distributed.env import detect, launcher_of

    doc = json.loads(Path(job_file).read_text())
    sp = dict(parts(specs.Spec.from_dict(doc["spec"]), doc["nodes"]))[part]
    plan = suite.plan(sp, doc["quick"])
    env = detect() if launcher_of() else None
    node = os.environ.get("SLURM_NODEID", "0")
    if (env.rank if env else int(node)) == 0:
        _write_plan(Path(job_file).parent / f"plan-{part}.json", plan, doc["nodes"])
    info(f"dlscale accept {doc['acceptance']} ({part}): checks {', '.join(p.check for p in plan.checks) or 'none'}")
    if env is not None:
        for p in plan.checks:
            suite.run_check(p, doc["acceptance"], doc["db"])
        return
    with acceptance.host_lock(doc["acceptance"]):
        _, problems, _ = acceptance.run_bounded(plan.checks, sp, doc["acceptance"], doc["db"])
    if problems:
        from dlscale.system import collect_cached

        host = collect_cached().get("hostname") or f"node {node}"
        path = Path(job_file).parent / f"problems-{part}-{node}.json"
        path.write_text(json.dumps({c: f"{host}: {why}" if doc["nodes"] > 1 else why for c, why in problems.items()}))


def read_problems(folder: Path) -> dict[str, str]:
    """Check -> why it did not finish, from every node's ``problems-*.json`` (``run_part``)."""
    out: dict[str, str] = {}
    for path in sorted(folder.glob("problems-*.json")):
        for check, why in json.loads(path.read_text()).items():
            out[check] = f"{out[check]}; {why}" if check in out else why
    return out


def _write_plan(path: Path, plan: suite.Plan, nodes: int) -> None:
    from dlscale.system import collect_cached

    system = (collect_cached().get("hostname") or "?") if nodes == 1 else os.environ.get("SLURM_JOB_NODELIST", "?")
    doc = {"checks": {p.check: p.options for p in plan.checks}, "not_run": plan.not_run, "system": system,
           "host": collect_cached().get("hostname")}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    """``python -m dlscale.accept.slurm JOB_FILE PART``: a part of a Slurm acceptance (the job runs it)."""
    try:
        run_part(*argv)
    except UsageError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


# -- the submitter ---------------------------------------------------------------------------------------

def accept_on_slurm(sp: specs.Spec, opts: SlurmOptions, *, quick: bool = False, baseline: str | None = None,
                    reference: str | None = None, out_dir: str | None = None, db: str | None = None,
                    healthy: str | None = None) -> Any:
    """Check, submit, wait for and judge the suite as one Slurm job (the module doc); an ``Acceptance``."""
    from dlscale.accept import acceptance
    from dlscale.distributed.env import launcher_of
    from dlscale.store import Store
    from dlscale.sweep import slurm

    check(sp, quick, opts)
    if launcher_of():
        raise UsageError(f"--executor slurm submits the suite from a login node; this process is a rank of "
                         f"{launcher_of()}: run `dlscale accept` without a launcher, or drop --executor slurm")
    if shutil.which("sbatch") is None:
        raise UsageError("--executor slurm needs Slurm's client commands (sbatch not on PATH): run it on a login "
                         "node of the cluster")
    vs = acceptance.against(baseline, reference, db, healthy)
    acc_id = acceptance.new_acceptance_id()
    with Store.open(db) as store:
        folder = acceptance.default_out(store, acc_id)
        folder.mkdir(parents=True, exist_ok=True)
        job_file = folder / "job.json"
        job_file.write_text(json.dumps({"acceptance": acc_id, "spec": sp.to_dict(), "quick": quick,
                                        "db": str(store.path), "nodes": opts.nodes}, indent=1, default=str))
        params = slurm.resources(JOB_PREFIX + acc_id, opts.nodes, opts.time_min or DEFAULT_TIME_MIN[quick], opts,
                                 opts.gpus_per_node, whole_node=True)  # an acceptance measures whole nodes
        job = AcceptJob(str(job_file), opts.nodes, int(opts.gpus_per_node or 1))
        job_id = slurm.submit(folder, params, job, f"the acceptance job of {acc_id}")
        info(f"dlscale accept {sp.name}: acceptance {acc_id} is Slurm job {job_id} ({opts.nodes} node(s), "
             f"{params['time']} min); waiting for it (Ctrl-C cancels it)")
        state = _wait(store, acc_id, job_id)
        records = [r for r in store.query(tag=acc_id, newest_first=False) if r.kind != "accept"]
    ran = read_plans(folder, sp, opts.nodes)
    if ran.complete and not ran.plan.checks:
        raise UsageError("no check of the spec can run on the allocation: "
                         + "; ".join(f"{c}: {w}" for c, w in ran.plan.not_run))
    missing = {**unrecorded(ran.plan, records, state, job_failure(state, str(folder), opts.nodes)),
               **read_problems(folder)}
    inventory = next((r.system for r in records if (r.system or {}).get("hostname") == ran.host), None)
    return acceptance.conclude(acc_id, sp, ran.plan, records, ran.system, vs, out_dir, db, missing,
                        inventory or {"hostname": ran.host or ran.system})


def _wait(store: Any, acc_id: str, job_id: str) -> Any:
    """Wait for the job (the sweep's loop), saying where it stands and each run it records; its last
    state. Ctrl-C cancels the job."""
    from dlscale.sweep.squeue import wait_for_jobs

    ended: dict[str, Any] = {}
    progress = _Progress(store, acc_id, job_id)
    try:
        wait_for_jobs({acc_id: job_id}, lambda _key, js: ended.update(state=js), progress)
    except KeyboardInterrupt:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
        info(f"cancelled Slurm job {job_id}; its runs so far stay in the store under {acc_id}")
        raise
    progress(None)  # the runs recorded since the last look
    info(f"Slurm job {job_id} {ended['state'].state}")
    return ended["state"]


class _Progress:
    """On stderr: the job's state when it changes, then each run as the store receives it."""

    def __init__(self, store: Any, acc_id: str, job_id: str):
        self.store, self.acc_id, self.job_id = store, acc_id, job_id
        self.state, self.seen = "", set()

    def __call__(self, states: dict[str, Any] | None) -> None:
        js = (states or {}).get(self.job_id)
        if js is not None and js.state and js.phase != "ended" and js.state != self.state:
            self.state = js.state
            why = f" ({js.reason})" if js.phase == "queued" and js.reason not in ("", "None") else ""
            info(f"Slurm job {self.job_id} {js.state}{why}")
        recs = [r for r in self.store.query(tag=self.acc_id, newest_first=False) if r.run_id not in self.seen]
        rungs = collect.scale_rungs(recs)
        for r in recs:
            self.seen.add(r.run_id)
            host = (r.system or {}).get("hostname")
            info(f"  recorded {collect.check_of(r, rungs) or r.kind}: {r.kind} {r.workload} {r.status}"
                 f"{' on ' + host if host else ''} (run {r.run_id})")


@dataclass
class JobPlan:
    """What the job's parts planned (``read_plans``)."""

    plan: suite.Plan  # the checks that were to run, with their options, and those that could not
    system: str  # what the acceptance's baseline is looked up by: the node's hostname, else the job's node list
    host: str | None  # the first node: its runs' inventory is the acceptance's
    complete: bool  # every part got as far as planning


def read_plans(folder: Path, sp: specs.Spec, nodes: int) -> JobPlan:
    """What the job's parts planned, merged in the spec's order. The checks of a part that never got as
    far as planning are listed with the spec's options: they were to run, and recorded nothing."""
    checks: dict[str, dict[str, Any]] = {}
    not_run: dict[str, str] = {}
    docs = []
    for part, part_spec in parts(sp, nodes):
        path = folder / f"plan-{part}.json"
        if not path.exists():
            checks.update({c: dict(o) for c, o in part_spec.checks.items()})
            continue
        docs.append(json.loads(path.read_text()))
        checks.update(docs[-1]["checks"])
        not_run.update({c: w for c, w in docs[-1]["not_run"] if c not in docs[-1]["checks"]})
    plan = suite.Plan([suite.PlannedCheck(c, checks[c], []) for c in sp.checks if c in checks],
                      [(c, not_run[c]) for c in sp.checks if c in not_run and c not in checks], suite.MachineFacts())
    return JobPlan(plan, docs[0]["system"] if docs else "?", docs[0]["host"] if docs else None,
                   len(docs) == len(parts(sp, nodes)))


def job_failure(js: Any, folder: str, nodes: int) -> str | None:
    """Why the job did not complete (None: it did): Slurm's reason, else the last error a node's task
    logged, with its log."""
    from dlscale.sweep.driver import last_line
    from dlscale.sweep.slurm import log_tail
    from dlscale.sweep.squeue import ENDED_BY_SLURM, slurm_reason

    if js.state == "COMPLETED":
        return None
    if js.state in ENDED_BY_SLURM:
        return slurm_reason(js)
    for task in range(nodes):
        tail = log_tail(folder, js.job_id, task)
        if tail.strip():
            return f"Slurm job {js.job_id} {js.state}: {last_line(tail)} (log {folder}/{js.job_id}_{task}_log.err)"
    reason = f" ({js.reason})" if js.reason and js.reason not in ("None", "(null)") else ""
    return f"Slurm job {js.job_id} {js.state}{reason}"


def unrecorded(plan: suite.Plan, records: list[RunRecord], js: Any, failure: str | None) -> dict[str, str]:
    """Check -> why, for every planned check that recorded no run; where the job failed although each
    recorded one (a node of several died), the job itself (``JOB_CHECK``)."""
    rungs = collect.scale_rungs(records)
    recorded = {collect.check_of(r, rungs) for r in records}
    why = failure or f"Slurm job {js.job_id} {js.state} without recording it"
    missing = {p.check: f"no run recorded: {why}" for p in plan.checks if p.check not in recorded}
    if failure and not missing:
        missing[JOB_CHECK] = failure
    return missing


if __name__ == "__main__":
    from dlscale import importguard

    importguard.install()  # a Ctrl-C or SIGTERM during torch's first import is delivered after it, not lost
    # Leave without the interpreter's teardown, as a rank does (distributed/rank.py): the checks across
    # the nodes ran in place in this process, and C++ destructors of gloo's threads at exit can abort
    # it ("terminate called without an active exception", SIGABRT) after every check recorded; its
    # torchrun then fails, and the other nodes' torchruns wait out their exit barrier.
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
