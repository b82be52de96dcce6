"""Data-parallel short test end to end (2 gloo ranks through torchrun) and its faults."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from conftest import (cmdline, marked_processes, marked_ranks, need_system, requires_cuda, sigint_default,
                      survivors_of_kill_9, torchrun)
from dlscale.store import Store

FAST = ["tinycnn", "--batch-size", "8", "--warmup-steps", "2", "--steps", "6", "--device", "cpu"]


def dlscale_cmd(*args):
    return [sys.executable, "-m", "dlscale.cli.app", *args]


def tinycnn_params():
    from dlscale import workloads

    return sum(p.numel() for p in workloads.get("tinycnn").build().parameters())


@pytest.mark.slow
def test_two_rank_gloo_end_to_end(cli_subprocess, db_path):
    res = cli_subprocess("train", *FAST, "--nproc-per-node", "2", "--timeout", "120", "--format", "json", "--tag", "dp")
    assert res.code == 0, res.stderr[-3000:]
    rec = json.loads(res.stdout)
    m, c = rec["metrics"], rec["config"]
    assert (c["world_size"], c["nodes"], c["devices_per_node"], c["backend"]) == (2, 1, 2, "gloo")
    assert c["cpu_binding"] == "cpu" and len(c["rank_cpus"]) == 2  # CPU ranks: unbound, each rank's CPUs said
    # one node on loopback: gloo's interface from the route to the master, as dlscale chose it
    assert [(n["interface"], n["address"], n["set_by"], n["how"]) for n in c["rank_network"]] == \
        [("lo", "127.0.0.1", "dlscale", "route to MASTER_ADDR 127.0.0.1")] * 2
    assert m["world_size"] == 2 and len(m["rank_throughputs"]) == 2
    # Global throughput: 2 ranks x 8 samples x 6 steps over the slower rank's window.
    windows = [sum(r[0]) for r in rec["raw"]["rank_step_times_s"]]
    assert m["throughput"] == pytest.approx(2 * 8 * 6 / max(windows))
    assert m["rank_throughput_min"] == pytest.approx(8 * 6 / max(windows))
    assert 0 < m["comm_fraction"] < 1
    assert m["allreduce_bytes_per_step"] == 4 * tinycnn_params()  # every fp32 gradient, once per step
    with Store.open(db_path) as s:
        (stored,) = s.query(tag="dp")
    assert stored.status == "ok" and stored.metrics["throughput"] == m["throughput"]


def _descendants(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _rank_process(pid, rank, deadline):
    while time.monotonic() < deadline:
        for p in _descendants(pid):
            try:
                env = p.environ()
                if env.get("RANK") == str(rank) and "dlscale.distributed.rank" in " ".join(p.cmdline()):
                    return p
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never started")


def _fault_run(db_path, how, timeout_s):
    """Start a long 2-rank run, hurt rank 1 once it trains, return (exit code, stderr, seconds, leftovers)."""
    env = {**os.environ, "DLSCALE_DB": str(db_path)}
    p = subprocess.Popen(dlscale_cmd("train", *FAST[:-4], "--steps", "100000", "--warmup-steps", "0", "--device", "cpu",
                                     "--nproc-per-node", "2", "--timeout", str(timeout_s), "--tag", "fault"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        victim = _rank_process(p.pid, 1, time.monotonic() + 60)
        time.sleep(3)  # past the rendezvous and into the steps
        family = [victim, *_descendants(p.pid)]
        t0 = time.monotonic()
        how(victim)
        _, stderr = p.communicate(timeout=timeout_s + 60)
        elapsed = time.monotonic() - t0
        time.sleep(0.5)
        left = [q for q in family if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]
        return p.returncode, stderr, elapsed, left
    finally:
        if p.poll() is None:
            for q in _descendants(p.pid):
                q.kill()
            p.kill()
            p.wait()


@pytest.mark.slow
def test_killed_rank_ends_the_job_without_orphans(db_path):
    code, stderr, elapsed, left = _fault_run(db_path, lambda q: q.send_signal(signal.SIGKILL), timeout_s=30)
    assert code == 1
    assert elapsed < 30 + 15
    assert not left, f"orphans: {left}"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: run ") and "rank 1" in last, last
    # dlscale's one line, not torchrun's traceback banner; the launcher's output is kept in the record.
    assert "ChildFailedError" not in stderr and "Traceback" not in stderr, stderr[-2000:]
    with Store.open(db_path) as s:
        (rec,) = s.query(tag="fault")
    assert rec.status == "failed" and "rank 1" in rec.error
    assert any("ChildFailedError" in line for line in rec.raw["launcher_log"])


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--nproc-per-node", "2"], ["--emulate-nodes", "2"]], ids=["ranks", "emulated"])
def test_kill_9_of_the_launcher_takes_torchrun_and_every_rank(db_path, layout):
    from dlscale.distributed import netns

    if layout[0] == "--emulate-nodes":
        reason = netns.unavailable_reason()
        need_system("root and iproute2", reason and f"network namespaces unavailable: {reason}", "DLSCALE_REQUIRE_NETNS")

    def torchrun_and_ranks(marker: str) -> bool:
        return len(marked_ranks(marker)) == 2 and any(b"torch.distributed.run" in cmdline(q)
                                                      for q in marked_processes(marker))

    def namespaces_of(pid: int) -> None:  # the killed launcher could not remove its own
        for ns in netns.list_namespaces() if layout[0] == "--emulate-nodes" else ():
            if ns.startswith(f"{netns.PREFIX}{pid}-"):
                netns.remove_namespace(ns)

    left = survivors_of_kill_9(dlscale_cmd("train", *FAST[:-4], "--steps", "100000", "--warmup-steps", "0", "--device",
                                           "cpu", "--threads-per-rank", "1", *layout), torchrun_and_ranks,
                               cleanup=namespaces_of)
    assert not left, f"outlived the killed launcher: {left}"


def test_launcher_filter_holds_back_torchrun_banner_only():
    from dlscale.distributed.launch import LauncherFilter

    banner = ["E1123 14:02:03.123000 4242 torch/distributed/elastic/multiprocessing/api.py:1] failed (exitcode: -9)",
              "Traceback (most recent call last):", '  File "run.py", line 1, in <module>',
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
              "dlscale.distributed.rank FAILED", "-" * 60, "Root Cause (first observed failure):",
              "  rank      : 1 (local_rank: 1)", "=" * 60]
    other = ["Traceback (most recent call last):", '  File "x.py", line 2, in f', "ValueError: a rank's own error"]
    lines = ["rank output", *banner, "after", *other]
    f = LauncherFilter()
    shown = [out for line in lines for out in f(line + "\n")]
    assert [s.rstrip("\n") for s in shown] == ["rank output", "after", *other]
    assert len([out for line in lines for out in LauncherFilter(debug=True)(line)]) == len(lines)


def test_launcher_filter_holds_back_torchruns_traceback_when_a_signal_ends_it():
    """Ctrl-C (or SIGTERM) of a multi-rank run: dlscale ends torchrun with SIGTERM and torchrun raises its
    SignalException; that 28-line traceback is its own, the interruption is dlscale's one line."""
    from dlscale.distributed.launch import LauncherFilter

    tb = ["Traceback (most recent call last):", '  File "<frozen runpy>", line 198, in _run_module_as_main',
          '  File "torch/distributed/run.py", line 1142, in <module>', "    main()",
          '  File "torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler',
          '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
          "torch.distributed.elastic.multiprocessing.api.SignalException: Process 9912 got signal: 15"]
    f = LauncherFilter()
    shown = [out for line in ["rank output", *tb, "after"] for out in f(line + "\n")]
    assert [s.rstrip("\n") for s in shown] == ["rank output", "after"]


