"""The issue's proof on this machine: injected faults are caught. (b) an acceptance run again with all
its processes under a CPU quota of half a core FAILs against its healthy baseline, with the size and
significance of the regression; (c) of two emulated nodes, the one under half the other's CPU quota is
named the outlier; (d) of three emulated nodes, the one whose link is shaped 10x slower fails the
collectives across the nodes, and the verdict names its link. (a), a healthy run after a healthy
baseline, is tests/test_accept.py's; the counts over many runs are `benchmarks/faults.py accept`'s.

Each needs root and the machine's cgroup cpu controller or network namespaces (iproute2), and skips
saying which is missing (fails where DLSCALE_REQUIRE_NETNS=1). A quota only shows where the machine
gives an unconstrained process more than the quota: each test asks the machine first (``cpu_share``)
and, where one process gets less than 0.8 of a core, sets half of what it gets instead of half a core
(so the faulty side still runs at about half its healthy rate). Every namespace and group made is
removed: each test checks.

A quota is CPU time per 100 ms period (50 ms for half a core), so it shows on sustained work only: the
short test here is resnet18 at 32 px, about 0.1 s a step, its timed steps spanning many periods; a
tinycnn step (4 ms) or a small GEMM call fits in one period's 50 ms and runs at full speed there."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from conftest import cpu_share, namespaces_left, need_system
from dlscale.distributed import cgroup, netns
from test_accept import ONE_THREAD

pytestmark = [pytest.mark.slow, pytest.mark.long]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ALONE = EXAMPLES / "accept-node-cpu.yaml"  # the short test alone, resnet18: sustained work
NODES = EXAMPLES / "accept-links.yaml"  # all_reduce across the nodes and every node's link


def need_quota() -> None:
    need_system("root and a cgroup cpu controller", cgroup.unavailable_reason(), "DLSCALE_REQUIRE_NETNS")


def need_netns() -> None:
    need_system("root and iproute2", netns.unavailable_reason(), "DLSCALE_REQUIRE_NETNS")


def half_a_core() -> float:
    """0.5 cores where the machine gives one process at least 0.8 of a core now, else half of what it gives."""
    one = cpu_share(1)
    if one < 0.2:
        pytest.skip(f"the machine gives a CPU-bound process {one:.2f} of a core: too busy to show a quota")
    return 0.5 if one >= 0.8 else round(one / 2, 2)


def accept(cli_subprocess, tmp_path, spec, name, *options):
    r = cli_subprocess("accept", "--spec", str(spec), "--out", str(tmp_path / name), "--format", "json", *options,
                       env=ONE_THREAD)
    return r.code, (json.loads(r.stdout) if r.stdout.strip() else {}), r.stderr


def fails(doc):
    return [v for v in doc.get("verdicts", []) if v["status"] == "FAIL"]


def test_a_run_under_half_a_core_fails_against_its_healthy_baseline(cli_subprocess, db_path, tmp_path):
    need_quota()
    code, healthy, err = accept(cli_subprocess, tmp_path, ALONE, "healthy")
    assert code == 0, err[-3000:]
    cores, groups = half_a_core(), set(cgroup.list_groups())
    cmd = [sys.executable, "-m", "dlscale.cli.app", "accept", "--spec", str(ALONE), "--out", str(tmp_path / "held"),
           "--format", "json"]
    r = cgroup.run_in_quota(cmd, cores, capture_output=True, text=True, env={**os.environ, **ONE_THREAD}, timeout=600)
    assert set(cgroup.list_groups()) == groups  # the group went with the run
    assert r.returncode == 1, r.stderr[-3000:]
    (v,) = fails(json.loads(r.stdout))  # two ranks at a quarter of a core each, against two whole cores or so
    assert (v["check"], v["subject"], v["expectation"]) == ("train_alone", "cpu", "baseline")
    # the size of the regression and its significance, against the healthy run
    assert v["ratio"] < 0.6 and v["test"]["p"] < 0.01 and healthy["acceptance_id"] in v["source"]
    assert re.match(r"\d+\.\d% below the baseline: past the 10% fail line, significant \(p = ", v["reason"]), v


def test_the_node_under_half_the_quota_is_named_the_outlier(cli_subprocess, db_path, tmp_path):
    need_netns()
    need_quota()
    q = half_a_core()
    before, groups = set(netns.list_namespaces()), set(cgroup.list_groups())
    code, doc, err = accept(cli_subprocess, tmp_path, ALONE, "nodes", "--emulate-nodes", "2",
                            "--node-cpu-quota", f"0={q:g},1={q / 2:g}")
    assert namespaces_left(before) == [] and set(cgroup.list_groups()) == groups
    assert code == 1, err[-3000:]
    bad = fails(doc)
    assert [(v["check"], v["subject"], v["expectation"]) for v in bad] == [("train_alone", "node 1", "peers")], bad
    assert bad[0]["ratio"] < 0.75 and bad[0]["test"]["p"] < 0.01
    assert [v["status"] for v in doc["verdicts"] if v["subject"] == "node 0"] == ["PASS"]


def test_a_link_ten_times_slower_fails_the_collectives_across_nodes_and_names_it(cli_subprocess, db_path, tmp_path):
    need_netns()
    before = set(netns.list_namespaces())
    nodes = ("--emulate-nodes", "3", "--link-bandwidth", "1gbit")
    code, healthy, err = accept(cli_subprocess, tmp_path, NODES, "healthy", *nodes)
    assert code == 0, (fails(healthy), err[-3000:])
    code, doc, err = accept(cli_subprocess, tmp_path, NODES, "slow", *nodes, "--node-link-bandwidth", "2=100mbit")
    assert namespaces_left(before) == []
    assert code == 1, err[-3000:]
    coll = [v for v in fails(doc) if v["check"] == "collectives_nodes"]
    assert [v["expectation"] for v in coll] == ["baseline"] and coll[0]["ratio"] < 0.5
    assert coll[0]["related"][0] == "node 2's link is below expectation, the other nodes' links are not"
    links = [v for v in fails(doc) if v["check"] == "links"]
    assert {v["subject"] for v in links} == {"node 2's link"} and all(v["ratio"] < 0.3 for v in links)
