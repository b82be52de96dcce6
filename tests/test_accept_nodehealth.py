"""`dlscale accept` as Slurm's node health check, on the real single-node Slurm the tests start
(tests/slurmcluster.py; skipped without slurm/munge unless DLSCALE_REQUIRE_SLURM=1): slurmd runs it as
its HealthCheckProgram, a failing acceptance drains the node with its reason, a passing one returns
it to service; a node an administrator drained stays drained. On this CPU machine level 1 is the
inventory (no GPU for the health check), and a spec that asks for more CPUs than the node has fails."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import wait_until
from dlscale.accept.nodehealth import drain as nodehealth


def scontrol(cluster, *args):
    subprocess.run(["scontrol", *args], env={**os.environ, **cluster.env()}, check=True, capture_output=True,
                   timeout=30)


def failing_spec(tmp_path):
    p = tmp_path / "too-many-cpus.yaml"
    p.write_text(f"checks:\n  inventory: {{cpus: {(os.cpu_count() or 1) + 1000}}}\n")
    return p


@pytest.mark.slow
@pytest.mark.long
def test_slurmd_runs_it_as_its_health_check_program_drain_on_fail_then_resume_on_pass(slurm_cluster, db_path,
                                                                                      tmp_path):
    """The tests' slurm.conf names a HealthCheckProgram (every 5 s) that runs what ``set_health_check`` gives:
    here `dlscale accept`, as a site's /etc/slurm/dlscale-health.sh would (``health_check_command``)."""
    log, lock = slurm_cluster.health_log(slurm_cluster.host), slurm_cluster.health_lock(slurm_cluster.host)

    def health_check(*args):  # one at a time (flock): slurmd asks every 5 s, a run here may take longer
        return slurm_cluster.health_check_command(*args, "--drain-on-fail", "--resume-on-pass", db=db_path)

    def state():
        return slurm_cluster.node_state()

    try:
        slurm_cluster.set_health_check(health_check("--spec", str(failing_spec(tmp_path))))
        drained = wait_until(lambda: "DRAIN" in state()[0], 120, 1.0)
        assert drained, (state(), log.read_text() if log.exists() else "no log")
        why = state()[1]
        assert why.startswith(f"{nodehealth.PREFIX} FAIL inventory logical CPUs: ") and "accept-" in why, why
        slurm_cluster.set_health_check(health_check("--level", "1"))
        assert wait_until(lambda: "DRAIN" not in state()[0], 120, 1.0), (state(), log.read_text())
        assert "resumed node" in log.read_text()
    finally:
        slurm_cluster.set_health_check(None)
        wait_until(lambda: not (tmp_path / "lock").exists() or subprocess.run(
            ["flock", "-n", str(tmp_path / "lock"), "true"]).returncode == 0, 60, 1.0)  # the last run has ended
        if "DRAIN" in state()[0]:
            scontrol(slurm_cluster, "update", f"NodeName={slurm_cluster.host}", "State=RESUME")


@pytest.mark.slow
def test_a_node_an_administrator_drained_stays_drained(slurm_cluster, db_path, tmp_path, cli, monkeypatch):
    for k, v in slurm_cluster.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURMD_NODENAME", slurm_cluster.host)  # as Slurm sets it for a prolog or epilog
    node = slurm_cluster.host
    try:
        scontrol(slurm_cluster, "update", f"NodeName={node}", "State=DRAIN", "Reason=maintenance: new DIMMs")
        r = cli("accept", "--level", "1", "--resume-on-pass", "--out", str(tmp_path / "out"))
        assert r.code == 0, r.stderr[-2000:]
        assert "drained for another reason (maintenance: new DIMMs): left drained" in r.stderr
        assert slurm_cluster.node_state()[1].startswith("maintenance: new DIMMs")
        # nor is its reason replaced by a failing acceptance's
        assert "left as it is" in nodehealth.drain(node, f"{nodehealth.PREFIX} FAIL gemm bf16 best rate on GPU 3")
        assert slurm_cluster.node_state()[1].startswith("maintenance: new DIMMs")
    finally:
        scontrol(slurm_cluster, "update", f"NodeName={node}", "State=RESUME")


def test_bad_combinations_are_refused_before_anything_runs(cli, db_path, monkeypatch, tmp_path):
    r = cli("accept", "--level", "4")
    assert r.code == 2 and "--level 4: the levels are 1" in r.stderr
    r = cli("accept", "--quick", "--level", "1")
    assert r.code == 2 and "--quick is --level 2" in r.stderr
    r = cli("accept", "--drain-on-fail", "--executor", "slurm")
    assert r.code == 2 and "act on the node the acceptance runs on" in r.stderr
    r = cli("accept", "verify", str(tmp_path), "--drain-on-fail")
    assert r.code == 2 and "runs nothing" in r.stderr
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol here
    r = cli("accept", "--level", "1", "--drain-on-fail")
    assert r.code == 2 and "need Slurm's scontrol on PATH" in r.stderr


def test_a_second_level_1_holds_the_node_to_its_first(cli, db_path, tmp_path):
    """Without a spec the node's counts are held to its last sound acceptance: measured twice here, the
    second acceptance's CPUs and memory PASS against the first one's (a GPU or DIMM lost in between would FAIL)."""
    import json

    first = cli("accept", "--level", "1", "--out", str(tmp_path / "a"), "--format", "json")
    assert first.code == 0, first.stderr[-2000:]
    doc = json.loads(first.stdout)
    assert {v["figure"]: v["status"] for v in doc["verdicts"] if v["check"] == "inventory"}["logical CPUs"] == \
        "NO EXPECTATION"
    second = cli("accept", "--level", "1", "--out", str(tmp_path / "b"), "--format", "json")
    assert second.code == 0, second.stderr[-2000:]
    inv = {v["figure"]: v for v in json.loads(second.stdout)["verdicts"] if v["check"] == "inventory"}
    assert inv["logical CPUs"]["status"] == "PASS" and inv["logical CPUs"]["expectation"] == "baseline"
    assert inv["logical CPUs"]["expected"] == os.cpu_count() and doc["acceptance_id"] in inv["logical CPUs"]["source"]
    assert inv["memory"]["status"] == "PASS"
