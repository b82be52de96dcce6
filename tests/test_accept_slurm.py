"""`dlscale accept --executor slurm`: the suite as one Slurm job through the sweep's executor.

The first tests need no Slurm: what is refused before submitting, what each node of the job runs,
a job that ended before its checks recorded, and a controller outage while waiting. The last one
submits a one-check spec to a real single-node Slurm (tests/slurmcluster.py; skipped without
slurm/munge unless DLSCALE_REQUIRE_SLURM=1) and judges it against a local acceptance of the same
node as its baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import accept_records as ar
from dlscale.accept.running import check_process as bounded
from dlscale.accept import acceptance as run
from dlscale.accept import slurm
from dlscale.accept.plan import spec
from dlscale.accept.plan import suite
from dlscale.errors import UsageError
from dlscale.store import Store
from dlscale.sweep import slurm as executor
from dlscale.sweep import squeue
from dlscale.sweep.squeue import JobState

GEMM = "name: tiny\nchecks:\n  gemm: {{shapes: {shapes}, precision: [fp32], iters: 5}}\n" \
       "thresholds: {{warn: 0.5, fail: 0.9}}\n"


@pytest.fixture
def sbatch_calls(tmp_path, monkeypatch):
    """An sbatch on PATH that only notes it was called: a refusal must come before it."""
    calls = tmp_path / "sbatch-called"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sbatch").write_text(f"#!/bin/sh\ntouch {calls}\nexit 1\n")
    (tmp_path / "bin" / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return calls


@pytest.mark.parametrize("args, expect", [
    (["--partition", "gpu"], "--partition is for --executor slurm; a local `dlscale accept` runs on this machine"),
    (["--executor", "pbs"], "unknown --executor 'pbs'; choose local (this machine) or slurm (one Slurm job)"),
    (["--executor", "slurm", "--nodes", "0"], "--nodes must be 1 or more, got 0"),
    (["--executor", "slurm", "--time", "soon"], "--time must be minutes (an integer >= 1) or [D-]H:MM[:SS], got 'soon'"),
    (["verify", "out", "--executor", "slurm"], "--executor and its Slurm options are for running the suite; "
                                               "`dlscale accept verify` reads the store here"),
    (["judge", "accept-1", "--nodes", "2"], "`dlscale accept judge` reads the store here"),
    (["--executor", "slurm", "--nodes", "2", "--spec", "{spec}"],
     "spec.yaml:4: checks.collectives_nodes.emulate_nodes: with --nodes 2 collectives_nodes runs on the allocation's "
     "2 nodes (torchrun on each): leave emulate_nodes out"),
    (["--executor", "slurm", "--spec", "{bad}"], "bad.yaml:2: checks.gemm.precision"),
])
def test_bad_combinations_are_one_line_before_anything_is_submitted(cli, db_path, tmp_path, sbatch_calls, args, expect):
    (tmp_path / "spec.yaml").write_text("checks:\n  gemm: {}\n  collectives_nodes:\n    emulate_nodes: 2\n")
    (tmp_path / "bad.yaml").write_text("checks:\n  gemm: {precision: [fp99]}\n")
    r = cli("accept", *[a.format(spec=tmp_path / "spec.yaml", bad=tmp_path / "bad.yaml") for a in args])
    assert r.code == 2 and expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not sbatch_calls.exists()


def test_the_acceptance_job_asks_for_whole_nodes_and_its_step_for_all_of_them(tmp_path, monkeypatch):
    from submitit.slurm.slurm import _make_sbatch_string

    seen = {}

    def submit(folder, params, fn, what):
        seen.update(params)
        raise UsageError("stop here")

    monkeypatch.setattr(executor, "submit", submit)
    monkeypatch.setattr(slurm.shutil, "which", lambda cmd: "/usr/bin/" + cmd)
    sp = spec.Spec.from_dict({"name": "g", "checks": {"gemm": {}}})
    with pytest.raises(UsageError, match="stop here"):
        slurm.accept_on_slurm(sp, slurm.options("slurm", gpus_per_node=8), db=str(tmp_path / "r.db"))
    assert (seen["exclusive"], seen["mem"], seen["srun_args"], seen["gpus_per_node"]) == (True, "0", ["--whole"], 8)
    script = _make_sbatch_string(command="python -m submitit.core._submit X", folder=tmp_path / "%j", **seen)
    lines = script.splitlines()
    assert "#SBATCH --exclusive" in lines and "#SBATCH --mem=0" in lines  # every CPU and all memory of each node
    assert " --whole " in next(ln for ln in lines if ln.startswith("srun "))  # the task's step gets all of it


def test_each_node_of_a_job_runs_the_checks_across_nodes_then_its_own(tmp_path, monkeypatch):
    sp = spec.Spec("two", {"gemm": {}, "train_alone": {}, "memory": {}, "train": {}})
    assert [(name, list(part.checks)) for name, part in slurm.parts(sp, 2)] == [
        ("across", ["train_alone", "train"]), ("node", ["gemm", "memory"])]
    assert [(name, list(part.checks)) for name, part in slurm.parts(sp, 1)] == [
        ("all", ["gemm", "train_alone", "memory", "train"])]
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"spec": sp.to_dict()}))
    ran = []
    monkeypatch.setattr(slurm, "_part", lambda cmd, env, limit: ran.append((cmd, env, limit)) or 0)
    for k, v in {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
                 "SLURM_STEP_ID": "0"}.items():
        monkeypatch.setenv(k, v)
    slurm.AcceptJob(str(job_file), nodes=2, ranks_per_node=8)()
    (across, env, limit), (node, _, no_limit) = ran
    assert limit == sp.time_limit("train_alone") + sp.time_limit("train") + bounded.GRACE_S and no_limit is None
    assert across[1:] == ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend",
                          "c10d", "--rdzv-endpoint", "gpu07:30735", "--rdzv-id", "dlscale-1234",
                          "-m", "dlscale.accept.slurm", str(job_file), "across"]
    assert node[1:] == ["-m", "dlscale.accept.slurm", str(job_file), "node"]
    assert "SLURM_PROCID" not in env and env["SLURM_NODEID"] == "1"  # dlscale launches its own ranks, as on a workstation


def _rdzv_job_id() -> int:
    """A Slurm job id whose rendezvous port (``sweep.slurm.torchrun_on_node``) is free here."""
    import socket

    for job_id in range(os.getpid() % 15000, 20000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", executor.RDZV_PORT_BASE + 1 + job_id))
                return job_id
            except OSError:
                continue
    pytest.skip("no free port for torchrun's rendezvous")


@pytest.mark.slow
@pytest.mark.long
def test_two_nodes_run_the_checks_across_them_as_one_job_then_each_its_own(db_path, tmp_path):
    # the job's two tasks, started as srun starts them (one per node; both nodes are this host here)
    shapes = tmp_path / "g.csv"
    shapes.write_text("m,n,k,a_t,b_t\n64,64,64,0,0\n")
    sp = spec.Spec("two", {"gemm": {"shapes": str(shapes), "precision": ["fp32"], "iters": 3},
                           "train_alone": {"model": "tinycnn", "image_size": 16, "batch_size": 4, "steps": 3,
                                           "warmup_steps": 1, "breakdown_steps": 0, "monitor_interval": 0}})
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"acceptance": "accept-two", "spec": sp.to_dict(), "quick": False,
                                    "db": str(db_path), "nodes": 2}))
    env = {**os.environ, "SLURM_JOB_ID": str(_rdzv_job_id()), "SLURM_JOB_NODELIST": "localhost", "SLURM_PROCID": "0",
           "SLURM_STEP_ID": "0", "OMP_NUM_THREADS": "1"}
    code = f"from dlscale.accept.slurm import AcceptJob; AcceptJob({str(job_file)!r}, 2, 1)()"
    tasks = [subprocess.Popen([sys.executable, "-c", code], env={**env, "SLURM_NODEID": str(n)}, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    try:
        errs = [t.communicate(timeout=300)[1] for t in tasks]
    finally:
        for t in tasks:
            if t.poll() is None:
                os.killpg(t.pid, 9)
                t.wait()
    assert [t.returncode for t in tasks] == [0, 0], errs[0][-2000:] + errs[1][-2000:]
    ran = slurm.read_plans(tmp_path, sp, nodes=2)  # the first node's plans, one per part
    assert [p.check for p in ran.plan.checks] == ["gemm", "train_alone"] and ran.complete
    with Store.open(db_path) as s:
        runs = s.query(tag="accept-two")
    alone = [r for r in runs if r.kind == "train"]
    assert len(alone) == 1 and alone[0].metrics["world_size"] == 2  # one job across both nodes, rank 0 records
    assert {d["node"] for d in alone[0].raw["rank_devices"]} == {0, 1}
    assert sorted(r.workload for r in runs if r.kind == "micro") == ["gemm", "gemm"]  # each node its own


def test_a_job_slurm_ended_fails_every_check_it_did_not_record(tmp_path):
    plan = suite.Plan([suite.PlannedCheck(c, {}, []) for c in ("health", "gemm", "train")], [], suite.MachineFacts())
    records = [ar.health(), ar.gemm()]
    js = JobState("42", "TIMEOUT", "TimeLimit", "00:30:00")
    missing = slurm.unrecorded(plan, records, js, slurm.job_failure(js, "/nowhere", 1))
    assert missing == {"train": "no run recorded: Slurm job 42 TIMEOUT: ran past its time limit (00:30:00) and was "
                                "killed by Slurm; reason TimeLimit"}
    verdicts = run.judge(records, spec.builtin(False), missing=missing)
    (fail,) = [v for v in verdicts if v.check == "train"]
    assert fail.status == "ERROR" and fail.reason == missing["train"]  # nothing measured: fails closed
    # every check recorded but one node's task failed: the job itself is the FAIL
    js = JobState("43", "FAILED", "NonZeroExitCode")
    done = suite.Plan([suite.PlannedCheck("gemm", {}, [])], [], suite.MachineFacts())
    assert slurm.unrecorded(done, records, js, slurm.job_failure(js, "/nowhere", 2)) == {
        slurm.JOB_CHECK: "Slurm job 43 FAILED (NonZeroExitCode)"}
    # two nodes, ended during the checks across them: the per-node part never planned, yet was to run
    (tmp_path / "plan-across.json").write_text(json.dumps({"checks": {"train": {"steps": 50}}, "system": "gpu[07-08]",
                                                           "not_run": [["train_alone", "why"]], "host": "gpu07"}))
    sp = spec.Spec("two", {"gemm": {"iters": 5}, "train_alone": {}, "train": {}})
    ran = slurm.read_plans(tmp_path, sp, nodes=2)
    assert [(p.check, p.options) for p in ran.plan.checks] == [("gemm", {"iters": 5}), ("train", {"steps": 50})]
    assert ran.plan.not_run == [("train_alone", "why")] and (ran.system, ran.host, ran.complete) == (
        "gpu[07-08]", "gpu07", False)
    assert set(slurm.unrecorded(ran.plan, [], js, "Slurm job 43 TIMEOUT")) == {"gemm", "train"}


def test_waiting_through_a_controller_outage_says_when_it_begins_and_ends(db_path, monkeypatch, capsys):
    down = JobState("41", "", unreachable="slurm_load_jobs error: Unable to contact slurm controller")
    answers = [{"41": JobState("41", "RUNNING")}, {"41": down}, {"41": down}, {"41": JobState("41", "COMPLETED")}]

    def job_states(ids):
        if len(answers) == 2:  # a check finishes while the controller is down, and records itself
            with Store.open(db_path) as s:
                s.insert(ar.gemm())
        return answers.pop(0)

    monkeypatch.setattr(squeue, "job_states", job_states)
    monkeypatch.setenv(squeue.POLL_ENV, "0")
    with Store.open(db_path) as store:
        state = slurm._wait(store, "acc", "41")
    err = capsys.readouterr().err
    assert state.state == "COMPLETED" and not answers
    assert err.count("Slurm does not answer (slurm_load_jobs error: Unable to contact slurm controller)") == 1
    assert err.count("Slurm answers again") == 1
    assert "Slurm job 41 RUNNING" in err and "recorded gemm: micro gemm ok on gpu-node-07" in err


@pytest.mark.slow
@pytest.mark.long
def test_a_slurm_acceptance_records_its_runs_and_judges_them_as_a_local_one(slurm_cluster, db_path, tmp_path):
    shapes = tmp_path / "g.csv"
    shapes.write_text("m,n,k,a_t,b_t\n256,256,256,0,0\n")
    sp_file = tmp_path / "tiny.yaml"
    sp_file.write_text(GEMM.format(shapes=shapes))
    from dlscale import accept

    local = accept.run_suite(str(sp_file), out_dir=str(tmp_path / "local"))  # this node's first acceptance: the baseline
    env = {**os.environ, **slurm_cluster.env(), squeue.POLL_ENV: "1"}
    r = subprocess.run([sys.executable, "-m", "dlscale.cli.app", "accept", "--executor", "slurm", "--time", "5",
                        "--spec", str(sp_file), "--out", str(tmp_path / "out"), "--format", "json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    acc = doc["acceptance_id"]
    assert f"acceptance {acc} is Slurm job" in r.stderr and "RUNNING" in r.stderr and "recorded gemm" in r.stderr
    job_id = r.stderr.split(f"acceptance {acc} is Slurm job ")[1].split()[0]
    job = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env).stdout
    node = subprocess.run(["scontrol", "show", "node"], capture_output=True, text=True, env=env).stdout
    # the job was given the node's every CPU (exclusive), not the one CPU of a task
    assert f"NumCPUs={slurm_cluster.cpus} " in job and f"CPUTot={slurm_cluster.cpus} " in node, job
    (v,) = doc["verdicts"]  # judged against the local acceptance of the same node and suite (wide thresholds:
    assert v["status"] != "FAIL" and v["expectation"] == "baseline" and local.id in v["source"]  # a shared CPU)
    with Store.open(db_path) as s:
        runs = s.query(tag=acc)
    assert sorted(x.kind for x in runs) == ["accept", "micro"]
    assert next(x for x in runs if x.kind == "accept").config["system"] == local.record.config["system"]
    assert accept.verify(str(tmp_path / "out"))[1] == []
