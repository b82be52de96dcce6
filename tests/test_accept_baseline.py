"""What an acceptance's figures may be held to as a baseline, and one acceptance at a time per host: a
baseline of other options (another model) is no expectation naming the option; acceptances that
measured at the same time are nobody's baseline; the host's lock holds a second acceptance back and
dies with its process; the outputs' default folder is beside the results database. Hand-built
records in a fresh store, judged as `dlscale accept` judges them; nothing is measured."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

import accept_records as ar
from dlscale.accept.sources import baseline as expect
from dlscale.accept.running import host_lock as lock
from dlscale.accept import acceptance as run
from dlscale.accept.plan import spec
from dlscale.errors import UsageError
from dlscale.paths import beside_db
from dlscale.store import Store

CPU = {"hostname": "cpu-box"}


def check_run(model: str, throughput: float, when: str, end: str | None = None):
    """A `train` check's short-test record on one CPU (no healthy figure, no datasheet, no peers)."""
    r = ar.rec("train", model, {"model": model, "parallel": "ddp", "batch_size": 16, "image_size": 32,
                                "precision": "fp32", "steps": 15, "world_size": 1},
               {"throughput": throughput, "world_size": 1, "samples_per_step": 16},
               {"step_times_s": [ar.spread(16 / throughput, 15)]},
               {"throughput": "images/s"}, sys=CPU)
    r.created_at, r.finished_at = when, end or when
    return r


def conclude(db, recs, tmp_path, baseline=None, out=True):
    """Store ``recs`` under a new acceptance id and conclude it as `dlscale accept` does."""
    acc_id = run.new_acceptance_id()
    with Store.open(db) as s:
        for r in recs:
            r.tag = acc_id
            s.insert(r)
    plan = types.SimpleNamespace(checks=[types.SimpleNamespace(check="train", options={"model": recs[0].workload})],
                                 not_run=[])
    return run.conclude(acc_id, spec.builtin(True), plan, recs, "cpu-box", run.Against(baseline=baseline),
                        str(tmp_path / acc_id) if out else None, str(db), inventory=CPU)


def test_a_baseline_of_another_model_is_no_expectation_naming_the_option(db_path, tmp_path, cli):
    resnet = conclude(db_path, [check_run("resnet18", 100.0, "2026-11-01T10:00:00.000+00:00")], tmp_path)
    tiny = conclude(db_path, [check_run("tinycnn", 2790.0, "2026-11-02T10:00:00.000+00:00")], tmp_path,
                    baseline=f"tag:{resnet.id}")
    (v,) = tiny.verdicts
    assert v.status == "NO EXPECTATION" and v.ratio is None  # not PASS at 27.9x
    assert f"acceptance {resnet.id}" in v.reason and "workload resnet18" in v.reason and "tinycnn" in v.reason
    # the same model against it is judged (the filter is what differs, not the selector)
    again = conclude(db_path, [check_run("resnet18", 99.0, "2026-11-03T10:00:00.000+00:00")], tmp_path,
                     baseline=f"tag:{resnet.id}")
    assert [(v.status, v.expectation) for v in again.verdicts] == [("PASS", "baseline")]
    assert again.verdicts[0].test["runs"] == 1  # the acceptance's runs counted once, not again as tagged runs
    # judged again from the store, with the baseline named then
    r = cli("accept", "judge", tiny.id, "--baseline", f"tag:{resnet.id}", "--format", "json")
    (doc,) = json.loads(r.stdout)["verdicts"]
    assert r.code == 0 and doc["status"] == "NO EXPECTATION" and "workload resnet18" in doc["reason"]


def test_options_compare_as_values_whatever_their_spelling():
    assert expect.differences({"precision": ["fp32", "bf16"], "steps": 15}, {"precision": "fp32,bf16", "steps": 15.0}) == ""
    assert expect.differences({"precision": ["fp32"]}, {"precision": "fp32"}) == ""
    assert expect.differences({"image_size": 16, "model": "a"}, {"image_size": 32, "model": "a"}) == \
        "image_size 32 (this run: 16)"
    assert expect.differences({"image_size": 16}, {}) == ""  # an option one run does not record is not compared


