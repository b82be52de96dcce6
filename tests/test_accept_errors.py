"""Verdicts that fail closed (ERROR) and outputs that agree, on hand-built records (no processes).

A check whose run failed, ran past its time limit, recorded nothing or no figure, or whose figure is
not a positive finite number is ERROR: never PASS, never NO EXPECTATION, and exit 1. The terminal
table, the JSON document, the JUnit XML, the HTML report and the exit code say the same for every
verdict kind, read back through `dlscale accept judge` as a user would."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

import accept_records as ar
from accept_records import recorded
from dlscale.accept.figures import collect as figures
from dlscale.accept.nodehealth import inventory
from dlscale.accept.nodehealth import drain as nodehealth
from dlscale.accept import acceptance as run
from dlscale.accept.plan import spec
from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, PASS, WARN, exit_code, outcome


def judge(recs, missing=None, sp=None):
    return run.judge(recs, sp or spec.builtin(False), missing=missing)


def failed_inference():
    r = ar.rec("inference", "resnet50", {}, {}, status="failed")
    r.error = "RuntimeError: CUDA error: an illegal memory access was encountered"
    return r


# the records of an acceptance whose verdicts include KIND (peers judge train_alone; a lone train run
# has nothing to compare with; a failed run measured nothing)
KINDS = {
    PASS: lambda: [ar.alone(n=4)],
    WARN: lambda: [ar.alone(n=4, slow_gpu=1, slow=0.07)],
    FAIL: lambda: [ar.alone(n=4, slow_gpu=1, slow=0.25)],
    NO_EXPECTATION: lambda: [ar.train()],
    ERROR: lambda: [ar.alone(n=4), failed_inference()],
}
EXIT = {PASS: 0, WARN: 0, FAIL: 1, NO_EXPECTATION: 0, ERROR: 1}
JUNIT = {PASS: None, WARN: None, FAIL: "failure", NO_EXPECTATION: "skipped", ERROR: "error"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_table_json_junit_html_and_exit_code_agree_for_every_verdict_kind(kind, db_path, tmp_path, cli):
    acc = recorded(db_path, KINDS[kind]())
    assert kind in {v.status for v in acc.verdicts} and acc.outcome == kind
    table = cli("accept", "judge", acc.id, "--out", str(tmp_path / "out"))
    doc = json.loads(cli("accept", "judge", acc.id, "--format", "json").stdout)
    junit = ET.fromstring((tmp_path / "out" / "junit.xml").read_text())
    html = (tmp_path / "out" / "report.html").read_text()
    assert table.code == doc["exit_code"] == EXIT[kind] == acc.exit_code
    assert doc["outcome"] == kind and f"dlscale accept {acc.id}: {kind}" in table.stdout
    assert doc["counts"] == {s: sum(v["status"] == s for v in doc["verdicts"]) for s in doc["counts"]}
    cases = junit.find("testsuite").findall("testcase")
    statuses = [v["status"] for v in doc["verdicts"]]
    assert len(cases) == len(statuses) and html_verdicts(html) == statuses
    rows = [[c.strip() for c in line.split("│")] for line in table.stdout.splitlines() if line.startswith("│")]
    assert [r[4] for r in rows if r[1]] == statuses  # the table's verdict column, row by row
    for v, case in zip(doc["verdicts"], cases):
        want = JUNIT[v["status"]]
        got = [c.tag for c in case if c.tag != "system-out"]
        assert got == ([want] if want else []), (v["status"], got)
        assert case.find("system-out").text.startswith(v["status"])
    suite = junit.find("testsuite")
    assert int(suite.get("errors")) == doc["counts"][ERROR] and int(suite.get("failures")) == doc["counts"][FAIL]
    assert int(suite.get("skipped")) == doc["counts"][NO_EXPECTATION]
    assert f"<h1>dlscale acceptance {acc.id}: {kind}</h1>" in html
    if kind == WARN:  # a WARN fails only with warn_fails, in every output at once
        strict = cli("accept", "judge", acc.id, "--warn-fails", "--out", str(tmp_path / "strict"))
        junit = (tmp_path / "strict" / "junit.xml").read_text()
        assert strict.code == 1 and 'type="WARN"' in junit and json.loads(
            cli("accept", "judge", acc.id, "--warn-fails", "--format", "json").stdout)["exit_code"] == 1


def html_verdicts(html):
    """The verdict column of the report's verdict table, row by row."""
    import re

    table = html[html.index('id="verdicts"'):]
    table = table[table.index("<tbody>"):table.index("</tbody>")]
    return [re.sub("<[^>]+>", "", re.findall(r"<td[^>]*>.*?</td>", row)[3]) for row in table.split("<tr>")[1:]]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -5.0, "fast", None, True])
