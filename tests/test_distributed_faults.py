"""Naming the rank that failed a job, from the ranks' reports and torchrun's summary."""

from dlscale.distributed.faults import classify, diagnose
from dlscale.distributed.launch import RankFailure, parse_failures

TORCHRUN_SUMMARY = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
dlscale.distributed.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_02:10:59
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 19489)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 19489
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_02:10:58
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 19490)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 19490
============================================================
"""


def failure(rank, cause, t, node=0):
    return {"rank": rank, "node": node, "cause": cause, "kind": classify(cause), "time": t}


def test_parse_torchrun_summary_marks_the_root_cause():
    fs = parse_failures(TORCHRUN_SUMMARY)
    assert [(f.rank, f.exitcode, f.root_cause) for f in fs] == [(1, -9, True), (0, -15, False)]
    assert fs[0].detail == "Signal 9 (SIGKILL) received by PID 19490"


def test_killed_rank_is_named_over_the_one_torchrun_stopped():
    msg = diagnose([], 2, parse_failures(TORCHRUN_SUMMARY))
    assert msg.startswith("rank 1 was killed (Signal 9 (SIGKILL)")
    msg = diagnose([failure(0, "RuntimeError: Connection closed by peer [127.0.0.1]:1234", 1.0)], 2,
                   parse_failures(TORCHRUN_SUMMARY))
    assert msg.startswith("rank 1 was killed") and "rank 0 lost its connection" in msg


def test_own_error_wins_over_the_symptoms_it_caused():
    fs = [failure(0, "RuntimeError: Connection reset by peer", 2.0), failure(1, "out of memory: ...; lower --batch-size", 1.0)]
    assert diagnose(fs, 2) == "rank 1 (node 0) failed: out of memory: ...; lower --batch-size"


def test_a_finding_names_its_ranks_itself(tmp_path):
    from dlscale.distributed.faults import read_failures, write_failure

    write_failure(str(tmp_path), 0, 0, "silent data corruption: rank 1 (cuda:1): its GEMM chain output differs",
                  finding=True)
    (f,) = read_failures(str(tmp_path))
    assert f["kind"] == "finding"
    assert diagnose([f], 2) == "silent data corruption: rank 1 (cuda:1): its GEMM chain output differs"


def test_hung_rank_is_the_one_that_left_no_report():
    fs = [failure(0, "DistBackendError: wait timeout after 10000ms", 1.0), failure(2, "timed out in all_reduce", 1.1)]
    torchrun = [RankFailure(0, 0, 1, "", root_cause=True), RankFailure(1, 1, -9, "Signal 9 (SIGKILL)")]
    msg = diagnose(fs, 3, torchrun)
    assert msg.startswith("rank 1 stopped responding") and "rank 0 timed out waiting for it" in msg


def test_classify():
    assert classify("Application timeout caused pair closure") == "timeout"
    assert classify("Connection closed by peer") == "peer"
    assert classify("ValueError: bad shape") == "error"
