"""Rank and world detection under torchrun, Slurm and OpenMPI, and a run started by a simulated mpirun."""

import json
import os
import socket
import subprocess
import sys

import pytest

from dlscale.distributed.env import detect, expand_hostlist, launcher_of, tasks_on_node
from dlscale.errors import UsageError


def test_plain_process_is_not_distributed():
    assert detect({}) is None
    # A Slurm batch script's own shell (no job step) is not rank 0 of anything.
    assert launcher_of({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None


def test_torchrun_variables():
    e = detect({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                "MASTER_ADDR": "node0", "MASTER_PORT": "1234"})
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size, e.node_rank, e.nnodes) == (5, 1, 8, 4, 1, 2)
    assert (e.master_addr, e.master_port, e.launcher) == ("node0", 1234, "torchrun")


def test_a_rank_that_does_not_record_says_its_rank_and_node_as_its_launcher_numbered_them(monkeypatch):
    from dlscale.distributed.job import done_elsewhere
    from dlscale.layout import Layout

    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    assert done_elsewhere(Layout(nnodes=2, node_rank=1)) == "node 1: done (node 0 records and prints the run)"
    # under c10d torchrun, with --node-rank left at its default 0: GROUP_RANK is the node
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_RANK", "1")
    assert done_elsewhere(Layout()) == "rank 3 (node 1): done (rank 0 records and prints the run)"


def test_slurm_srun_step():
    # srun -N 2 --ntasks-per-node 4: task 6 is the 3rd task on the second node.
    e = detect({"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "2",
                "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                "SLURM_STEP_NODELIST": "gpu[07-08]"})
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size, e.node_rank, e.nnodes) == (6, 2, 8, 4, 1, 2)
    assert (e.master_addr, e.master_port, e.launcher) == ("gpu07", 29500, "slurm")


def test_a_slurm_step_on_fewer_nodes_than_its_job_counts_the_steps():
    # a 4-node job runs `srun -N 2 -n 8`: SLURM_NNODES and SLURM_NTASKS are the job's (4 nodes, 32 tasks)
    e = detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "32", "SLURM_NNODES": "4", "SLURM_STEP_NUM_NODES": "2",
                "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_ID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]"})
    assert (e.world_size, e.nnodes, e.local_world_size, e.node_rank) == (8, 2, 4, 1)


def test_slurm_uneven_tasks_and_hostlists():
    assert tasks_on_node("2(x3),1", 3) == 1 and tasks_on_node("2(x3),1", 0) == 2
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("a1,b[9-10]") == ["a1", "b9", "b10"]


def test_openmpi_variables():
    e = detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "10.0.0.1"})
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size, e.node_rank, e.nnodes) == (3, 1, 4, 2, 1, 2)
    assert (e.master_addr, e.launcher) == ("10.0.0.1", "openmpi")


def test_openmpi_across_nodes_needs_a_master():
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})


def test_bad_values_name_the_variable():
    with pytest.raises(UsageError, match="RANK"):
        detect({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(UsageError, match="outside world size"):
        detect({"RANK": "2", "WORLD_SIZE": "2"})


@pytest.mark.slow
@pytest.mark.long
def test_run_started_by_a_simulated_mpirun(db_path):
    """Two processes with mpirun's variables, no torchrun: rank 0 alone prints and stores."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "DLSCALE_DB": str(db_path), "OMPI_COMM_WORLD_RANK": str(rank),
               "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dlscale.cli.app", "train", "tinycnn", "-b", "8", "--warmup-steps", "1", "--steps", "3",
             "--device", "cpu", "--timeout", "60", "--format", "json", "--tag", "mpi"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert outs[1][0].strip() == ""  # only rank 0 prints
    rec = json.loads(outs[0][0])
    assert rec["config"]["launcher"] == "openmpi" and rec["metrics"]["world_size"] == 2
    assert [(n["interface"], n["set_by"], n["how"]) for n in rec["config"]["rank_network"]] == \
        [("lo", "user", "GLOO_SOCKET_IFNAME=lo")] * 2  # the user's own setting stands, and is recorded as theirs
    assert len(rec["metrics"]["rank_throughputs"]) == 2