def _ctrl_c_once_two_ranks_run(args: list[str]) -> tuple[int, list[str], str]:
    """Start ``dlscale ARGS`` in its own process group (a terminal's foreground job) and press Ctrl-C, sent
    to the group as a terminal sends it, once two ranks are up and stepping: (exit code, stderr lines but
    torch's own log lines, stderr)."""
    import re

    def foreground() -> None:
        sigint_default()
        os.setpgrp()

    p = subprocess.Popen(dlscale_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=foreground)
    try:
        deadline = time.monotonic() + 120
        for rank in (0, 1):
            assert _rank_process(p.pid, rank, deadline) is not None
        time.sleep(2.0)  # the ranks are in their steps
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, [ln for ln in err.splitlines() if ln.strip() and not re.match(r"[IWEF]\d{4} ", ln)], err


@pytest.mark.slow
@pytest.mark.long
def test_ctrl_c_of_a_two_rank_run_prints_one_line(db_path):
    """Exit 130, an interrupted record, and on stderr after the start line only "error: interrupted"
    (before: torchrun's 28-line SignalException traceback came first)."""
    code, lines, err = _ctrl_c_once_two_ranks_run(
        ["train", *FAST[:-4], "--steps", "100000", "--warmup-steps", "0", "--device", "cpu", "--nproc-per-node", "2",
         "--threads-per-rank", "1", "--tag", "ctrlc"])
    assert code == 130 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 2 and lines[0].startswith("dlscale train tinycnn: DDP over 2 ranks"), err[-3000:]
    assert lines[1] == "error: interrupted", err[-3000:]
    with Store.open(db_path) as s:
        (rec,) = s.query(tag="ctrlc")
    assert rec.status == "failed" and "interrupted" in rec.error