def test_a_figure_that_is_not_a_positive_finite_rate_is_an_error(value):
    bad = ar.train()
    bad.metrics["throughput"] = value
    vs = judge([bad])
    assert [v.status for v in vs] == [ERROR], [(v.status, v.reason) for v in vs]
    assert outcome(vs) == ERROR and exit_code(vs) == 1 and vs[0].measured is None


def test_a_sample_that_is_not_finite_is_dropped_and_the_figure_judged():
    r = ar.alone(n=4)
    r.raw["rank_step_times_s"][2][0][3] = math.nan
    figs, bad = figures.read([r])
    assert not bad and all(math.isfinite(x) for f in figs for x in f.samples)
    assert {v.status for v in judge([r])} == {PASS}


def test_a_record_its_reader_cannot_read_and_a_check_that_gave_no_figure_are_errors():
    broken = ar.gemm(n=8)
    del broken.raw["rows"][0]["tflops"]  # a field missing
    empty = ar.rec("inference", "resnet50", {}, {"scenario": "offline"})  # ran, measured nothing
    vs = judge([broken, empty])
    assert [(v.check, v.status) for v in vs] == [("gemm", ERROR), ("inference", ERROR)]
    assert "cannot be read (KeyError: 'tflops')" in vs[0].reason
    assert vs[1].reason == "its 1 run recorded no figure to judge"


def test_a_gpu_missing_from_an_every_gpu_check_is_an_error():
    rec = ar.gemm(n=8)
    rec.raw["rows"].pop(5), rec.raw["times_s"].pop(5)  # GPU 5 gave no row
    vs = judge([rec])
    errs = [v for v in vs if v.status == ERROR]
    assert [(v.subject, v.reason) for v in errs] == [("GPU 5", "no bf16 best rate figure for GPU 5 (7 of 8 GPUs "
                                                                "measured)")]
    assert {v.subject for v in vs if v.status == PASS} == {f"GPU {i}" for i in range(8) if i != 5}


def test_a_check_past_its_time_limit_is_an_error_naming_what_it_had_recorded():
    gemm, hung = ar.gemm(), ar.train()
    hung.fail("interrupted (Ctrl-C)")  # SIGTERM at the limit: the run in progress recorded itself as interrupted
    why = "ran past its time limit of 600 s and was killed with 4 processes"
    vs = judge([ar.alone(), gemm, hung], missing={"train": why})
    (err,) = [v for v in vs if v.check == "train"]  # one ERROR for the check, not one more for its interrupted run
    assert err.status == ERROR and err.reason == f"{why}; before that it recorded 1 run (0 ok)"
    assert err.run_ids == [hung.run_id]
    assert {v.status for v in vs if v.check in ("gemm", "train_alone")} == {PASS}  # measured before: judged
    # a check that did not finish but recorded ok runs first: those figures are judged, the check is ERROR
    vs = judge([gemm], missing={"gemm": "ran past its time limit of 10 s (what was left of the suite's budget)"})
    assert [v.status for v in vs].count(ERROR) == 1 and {v.subject for v in vs if v.status == PASS} == {
        f"GPU {i}" for i in range(8)}
    assert "recorded 1 run (1 ok, judged on their own)" in next(v.reason for v in vs if v.status == ERROR)


def test_nothing_judged_is_an_error_and_a_health_check_that_saw_no_gpu_too():
    assert outcome([]) == ERROR and exit_code([]) == 1
    empty = ar.health(n=0)
    empty.raw["note"] = "NVML answered but lists no GPU: nothing to check"
    (v,) = judge([empty])
    assert v.status == ERROR and "nothing was checked: NVML answered but lists no GPU" in v.reason


def test_an_unsound_expectation_is_an_error_not_a_verdict():
    from dlscale.accept.judging.verdict import Expectation, Thresholds, compare

    f = figures.Figure("gemm", "bf16 best rate", 700.0, "TFLOP/s", "r1", samples=[700.0] * 5)
    for value in (0.0, math.nan, math.inf):
        v = compare(f, Expectation("baseline", value, "acceptance X"), Thresholds())
        assert v.status == ERROR and v.expected is None and v.measured == 700.0


