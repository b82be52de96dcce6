"""dlscale sweep --executor slurm: the slurm: block, the job scripts, and sweeps on a real single-node Slurm.

The first tests need nothing but submitit: a file's slurm: block as job parameters and as the
sbatch script submitit writes, torchrun's command line on a multi-node job, bad blocks at their
line, and the recording of a job Slurm ended. The rest start a real Slurm (munged, slurmctld,
slurmd on this machine; tests/slurmcluster.py) once per session: a two-point sweep where one point
runs past its one-minute time limit (recorded failed with TIMEOUT), and a submitter killed
mid-submission whose ``--resume`` submits only the point it had not submitted. Without the
binaries they skip, unless DLSCALE_REQUIRE_SLURM=1 (as .ci/run sets), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_until

from dlscale.errors import UsageError
from dlscale.store import Store
from dlscale.sweep import slurm, spec, squeue
from dlscale.sweep.state import open_state

TINY = "fixed: {model: tinycnn, image_size: 32, warmup_steps: 1, steps: 2}\n"


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_the_slurm_block_becomes_the_job_parameters_and_sbatch_script(tmp_path):
    from submitit.slurm.slurm import _make_sbatch_string

    text = ("name: big\n" + TINY + "slurm:\n  partition: gpu\n  nodes: 2\n  gpus_per_node: auto\n"
            "  cpus_per_task: 16\n  time: '1:30:20'\n  account: proj42\n  constraint: h100\n  mem: 500G\n"
            "  setup: [module load cuda]\nmatrix:\n  nproc_per_node: [4, 8]\n")
    sw = spec.load(_write(tmp_path, text))
    p4 = sw.points[0]
    params = slurm.job_parameters(p4, sw.slurm)
    assert params == {"job_name": f"dlscale-{p4.hash}", "nodes": 2, "ntasks_per_node": 1, "time": 91,  # 20 s round up
                      "partition": "gpu", "cpus_per_task": 16, "account": "proj42", "constraint": "h100",
                      "mem": "500G", "gpus_per_node": 4, "setup": ["module load cuda"], "srun_args": ["--whole"],
                      "additional_parameters": {"no_requeue": True}}
    assert slurm.job_parameters(sw.points[1], sw.slurm)["gpus_per_node"] == 8  # auto: one GPU per rank
    script = _make_sbatch_string(command="python -m submitit.core._submit X", folder=tmp_path / "%j", **params)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4", "#SBATCH --time=91",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj42", "#SBATCH --constraint=h100",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --mem=500G", f"#SBATCH --job-name=dlscale-{p4.hash}",
                 "#SBATCH --no-requeue", "module load cuda"):
        assert line in script.splitlines(), (line, script)
    assert "srun --unbuffered" in script  # one task per node: torchrun on every node
    srun = next(ln for ln in script.splitlines() if ln.startswith("srun "))
    assert " --whole " in srun  # the task's step gets the job's 16 CPUs per node, not one
    # no slurm.time: the point's timeout_per_run (1800 s = 30 min) plus a minute, so the point's own timeout fires first
    plain = spec.load(_write(tmp_path, "name: p\n" + TINY + "slurm: {partition: cpu}\nmatrix:\n  batch_size: [4]\n", "p.yaml"))
    assert slurm.job_parameters(plain.points[0], plain.slurm) == {
        "job_name": f"dlscale-{plain.points[0].hash}", "nodes": 1, "ntasks_per_node": 1, "time": 31, "partition": "cpu",
        "srun_args": ["--whole"], "additional_parameters": {"no_requeue": True}}


def test_a_multi_node_point_starts_torchrun_with_c10d_on_the_first_node(tmp_path):
    sw = spec.load(_write(tmp_path, "name: mn\n" + TINY + "slurm: {nodes: 2}\nmatrix:\n  nproc_per_node: [4]\n"))
    (p,) = sw.points
    env = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    prefix = slurm.torchrun_prefix(p, 2, env)
    assert prefix[1:] == ["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend",
                          "c10d", "--rdzv-endpoint", "gpu07:30735", "--rdzv-id", "dlscale-1234", "-m", "dlscale.cli.app"]
    argv = slurm.point_argv(p, 2)  # slurm.nodes set the node count: the ranks must be told
    assert argv[:2] == ["train", "tinycnn"] and argv[-2:] == ["--nnodes", "2"] and "--nproc-per-node" in argv


@pytest.mark.parametrize("block, expect", [
    ("slurm:\n  partion: gpu\n", "sweep.yaml:4: slurm.partion: unknown field 'partion'"),
    ("slurm:\n  nodes: 0\n", "sweep.yaml:4: slurm.nodes: must be an integer >= 1, got 0"),
    ("slurm:\n  time: soon\n", "sweep.yaml:4: slurm.time: must be minutes (an integer >= 1) or [D-]H:MM[:SS]"),
    ("slurm:\n  gpus_per_node: -1\n", "sweep.yaml:4: slurm.gpus_per_node: must be an integer >= 0 or auto"),
    ("slurm: [gpu]\n", "sweep.yaml:3: slurm: must be a mapping"),
    ("slurm:\n  nodes: 2\ninclude:\n  - {nnodes: 3}\n", "sweep.yaml:4: slurm.nodes: is 2 but point 2 sets nnodes 3"),
])
def test_bad_slurm_blocks_give_one_line_naming_the_place(tmp_path, block, expect):
    with pytest.raises(UsageError) as e:
        spec.load(_write(tmp_path, "name: t\n" + TINY + block + "matrix:\n  batch_size: [4]\n"))
    assert expect in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_time_limits_in_slurm_formats_are_whole_minutes(tmp_path):
    sw = spec.load(_write(tmp_path, "name: t\n" + TINY + "slurm: {time: '1-02:03:30'}\nmatrix:\n  batch_size: [4]\n"))
    assert sw.slurm.time_min == 1 * 1440 + 2 * 60 + 3 + 1


def test_a_job_slurm_ended_is_recorded_failed_with_its_reason(tmp_path):
    sw = spec.load(_write(tmp_path, "name: ended\n" + TINY + "matrix:\n  batch_size: [4, 8]\n"))
    p_none, p_own = sw.points
    st = open_state(sw, tmp_path / "state")
    with Store.open(tmp_path / "r.db") as store:
        from dlscale.sweep.driver import record_failure

        own = record_failure(p_own, store, sw.name, "crashed: killed by SIGTERM", "")  # what the job itself wrote
        res = slurm.settle(p_none, squeue.JobState("41", "CANCELLED", "None", "00:05:00"), store, sw.name, st)
        res2 = slurm.settle(p_own, squeue.JobState("42", "TIMEOUT", "TimeLimit", "00:01:00"), store, sw.name, st)
        recs = {r.raw["sweep_point"]: r for r in store.query()}
    assert res.status == "failed" and res.error == "Slurm job 41 CANCELLED: was cancelled (scancel or an administrator)"
    assert res2.run_id == own.run_id and len(recs) == 2  # the point's own record, now with Slurm's reason
    assert recs[p_own.hash].error == ("Slurm job 42 TIMEOUT: ran past its time limit (00:01:00) and was killed by "
                                      "Slurm; reason TimeLimit (crashed: killed by SIGTERM)")
    assert recs[p_own.hash].raw["slurm_state"] == "TIMEOUT" and recs[p_none.hash].raw["slurm_job_id"] == "41"


def test_resume_runs_again_a_point_whose_job_lost_its_node_and_no_other_failed_one(tmp_path, monkeypatch):
    from dlscale.sweep.driver import finished_points, lost_points, record_failure

    sw = spec.load(_write(tmp_path, "name: lost\n" + TINY + "matrix:\n  batch_size: [4, 8]\n"))
    p_lost, p_own = sw.points
    st = open_state(sw, tmp_path / "state")
    st.points[p_lost.hash].update(job_id="41")
    st.points[p_own.hash].update(job_id="42")
    with Store.open(tmp_path / "r.db") as store:
        record_failure(p_lost, store, sw.name, "crashed: killed by SIGTERM", "")
        slurm.settle(p_lost, squeue.JobState("41", "NODE_FAIL", "None"), store, sw.name, st)
        slurm.settle(p_own, squeue.JobState("42", "TIMEOUT", "TimeLimit", "00:01:00"), store, sw.name, st)
        assert set(finished_points(store, sw)) == {p_own.hash}  # a timeout is the point's own: it stays done
        assert lost_points(store, sw) == {p_lost.hash: "41"}
        (rec,) = [r for r in store.query() if r.raw["sweep_point"] == p_lost.hash]
    assert rec.error == "Slurm job 41 NODE_FAIL: lost a node (crashed: killed by SIGTERM)"
    # the lost job (which the controller still knows) is not waited for again: its point is submitted anew
    monkeypatch.setattr(squeue, "active_jobs_by_name", lambda: {})
    monkeypatch.setattr(squeue, "job_states", lambda ids: {j: squeue.JobState(j, "NODE_FAIL") for j in ids})
    assert slurm._reattach(sw, st, {}, {p_lost.hash: "41"}) == {p_own.hash: "42"}


def _shim(bin_dir: Path, name: str, stderr: str, stdout: str = "", code: int = 1) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\necho '{stderr}' >&2\nexit {code}\n")
    (bin_dir / name).chmod(0o755)


def test_a_controller_that_does_not_answer_is_not_a_forgotten_job(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    _shim(tmp_path / "bin", "sacct", "Slurm accounting storage is disabled")  # no accounting here
    _shim(tmp_path / "bin", "scontrol", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    states = squeue.job_states(["41", "42"])
    assert {j: s.phase for j, s in states.items()} == {"41": "unreachable", "42": "unreachable"}
    assert states["41"].unreachable == "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    _shim(tmp_path / "bin", "scontrol", "slurm_load_jobs error: Invalid job id specified")
    assert squeue.job_states(["41"]) == {}  # the controller answered: it has forgotten the job
    _shim(tmp_path / "bin", "scontrol", "", "JobId=41 JobState=RUNNING Reason=None TimeLimit=00:05:00", 0)
    assert squeue.job_states(["41"])["41"].phase == "running"


def test_a_points_time_is_its_jobs_run_time_as_slurm_counts_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    _shim(tmp_path / "bin", "scontrol", "", "JobId=41 JobState=COMPLETED Reason=None RunTime=1-00:01:05 "
                                            "TimeLimit=2-00:00:00", 0)
    assert squeue.job_states(["41"])["41"].run_s == 86400 + 65
    _shim(tmp_path / "bin", "scontrol", "slurm_load_jobs error: Invalid job id specified")  # forgotten: accounting's
    _shim(tmp_path / "bin", "sacct", "", "42|FAILED|NonZeroExitCode|00:10:00|37", 0)
    assert squeue.job_states(["42"])["42"] == squeue.JobState("42", "FAILED", "NonZeroExitCode", "00:10:00", run_s=37)
    assert [squeue.run_seconds(t) for t in ("05:07", "3:02:01", "INVALID", "")] == [307, 3 * 3600 + 121, None, None]
    sw = spec.load(_write(tmp_path, "name: t\n" + TINY + "matrix:\n  batch_size: [4, 8]\n"))
    st = open_state(sw, tmp_path / "state")
    with Store.open(tmp_path / "r.db") as store:
        from dlscale.record import RunRecord

        for p in sw.points:  # what each job recorded itself, 12.5 s from its record's creation to its end
            store.insert(RunRecord(kind="train", workload="tinycnn", config=dict(p.options), raw={"sweep_point": p.hash},
                                   created_at="2026-11-28T10:00:00.000+00:00", finished_at="2026-11-28T10:00:12.500+00:00"))
        slurm_s = slurm.settle(sw.points[0], squeue.JobState("41", "COMPLETED", run_s=31), store, sw.name, st)
        own_s = slurm.settle(sw.points[1], squeue.JobState("43", "COMPLETED"), store, sw.name, st)  # Slurm said none
    assert (slurm_s.status, slurm_s.seconds) == ("ok", 31) and (own_s.status, own_s.seconds) == ("ok", 12.5)


def test_waiting_through_an_outage_records_what_the_job_recorded(tmp_path, monkeypatch):
    from dlscale.record import RunRecord, utc_now

    sw = spec.load(_write(tmp_path, "name: outage\n" + TINY + "matrix:\n  batch_size: [4]\n"))
    (p,) = sw.points
    st = open_state(sw, tmp_path / "state")
    st.points[p.hash].update(job_id="41", submitted_at="2026-01-01T00:00:00Z")
    monkeypatch.setenv(squeue.POLL_ENV, "0")
    down = squeue.JobState("41", "", unreachable="Unable to contact slurm controller (connect failure)")
    answers = [{"41": down}] * 6 + [{"41": squeue.JobState("41", "COMPLETED")}]
    with Store.open(tmp_path / "r.db") as store:
        def job_states(ids):
            if len(answers) == 2:  # the job finishes while the controller is down, and records itself
                store.insert(RunRecord(kind="train", workload="tinycnn", config=dict(p.options), tag=sw.tag,
                                       raw={"sweep_point": p.hash}, finished_at=utc_now()))
            return answers.pop(0)

        monkeypatch.setattr(squeue, "job_states", job_states)
        results: dict = {}
        slurm._wait(sw, {p.hash: "41"}, store, st, results, None)
        recs = store.query()
    assert not answers and results[p.hash].status == "ok" and len(recs) == 1 and recs[0].status == "ok"


# -- a real single-node Slurm -------------------------------------------------------------------------


def _dlscale(cluster, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, **cluster.env(), squeue.POLL_ENV: "1", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "dlscale.cli.app", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _status(cluster, target: str, db: Path) -> dict[str, dict]:
    r = _dlscale(cluster, "sweep", "status", target, "--db", str(db), "--format", "json")
    assert r.returncode == 0, r.stderr
    return {p["label"]: p for p in json.loads(r.stdout)["points"]}


def _jobs_named(cluster, name: str) -> list[str]:
    """Ids of every job of this name the controller remembers (MinJobAge is an hour here)."""
    p = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, env={**os.environ, **cluster.env()})
    return [ln.split()[0].split("=")[1] for ln in p.stdout.splitlines() if f" JobName={name} " in ln]


@pytest.fixture(scope="module")
def timeout_sweep(slurm_cluster, tmp_path_factory):
    """A two-point sweep submitted without waiting: one quick point, one past its one-minute limit."""
    d = tmp_path_factory.mktemp("timeout-sweep")
    f = _write(d, "name: overtime\n" + TINY + "slurm: {cpus_per_task: 1, time: 1}\nmatrix:\n  batch_size: [4]\n"
                  "include:\n  - {batch_size: 8, steps: 1000000}\n")
    db = d / "runs.db"
    r = _dlscale(slurm_cluster, "sweep", str(f), "--executor", "slurm", "--db", str(db), "--no-wait", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [p["status"] for p in json.loads(r.stdout)] == ["submitted", "submitted"]
    return f, db, time.monotonic()


@pytest.mark.slow
@pytest.mark.long
def test_a_killed_submitter_then_resume_submits_only_the_rest(slurm_cluster, timeout_sweep, tmp_path):
    # sbatch hangs on its second call, as if the submitter were killed between two submissions
    mark, shim = tmp_path / "first-submitted", tmp_path / "bin" / "sbatch"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\n[ -e {mark} ] && sleep 120\ntouch {mark}\nexec {subprocess.getoutput('command -v sbatch')} \"$@\"\n")
    shim.chmod(0o755)
    f = _write(tmp_path, "name: killed\n" + TINY + "slurm: {cpus_per_task: 1, time: 5}\nmatrix:\n  batch_size: [4, 8]\n")
    sw, db = spec.load(f), tmp_path / "runs.db"
    state = tmp_path / "sweeps" / "killed.json"
    env = {**os.environ, **slurm_cluster.env(), squeue.POLL_ENV: "1", "PATH": f"{shim.parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", "sweep", str(f), "--executor", "slurm", "--db",
                             str(db)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (mark.exists() and state.exists()
                                                   and json.loads(state.read_text())["points"][sw.points[0].hash]["job_id"]):
            time.sleep(0.1)
        time.sleep(0.5)  # the second sbatch is now hanging
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the submitter and its hanging sbatch
        proc.wait()
    first = json.loads(state.read_text())["points"]
    assert first[sw.points[0].hash]["job_id"] and first[sw.points[1].hash]["job_id"] is None
    r = _dlscale(slurm_cluster, "sweep", str(f), "--executor", "slurm", "--db", str(db), "--resume")
    assert r.returncode == 0, r.stderr
    after = json.loads(state.read_text())["points"]
    assert after[sw.points[0].hash]["job_id"] == first[sw.points[0].hash]["job_id"]  # re-attached, not re-submitted
    for p in sw.points:  # one job and one record per point
        assert len(_jobs_named(slurm_cluster, f"dlscale-{p.hash}")) == 1
    with Store.open(db) as s:
        recs = [r for r in s.query() if r.raw.get("sweep_point")]
    assert sorted(r.raw["sweep_point"] for r in recs) == sorted(p.hash for p in sw.points)
    assert all(r.status == "ok" for r in recs)
    rows = _status(slurm_cluster, "killed", db)
    assert {r["status"] for r in rows.values()} == {"finished"} and {r["job_id"] for r in rows.values()} == {
        after[p.hash]["job_id"] for p in sw.points}


@pytest.mark.slow
@pytest.mark.long
def test_a_controller_outage_while_a_job_runs_leaves_one_record(slurm_cluster, tmp_path):
    f = _write(tmp_path, "name: outage\nfixed: {model: tinycnn, image_size: 32, batch_size: 4, warmup_steps: 1, "
                         "steps: 2500, threads_per_rank: 1}\nslurm: {cpus_per_task: 1, time: 10}\nmatrix:\n  seed: [0]\n")
    (point,) = spec.load(f).points
    db = tmp_path / "runs.db"
    r = _dlscale(slurm_cluster, "sweep", str(f), "--executor", "slurm", "--db", str(db), "--no-wait")
    assert r.returncode == 0, r.stderr
    job = json.loads((tmp_path / "sweeps" / "outage.json").read_text())["points"][point.hash]["job_id"]
    assert wait_until(lambda: _job_state(slurm_cluster, job) == "RUNNING", 120), "the job never ran"

    def records() -> list:
        with Store.open(db) as s:
            return [rec for rec in s.query() if rec.raw.get("sweep_point") == point.hash]

    # the submitter waits for the job (--resume re-attaches); its client gives up on a silent controller in 2 s
    env = {**os.environ, **slurm_cluster.client_env(2), squeue.POLL_ENV: "1"}
    waiter = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", "sweep", str(f), "--executor", "slurm", "--db",
                               str(db), "--resume"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        slurm_cluster.stop_controller()
        try:
            assert not records(), "the job ended before the outage began"
            # the job runs ~20 s more: many polls without an answer. The controller comes back as soon as
            # the job has recorded, before its step ends: a step that ends while the controller is down
            # is reported by slurmd about a minute later (real, and only time for this test)
            assert wait_until(lambda: records(), 300, every_s=0.1), "the job did not record itself during the outage"
        finally:
            slurm_cluster.start_controller()
        _, stderr = waiter.communicate(timeout=300)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, stderr
    assert "Slurm does not answer (slurm_load_jobs error: Unable to contact slurm controller" in stderr
    assert "Slurm answers again" in stderr
    (rec,) = records()  # the job's own record, and no second one saying it was lost
    assert rec.status == "ok"


@pytest.mark.slow
@pytest.mark.long
def test_a_point_past_its_time_limit_is_recorded_failed_with_timeout(slurm_cluster, timeout_sweep):
    f, db, submitted = timeout_sweep
    rows = _status(slurm_cluster, str(f), db)
    if time.monotonic() - submitted < 50:  # the long point cannot have ended yet
        assert rows["steps=1000000 batch_size=8"]["status"] in ("queued", "running")
    assert all(r["job_id"] for r in rows.values())
    # the submitter was gone (--no-wait); --resume waits for the jobs it left and records them
    r = _dlscale(slurm_cluster, "sweep", str(f), "--executor", "slurm", "--db", str(db), "--resume", "--format", "json")
    assert r.returncode == 1, r.stderr
    assert "1 of 2 points failed" in r.stderr
    with Store.open(db) as s:
        recs = {rec.config.get("batch_size"): rec for rec in s.query()}
    assert len(recs) == 2 and recs[4].status == "ok" and recs[4].tag == "overtime"
    assert recs[8].status == "failed" and recs[8].error.startswith(
        f"Slurm job {rows['steps=1000000 batch_size=8']['job_id']} TIMEOUT: ran past its time limit (00:01:00)")
    rows = _status(slurm_cluster, "overtime", db)
    assert rows["steps=2 batch_size=4"]["status"] == "finished"
    assert rows["steps=1000000 batch_size=8"]["status"] == "failed"
    assert rows["steps=1000000 batch_size=8"]["slurm_state"] == "TIMEOUT"


def _job_state(cluster, job_id: str) -> str:
    p = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                       env={**os.environ, **cluster.env()})
    m = re.search(r"JobState=(\S+)", p.stdout)
    return m.group(1) if m else ""