@pytest.mark.slow
@pytest.mark.long
def test_ctrl_c_of_an_acceptance_in_a_two_rank_check_prints_one_line(db_path):
    """accept --quick's collectives check runs two ranks: Ctrl-C there ends with the acceptance's one line
    (before: torchrun's traceback, then the check's own "interrupted")."""
    code, lines, err = _ctrl_c_once_two_ranks_run(["accept", "--quick", "--checks", "collectives"])
    assert code == 130 and "Traceback" not in err, err[-3000:]
    assert [ln.split(":")[0] for ln in lines] == ["dlscale accept collectives", "dlscale accept",
                                                  "dlscale micro collectives", "error"], err[-3000:]
    assert lines[-1].startswith("error: interrupted: acceptance accept-"), err[-3000:]


@pytest.mark.slow
@pytest.mark.long
def test_hung_rank_ends_the_job_within_the_timeout(db_path):
    code, stderr, elapsed, left = _fault_run(db_path, lambda q: q.send_signal(signal.SIGSTOP), timeout_s=10)
    assert code == 1
    assert elapsed < 10 + 40  # the collective timeout, then teardown (SIGTERM, SIGKILL after 5 s) on a busy machine
    assert not left, f"orphans: {left}"
    last = stderr.strip().splitlines()[-1]
    assert "rank 1" in last and "rank 0 timed out" in last, last
    with Store.open(db_path) as s:
        (rec,) = s.query(tag="fault")
    assert rec.status == "failed" and "rank 1" in rec.error