# -- the inventory --------------------------------------------------------------------------------------------
def inv(gpus=8, nvml=8, cpus=224, memory=2015.5, names=None, visible=None):
    return ar.rec("inventory", "node", {}, {"gpus": gpus, "nvml_gpus": nvml, "cpus": cpus, "memory_gib": memory},
                  {"gpu_names": names if names is not None else [ar.GPU] * gpus, "cuda_visible_devices": visible})


def by_figure(vs):
    return {v.figure: v.status for v in vs}


def test_the_inventory_against_the_spec_and_cuda_against_nvml():
    want = {"gpus": 8, "cpus": 224, "memory_gib": 2000, "gpu_model": "H100"}
    assert by_figure(inventory.verdicts(inv(), want)) == {"GPUs": PASS, "logical CPUs": PASS, "memory": PASS,
                                                          "GPU model": PASS, "CUDA devices vs NVML": PASS}
    lost = inventory.verdicts(inv(gpus=7), want)  # NVML lists 8 on the host, CUDA sees 7: one fell off
    assert by_figure(lost)["GPUs"] == FAIL and by_figure(lost)["CUDA devices vs NVML"] == FAIL
    assert "CUDA sees 7 of the 8 GPUs NVML lists" in next(v.reason for v in lost if v.figure == "CUDA devices vs NVML")
    hidden = inventory.verdicts(inv(gpus=2, visible="0,1"), {})  # CUDA_VISIBLE_DEVICES hides 6: not a fault
    assert by_figure(hidden) == {"GPUs": NO_EXPECTATION, "logical CPUs": NO_EXPECTATION, "memory": NO_EXPECTATION}
    other = inventory.verdicts(inv(cpus=256, names=[ar.GPU] * 7 + ["NVIDIA A100-SXM4-80GB"]), want)
    assert by_figure(other)["logical CPUs"] == WARN and by_figure(other)["GPU model"] == FAIL
    assert "GPU 7 is NVIDIA A100-SXM4-80GB, not H100" in next(v.reason for v in other if v.figure == "GPU model")


def test_an_item_the_spec_does_not_give_is_held_to_the_nodes_last_sound_acceptance():
    then = (inv(nvml=8, cpus=224, memory=2015.5), "acceptance accept-A (2026-11-01)")
    same = inventory.verdicts(inv(memory=1990.0), {}, last=then)  # memory 1.3% lower: the kernel's share moved
    assert by_figure(same) == {"GPUs": PASS, "logical CPUs": PASS, "memory": PASS, "CUDA devices vs NVML": PASS}
    assert {v.expectation for v in same if v.figure != "CUDA devices vs NVML"} == {"baseline"}
    gpu = next(v for v in same if v.figure == "GPUs")
    assert gpu.expected == 8 and gpu.source == "acceptance accept-A (2026-11-01): the node's inventory then"
    # one GPU gone from CUDA and NVML alike (fell off the bus): CUDA vs NVML cannot see it, the last acceptance does
    gone = inventory.verdicts(inv(gpus=7, nvml=7, cpus=112, memory=1763.6), {}, last=then)
    assert by_figure(gone) == {"GPUs": FAIL, "logical CPUs": FAIL, "memory": FAIL, "CUDA devices vs NVML": PASS}
    reasons = {v.figure: v.reason for v in gone}
    assert reasons["GPUs"] == "7 GPUs, 1 fewer than at acceptance accept-A (2026-11-01)"
    assert reasons["logical CPUs"] == "112 CPUs, 112 fewer than at acceptance accept-A (2026-11-01)"
    assert reasons["memory"] == "1763.6 GiB, 251.9 GiB less than at acceptance accept-A (2026-11-01)"  # 12.5%: a DIMM
    more = inventory.verdicts(inv(gpus=9, nvml=9), {}, last=then)
    assert by_figure(more)["GPUs"] == WARN and "1 more than at" in {v.figure: v.reason for v in more}["GPUs"]
    # the spec wins where it gives the item; what neither gives stays NO EXPECTATION
    spec_says = inventory.verdicts(inv(gpus=7, nvml=7), {"gpus": 7}, last=then)
    assert {v.figure: (v.status, v.expectation) for v in spec_says}["GPUs"] == (PASS, "spec")
    bare = ar.rec("inventory", "node", {}, {"gpus": 8}, {})
    assert by_figure(inventory.verdicts(inv(), {}, last=(bare, "acceptance accept-B (2026-11-02)")))["memory"] == \
        NO_EXPECTATION


