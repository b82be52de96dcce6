"""`dlscale accept` end to end on this CPU machine with a very small spec: the healthy path (a first
acceptance with no expectation, then a second one against it as baseline: all PASS), a check whose run
fails, and the suite under torchrun. The thresholds of the healthy path are wide (50%) because the CI
machine is shared by other jobs: the false-alarm count at the default thresholds is the benchmark's
(benchmarks/accept_faults.py), not a unit test's."""

from __future__ import annotations

import json
import os

import pytest

from conftest import torchrun
from dlscale.store import Store

# No memory check: small STREAM arrays sit in this VM's 480 MiB L3, shared with other tenants' jobs, and
# swing by 4x between runs; GEMM's 2048^3 probe and the short test are compute-bound.
TINY = """name: tiny
checks:
  gemm: {{shapes: {shapes}, precision: [fp32], iters: 5}}
  train_alone: {{model: tinycnn, image_size: 16, batch_size: 8, steps: 8, warmup_steps: 2, breakdown_steps: 0,
                monitor_interval: 0, timeout: 120}}
thresholds: {{warn: 0.5, fail: 0.9}}
peers: {{warn: 0.5, fail: 0.9}}
"""


@pytest.fixture
def tiny(tmp_path):
    shapes = tmp_path / "g.csv"
    shapes.write_text("m,n,k,a_t,b_t\n64,64,64,0,0\n")
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY.format(shapes=shapes))
    return p


@pytest.mark.slow
def test_a_healthy_run_after_a_healthy_baseline_passes(cli_subprocess, db_path, tmp_path, tiny):
    first = cli_subprocess("accept", "--spec", str(tiny), "--out", str(tmp_path / "a1"), "--format", "json")
    assert first.code == 0, first.stderr[-3000:]
    doc1 = json.loads(first.stdout)
    assert doc1["outcome"] == "PASS" and doc1["counts"]["FAIL"] == 0
    assert {v["status"] for v in doc1["verdicts"] if v["check"] != "train_alone"} == {"NO EXPECTATION"}
    second = cli_subprocess("accept", "--spec", str(tiny), "--out", str(tmp_path / "a2"), "--format", "json")
    assert second.code == 0, second.stderr[-3000:]
    doc2 = json.loads(second.stdout)
    assert {v["status"] for v in doc2["verdicts"]} == {"PASS"}, [(v["figure"], v["subject"], v["reason"]) for v in doc2["verdicts"] if v["status"] != "PASS"]
    base = [v for v in doc2["verdicts"] if v["expectation"] == "baseline"]
    assert {v["key"] for v in base} == {v["key"] for v in doc1["verdicts"]}  # every figure met its baseline
    assert all(doc1["acceptance_id"] in v["source"] for v in base)
    with Store.open(db_path) as s:
        runs = s.query(tag=doc2["acceptance_id"])
    assert sorted(r.kind for r in runs) == ["accept", "micro", "train"]
    assert next(r for r in runs if r.kind == "train").config["parallel"] == "none"
    verify = cli_subprocess("accept", "verify", str(tmp_path / "a2"))
    assert verify.code == 0 and "match the manifest" in verify.stdout


@pytest.mark.slow
def test_a_check_whose_run_fails_is_a_fail_and_exits_1(cli_subprocess, db_path, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("checks:\n  collectives: {sizes: 64K, plant_wrong: all_reduce, threads_per_rank: 1, timeout: 120}\n")
    r = cli_subprocess("accept", "--spec", str(p), "--out", str(tmp_path / "out"))
    assert r.code == 1, r.stderr[-3000:]
    assert "FAIL collectives run: the run failed:" in r.stdout and "wrong element" in r.stdout
    assert "FAIL" in (tmp_path / "out" / "junit.xml").read_text()


@pytest.mark.slow
def test_under_torchrun_the_checks_across_ranks_run_in_place(db_path, tmp_path):
    p = tmp_path / "ranks.yaml"
    p.write_text("checks:\n  train_alone: {model: tinycnn, image_size: 16, batch_size: 8, steps: 6, warmup_steps: 1,"
                 " breakdown_steps: 0, monitor_interval: 0}\n  train: {model: tinycnn, image_size: 16, batch_size: 8,"
                 " steps: 6, warmup_steps: 1, breakdown_steps: 0, monitor_interval: 0}\n  gemm: {}\n")
    env = {**os.environ, "DLSCALE_DB": str(db_path), "OMP_NUM_THREADS": "1"}
    code, stdout, stderr = torchrun(["-m", "dlscale.cli.app", "accept", "--spec", str(p), "--out",
                                     str(tmp_path / "out"), "--format", "json"], env)
    assert code == 0, stderr[-3000:]
    doc = json.loads(stdout)  # rank 0 alone prints
    assert {v["check"] for v in doc["verdicts"]} == {"train_alone", "train"}
    assert [v["subject"] for v in doc["verdicts"] if v["check"] == "train_alone"] == ["rank 0", "rank 1"]
    assert "per-node checks" in next(n["why"] for n in doc["not_run"] if n["check"] == "gemm")
    with Store.open(db_path) as s:
        assert sorted(x.kind for x in s.query(tag=doc["acceptance_id"])) == ["accept", "train", "train"]