def test_acceptances_that_measured_at_the_same_time_are_nobodys_baseline(db_path, tmp_path):
    early = conclude(db_path, [check_run("resnet18", 100.0, "2026-11-01T10:00:00.000+00:00")], tmp_path)
    # two at once: each measured the other's load, both slow
    a = conclude(db_path, [check_run("resnet18", 75.0, "2026-11-02T10:00:00.000+00:00",
                                     "2026-11-02T10:10:00.000+00:00")], tmp_path)
    b = conclude(db_path, [check_run("resnet18", 76.0, "2026-11-02T10:05:00.000+00:00",
                                     "2026-11-02T10:12:00.000+00:00")], tmp_path)
    (vb,) = b.verdicts
    assert early.id in vb.source and a.id not in vb.source  # b's baseline is not a, which overlapped it
    with Store.open(db_path) as s:  # with only the overlapping pair before it: no baseline, and why
        base = expect.find_baseline(s, "cpu-box", a.record.config["suite_hash"], {vb.key}, exclude=early.id,
                                    this=("2026-11-04T00:00:00", "2026-11-04T01:00:00"))
    assert not base.figures and "ran at the same time as acceptance" in base.notes[vb.key]
    later = conclude(db_path, [check_run("resnet18", 101.0, "2026-11-03T10:00:00.000+00:00")], tmp_path)
    (v,) = later.verdicts
    assert v.status == "PASS" and v.test["runs"] == 1 and early.id in v.source
    assert a.id not in v.source and b.id not in v.source  # neither poisons the next one's baseline
    assert expect.overlaps(("1", "3"), ("2", "4")) and not expect.overlaps(("1", "2"), ("2", "3"))