def test_the_inventory_check_in_a_spec_names_a_bad_option_by_line(tmp_path):
    from dlscale.errors import UsageError

    p = tmp_path / "node.yaml"
    p.write_text("checks:\n  inventory:\n    gpus: eight\n")
    with pytest.raises(UsageError, match=r"node.yaml:3: checks.inventory.gpus: must be a number, got 'eight'"):
        spec.validate(spec.load(p), "inventory", spec.load(p).checks["inventory"])
    p.write_text("checks:\n  inventory: {gpus: 8, time_limit: 5}\n  gemm: {time_limit: -1}\n")
    with pytest.raises(UsageError, match=r"node.yaml:3: checks.gemm.time_limit: must be seconds"):
        spec.load(p)


# -- levels, time limits, budgets -----------------------------------------------------------------------------
def test_levels_have_their_checks_and_budgets_and_a_spec_its_own_limits(tmp_path):
    one, two, three = (spec.builtin(level=k) for k in (1, 2, 3))
    assert list(one.checks) == ["health", "inventory"] and one.budget_s < 60  # inside Slurm's 60 s kill
    assert list(two.checks) == list(spec.QUICK) == list(spec.builtin(True).checks) and two.name == "quick"
    assert set(spec.FULL) <= set(three.checks) and one.budget_s < two.budget_s < three.budget_s
    assert spec.level_of(True, None) == 2 and spec.level_of(False, None) is None
    from dlscale.errors import UsageError

    for quick, level in ((False, 4), (True, 1)):
        with pytest.raises(UsageError):
            spec.level_of(quick, level)
    p = tmp_path / "s.yaml"
    p.write_text("budget: 120\nchecks:\n  gemm: {time_limit: 30}\n  memory: {}\n")
    sp = spec.load(p)
    assert (sp.budget_s, sp.time_limit("gemm"), sp.time_limit("memory")) == (120, 30, spec.TIME_LIMIT_S["memory"])
    assert sp.checks["gemm"] == {} and spec.Spec.from_dict(sp.to_dict()).time_limit("gemm") == 30


def test_the_suite_runs_each_check_within_what_is_left_of_its_budget(monkeypatch):
    from dlscale.accept.running import check_process as bounded
    from dlscale.accept.plan import suite

    now = [0.0]
    took = {"health": 5.0, "inventory": 30.0, "memory": 1.0}
    asked = {}

    def fake_run(p, sp, acc_id, db, limit, why=""):
        asked[p.check] = (limit, why)
        now[0] += min(limit, took[p.check])
        return bounded.CheckResult(p.check, [], took[p.check], limit,
                           f"ran past its time limit of {limit:g} s{why}" if took[p.check] > limit else None)

    monkeypatch.setattr(bounded, "run", fake_run)
    sp = spec.Spec("s", {"health": {}, "inventory": {}, "memory": {}}, budget_s=30.0, time_limits={"inventory": 100.0})
    checks = [suite.PlannedCheck(c, {}, []) for c in sp.checks]
    _, missing, seconds = run.run_bounded(checks, sp, "acc", None, clock=lambda: now[0])
    assert asked["health"] == (spec.TIME_LIMIT_S["health"], "")
    assert asked["inventory"] == (25.0, " (what was left of the suite's budget of 30 s)")
    assert "memory" not in asked and missing == {
        "inventory": "ran past its time limit of 25 s (what was left of the suite's budget of 30 s)",
        "memory": "not started: the suite's budget of 30 s was spent"}
    assert seconds == {"health": 5.0, "inventory": 30.0}


# -- Slurm's node reason ---------------------------------------------------------------------------------------
def test_the_node_reason_is_one_ascii_line_of_at_most_255_bytes_worst_first():
    acc = run.Acceptance("accept-20261126T101500-1a2b3c4d", None, [], judge(
        [ar.alone(n=4, slow_gpu=1, slow=0.07), ar.health(thermal=3, n=4), failed_inference()]), [])
    why = nodehealth.reason(acc)
    assert why.startswith("dlscale: FAIL health health on GPU 3: ") and why.endswith(
        f" more; {acc.id})") and len(why.encode()) <= nodehealth.REASON_BYTES and why.isascii()
    next(v for v in acc.verdicts if v.status == FAIL).reason = "\u2192 " + "x" * 400 + "\nsecond line"
    why = nodehealth.reason(acc)
    assert len(why.encode()) == nodehealth.REASON_BYTES and "\n" not in why and why.isascii() and acc.id in why