def test_busy_port_is_a_one_line_usage_error(cli, db_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = cli("train", *FAST, "--nproc-per-node", "2", "--master-port", str(port))
    assert res.code == 2
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: --master-port {port} is busy")


def test_unreachable_master_is_a_one_line_usage_error(cli, db_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        res = cli("train", *FAST, "--nnodes", "2", "--node-rank", "1", "--master-port", str(port), "--timeout", "1")
    assert res.code == 2
    assert "unreachable" in res.stderr.strip().splitlines()[-1]


def test_bad_layouts_are_usage_errors(cli, db_path):
    assert cli("train", *FAST, "--nproc-per-node", "0").code == 2
    assert cli("train", *FAST, "--nnodes", "2", "--node-rank", "2").code == 2
    res = cli("train", *FAST, "--link-bandwidth", "1gbit")
    assert res.code == 2 and "--emulate-nodes" in res.stderr
    assert cli("train", *FAST, "--emulate-nodes", "2", "--link-bandwidth", "fast").code == 2
    assert cli("scale", "tinycnn", "--devices", "1,2", "--layouts", "2x1").code == 2


def test_backend_mpi_is_refused_before_any_rank_starts(cli, db_path, monkeypatch):
    import torch.distributed as dist

    from dlscale.distributed import launch

    def no_launch(*a, **k):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(launch, "launch", no_launch)
    res = cli("train", *FAST, "--nproc-per-node", "2", "--backend", "mpi")
    assert res.code == 2 and [ln for ln in res.stderr.splitlines() if ln.startswith("error:")] == [
        res.stderr.strip().splitlines()[-1]], res.stderr
    if not dist.is_mpi_available():  # this PyTorch has no MPI: said, with what to use instead
        assert "was built without MPI" in res.stderr and "use gloo (CPUs) or nccl (GPUs)" in res.stderr
    monkeypatch.setattr(dist, "is_mpi_available", lambda: True)  # with MPI, torchrun still cannot place MPI ranks
    res = cli("train", *FAST, "--nproc-per-node", "2", "--backend", "mpi")
    assert res.code == 2 and "needs ranks started by mpirun" in res.stderr
    assert not db_path.exists() or Store.open(db_path).count() == 0


def test_mismatched_world_size_under_a_launcher(cli, db_path, monkeypatch):
    for k, v in {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    res = cli("train", *FAST, "--nproc-per-node", "4")
    assert res.code == 2
    assert "mismatched world size: openmpi started 2 ranks" in res.stderr


@requires_cuda
@pytest.mark.slow
def test_nccl_rank_times_allreduce_with_cuda_events(cli_subprocess, db_path):
    import torch

    n = min(torch.cuda.device_count(), 2)
    res = cli_subprocess("train", "tinycnn", "-b", "8", "--warmup-steps", "2", "--steps", "6", "--device", "cuda",
                         "--nproc-per-node", str(n), "--timeout", "120", "--format", "json")
    assert res.code == 0, res.stderr[-3000:]
    rec = json.loads(res.stdout)
    assert rec["config"]["backend"] == "nccl" and rec["metrics"]["world_size"] == n
    assert rec["metrics"]["allreduce_bytes_per_step"] == 4 * tinycnn_params()
    assert 0 <= rec["metrics"]["comm_fraction"] < 1


@pytest.mark.slow
def test_run_torchrun_ends_a_job_past_its_time_limit():
    from dlscale.distributed.launch import launch

    # http.server serves until stopped: a job that never ends by itself.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    from dlscale.layout import Layout

    res = launch("http.server", ["0", "--bind", "127.0.0.1"], Layout(nproc_per_node=1), timeout_s=5)
    assert res.returncode == 124 and res.timed_out
    assert time.monotonic() - t0 < 5 + 20
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left


def test_one_launcher_failing_ends_the_others_whatever_their_order():
    """Node 1's launcher exits non-zero while node 0's still runs: the job ends, it does not wait on node 0."""
    from dlscale.distributed.launch import _supervise

    t0 = time.monotonic()
    res = _supervise([[sys.executable, "-c", "import time; time.sleep(60)"],
                      [sys.executable, "-c", "import sys; sys.exit(3)"]], dict(os.environ), timeout_s=120)
    assert res.returncode == 3 and not res.timed_out
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
@pytest.mark.long
def test_two_runs_in_one_launched_process_share_its_process_group(db_path, tmp_path):
    script = tmp_path / "twice.py"
    script.write_text("from dlscale import api\nfor i in range(2):\n    api.train(model='tinycnn', image_size=16, "
                      "batch_size=8, steps=3, warmup_steps=1, breakdown_steps=0, monitor_interval=0, tag=f'twice{i}')\n")
    env = {**os.environ, "DLSCALE_DB": str(db_path), "OMP_NUM_THREADS": "1"}
    code, _, stderr = torchrun([str(script)], env)
    assert code == 0, stderr[-3000:]
    with Store.open(db_path) as s:
        assert sorted(r.tag for r in s.query(kind="train", status="ok")) == ["twice0", "twice1"]