HOLD = """
import sys, time
from dlscale.accept.running import host_lock as lock
with lock.host_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_acceptance_waits_or_is_refused_and_the_lock_dies_with_its_process(monkeypatch, tmp_path):
    import threading

    monkeypatch.setenv(lock.LOCK_DIR_ENV, str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, "accept-first"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=f"acceptance accept-first \\(pid {holder.pid}\\) is running on this host"):
            with lock.host_lock("accept-second", wait=False):
                pass
        got = threading.Event()

        def second():
            with lock.host_lock("accept-second"):
                got.set()

        t = threading.Thread(target=second, daemon=True)
        t.start()
        assert not got.wait(0.5)  # it waits while the first holds the lock
        holder.kill()  # killed outright: the kernel drops its lock
        holder.wait()
        assert got.wait(30)
        t.join(30)
    finally:
        holder.kill()
        holder.wait()
    with lock.host_lock("accept-third", wait=False) as path:  # free again, and the file names its last holder
        assert json.loads(path.read_text())["acceptance"] == "accept-third"


def test_a_second_acceptance_waits_at_most_its_share_of_the_budget_and_says_for_whom(cli, db_path, monkeypatch,
                                                                                      tmp_path):
    """A level-1 health check behind a level 3 waited without limit (and Slurm killed it at 60 s): now a third
    of its budget at most, then one line naming the holder, exit 1, nothing measured or recorded; the wait
    counts against the budget its checks get."""
    from dlscale.accept.plan import suite

    holder = subprocess.Popen([sys.executable, "-c", HOLD, "accept-level3"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(lock.HostBusy, match=f"acceptance accept-level3 \\(pid {holder.pid}\\) held this host's "
                                                "acceptance lock .* for the 0.3 s"):
            with lock.host_lock("accept-level1", wait_s=0.3):
                pass
        monkeypatch.setattr(suite, "run_check", lambda *a, **k: pytest.fail("a check ran"))
        (tmp_path / "l1.yaml").write_text("name: l1\nbudget: 1.5\nchecks:\n  inventory: {}\n")
        r = cli("accept", "--spec", str(tmp_path / "l1.yaml"))
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("error:", "dlscale accept: waiting"))]
        assert r.code == 1 and lines == [
            f"dlscale accept: waiting for acceptance accept-level3 (pid {holder.pid}) to finish on this host (lock "
            f"{lock.lock_path()}, at most 0.5 s)",
            f"error: acceptance accept-level3 (pid {holder.pid}) held this host's acceptance lock ({lock.lock_path()}) "
            "for the 0.5 s this acceptance's budget leaves for waiting: nothing was measured; run it again when that "
            "one has finished"], r.stderr
        assert not db_path.exists() or Store.open(db_path).query() == []
    finally:
        holder.kill()
        holder.wait()
    now = [10.0]  # 10 s waited of a budget of 30: the first check gets the 20 left
    asked = {}

    def fake_run(p, sp, acc, db, limit, why=""):
        from dlscale.accept.running import check_process as bounded

        asked[p.check] = (limit, why)
        return bounded.CheckResult(p.check, [], 0.0, limit)

    from dlscale.accept.running import check_process as bounded

    monkeypatch.setattr(bounded, "run", fake_run)
    sp = spec.Spec("s", {"inventory": {}}, budget_s=30.0)
    run.run_bounded([suite.PlannedCheck("inventory", {}, [])], sp, "acc", None, clock=lambda: now[0], t0=0.0)
    assert asked["inventory"] == (20.0, " (what was left of the suite's budget of 30 s)")


def test_accept_holds_the_lock_while_its_checks_run(db_path, monkeypatch):
    from dlscale.accept.plan import suite

    class Stop(Exception):
        pass

    seen = []

    def run_bounded(checks, sp, tag, db, t0=None):  # each check in its own process, all under the acceptance's lock
        with pytest.raises(UsageError, match=f"acceptance {tag}"):
            with lock.host_lock("accept-other", wait=False):
                pass
        seen.append(tag)
        raise Stop

    planned = suite.Plan([suite.PlannedCheck("gemm", {}, [])], [], suite.MachineFacts())
    monkeypatch.setattr(suite, "plan", lambda *a, **k: planned)
    monkeypatch.setattr(run, "run_bounded", run_bounded)
    with pytest.raises(Stop):
        run.accept(spec.builtin(True), db=str(db_path))
    assert len(seen) == 1
    with lock.host_lock("accept-after", wait=False):  # released when the acceptance ended, here by an error
        pass


def test_outputs_default_to_a_folder_beside_the_results_database(db_path, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path / "..")
    acc = conclude(db_path, [check_run("resnet18", 100.0, "2026-11-01T10:00:00.000+00:00")], tmp_path, out=False)
    assert acc.out_dir == beside_db(db_path, "acceptances") / acc.id == tmp_path / "acceptances" / acc.id
    assert (acc.out_dir / "report.html").is_file() and not (tmp_path / ".." / acc.id).exists()
    assert str(acc.out_dir) in capsys.readouterr().err


def test_an_interrupted_acceptance_says_what_it_kept_and_frees_the_host(cli, db_path, monkeypatch):
    """Ctrl-C in the second check: exit 130, one line naming the acceptance, its kept run and what to do."""
    from dlscale.accept.running import check_process as bounded
    from dlscale.accept.plan import suite

    def run_check(p, sp, tag, db, limit_s, why=""):  # each check's own process, as bounded.run starts it
        if p.check == "memory":
            raise KeyboardInterrupt
        r = check_run("resnet18", 100.0, "2026-11-01T10:00:00.000+00:00")
        r.kind, r.workload, r.tag = "micro", "gemm", tag
        with Store.open(db) as s:
            s.insert(r)
        return bounded.CheckResult(p.check, [r], 0.1, limit_s)

    planned = suite.Plan([suite.PlannedCheck("gemm", {}, []), suite.PlannedCheck("memory", {}, [])], [], suite.MachineFacts())
    monkeypatch.setattr(suite, "plan", lambda *a, **k: planned)
    monkeypatch.setattr(bounded, "run", run_check)
    res = cli("accept", "--quick")
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    with Store.open(db_path) as s:
        (kept,) = s.query()
    assert res.code == 130 and line == (
        f"error: interrupted: acceptance {kept.tag} kept 1 run(s) of gemm (the interrupted check's as failed) and "
        f"judged nothing; `dlscale results list --tag {kept.tag}` lists them; run the same `dlscale accept` again "
        "for the verdicts")
    with lock.host_lock("accept-next", wait=False):  # the lock went with the interrupted acceptance
        pass


def inventory_run(gpus: int, when: str, cpus: int = 64):
    r = ar.rec("inventory", "node", {}, {"gpus": gpus, "nvml_gpus": gpus, "cpus": cpus, "memory_gib": 503.2},
               {"gpu_names": [ar.GPU] * gpus}, sys=CPU)
    r.created_at = r.finished_at = when
    return r


def test_the_inventory_is_held_to_the_nodes_last_sound_acceptance_never_a_later_or_unsound_one(db_path, tmp_path, cli):
    first = conclude(db_path, [inventory_run(8, "2026-11-01T10:00:00.000+00:00")], tmp_path)
    assert {v.figure: v.status for v in first.verdicts}["GPUs"] == "NO EXPECTATION"  # nothing before it
    lost = conclude(db_path, [inventory_run(7, "2026-11-02T10:00:00.000+00:00")], tmp_path)  # a GPU fell off the bus
    gpus = next(v for v in lost.verdicts if v.figure == "GPUs")
    assert (gpus.status, gpus.expected, gpus.expectation) == ("FAIL", 8, "baseline") and lost.exit_code == 1
    assert gpus.reason == f"7 GPUs, 1 fewer than at acceptance {first.id} (2026-11-01)"
    # the acceptance that FAILed its inventory is nobody's baseline: the next one is held to the first one still
    still = conclude(db_path, [inventory_run(7, "2026-11-03T10:00:00.000+00:00")], tmp_path)
    assert f"acceptance {first.id}" in next(v for v in still.verdicts if v.figure == "GPUs").reason
    mended = conclude(db_path, [inventory_run(8, "2026-11-04T10:00:00.000+00:00")], tmp_path)
    assert {v.figure: v.status for v in mended.verdicts}["GPUs"] == "PASS"
    # judged again, the first acceptance has still nothing before it (the later ones are not its baseline)
    r = cli("accept", "judge", first.id, "--format", "json")
    doc = {v["figure"]: v for v in json.loads(r.stdout)["verdicts"]}
    assert r.code == 0 and doc["GPUs"]["status"] == "NO EXPECTATION", r.stdout
    # and the one that lost a GPU, judged again, is held to the first one as it was then
    r = cli("accept", "judge", lost.id, "--format", "json")
    doc = {v["figure"]: v for v in json.loads(r.stdout)["verdicts"]}
    assert r.code == 1 and doc["GPUs"]["status"] == "FAIL" and first.id in doc["GPUs"]["reason"]
