"""dlscale sweep: schema errors with their place, expansion, failures recorded, kill -9 and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import marked_processes, marked_ranks, survivors_of_kill_9
from dlscale.errors import UsageError
from dlscale.store import Store
from dlscale.sweep import spec

TINY = "fixed: {model: tinycnn, image_size: 32, warmup_steps: 1, steps: 2}\n"


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, expect", [
    ("name: t\nmatrix:\n  model: [tinycnn\n  batch_size: [4]\n", "sweep.yaml:4:13: malformed YAML"),
    ("name: t\nmatrix:\n  model: [tinycnn]\n  batchsize: [4]\n", "sweep.yaml:4: matrix.batchsize: unknown field 'batchsize'"),
    ("name: t\nmatrics:\n  model: [tinycnn]\n", "sweep.yaml:2: matrics: unknown field 'matrics'"),
    ("name: t\nmatrix:\n  model: [tinycnn]\n  batch_size: [4, four]\n", "sweep.yaml:4: matrix.batch_size.1: expected an integer"),
    ("name: t\nmatrix:\n  model: [tinycnn, resnet5]\n", "sweep.yaml:3: matrix.model.1: unknown model 'resnet5'"),
    ("name: t\nfixed: {db: x.db}\nmatrix:\n  model: [tinycnn]\n", "sweep.yaml:2: fixed.db: 'db' is set by the sweep"),
    ("name: t\nmatrix:\n  model: tinycnn\n", "sweep.yaml:3: matrix.model: must be a non-empty list"),
    ("name: t\ncommand: predict\nmatrix:\n  model: [tinycnn]\n", "sweep.yaml:2: command: unknown command 'predict'"),
])
def test_bad_files_give_one_line_naming_the_place(cli, db_path, tmp_path, text, expect):
    r = cli("sweep", str(_write(tmp_path, text)), "--dry-run")
    assert r.code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], r.stderr


def test_expansion_exclusions_includes_and_stable_hashes(tmp_path):
    text = ("name: grid\n" + TINY + "matrix:\n  batch_size: [4, 8, 16]\n  channels_last: [true, false]\n"
            "exclude:\n  - {batch_size: 16, channels_last: false}\ninclude:\n  - {batch_size: 2, timeout_per_run: 9}\n"
            "  - {batch_size: 4, channels_last: true}\n")
    sw = spec.load(_write(tmp_path, text))
    assert sw.excluded == 1 and len(sw.points) == 6  # 3x2 - 1 excluded + 1 include (the other repeats a point)
    assert sw.points[-1].timeout_s == 9 and sw.points[0].timeout_s == spec.DEFAULT_TIMEOUT_S
    assert sw.points[0].argv == ("train", "tinycnn", "--image-size", "32", "--warmup-steps", "1", "--steps", "2",
                                 "--batch-size", "4", "--channels-last", "--tag", "grid")
    assert "--no-channels-last" in sw.points[1].argv
    # the hash depends on the options, not on their order or on the file
    reordered = ("name: grid\nmatrix:\n  channels_last: [true, false]\n  batch_size: [4, 8, 16]\n" + TINY)
    sw2 = spec.load(_write(tmp_path, reordered, "other.yaml"))
    assert len({p.hash for p in sw.points}) == 6
    assert len({p.hash for p in sw2.points} & {p.hash for p in sw.points}) == 5  # all but the excluded one


def test_dry_run_lists_points_as_json(cli, db_path, tmp_path):
    r = cli("sweep", str(_write(tmp_path, "name: d\n" + TINY + "matrix:\n  batch_size: [4, 8]\n")), "--dry-run",
            "--format", "json")
    assert r.code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["done"] for p in doc["points"]] == [False, False]
    assert doc["points"][1]["command"].startswith("dlscale train tinycnn") and "--batch-size 8" in doc["points"][1]["command"]
    assert Store.open(db_path).count() == 0  # nothing ran


def test_a_one_point_sweep_says_one_point(cli, db_path, tmp_path):
    r = cli("sweep", str(_write(tmp_path, "name: one\n" + TINY + "matrix:\n  batch_size: [4]\n")), "--dry-run")
    assert r.code == 0, r.stderr
    assert "sweep one: 1 point (0 excluded by exclude:)" in " ".join(r.stdout.split()) and "1 points" not in r.stdout


def test_a_priced_sweep_says_what_its_runs_cost(cli, db_path, tmp_path):
    priced = "fixed: {model: tinycnn, image_size: 32, warmup_steps: 1, steps: 2, price_per_hour: 3.6}\n"
    f = str(_write(tmp_path, "name: p\n" + priced + "matrix:\n  batch_size: [4]\n"))
    plan = json.loads(cli("sweep", f, "--dry-run", "--format", "json").stdout)
    assert all("--price-per-hour 3.6" in p["command"] for p in plan["points"])
    r = cli("sweep", f)
    assert r.code == 0, r.stderr
    with Store.open(db_path) as s:
        recs = s.query(tag="p")
    assert len(recs) == 1
    for rec in recs:  # one CPU host at 3.6 $/h for the run's whole time: 0.001 $ a second
        assert rec.metrics["cost_of_run"] == pytest.approx(3.6 / 3600 * rec.raw["cost"]["wall_s"])
    total = sum(rec.metrics["cost_of_run"] for rec in recs)
    assert f"cost of the sweep's runs: {total:.4g} $ over 1 priced run " in " ".join(r.stdout.split())
    bad = _write(tmp_path, "name: b\n" + priced.replace("3.6", "-1") + "matrix:\n  batch_size: [4]\n", "bad.yaml")
    r = cli("sweep", str(bad), "--dry-run")
    assert r.code == 2 and "bad.yaml:2:" in r.stderr and "--price-per-hour must be a finite price per device-hour > 0" in r.stderr


def test_dry_run_shows_the_timeout_per_run_that_would_apply(cli, db_path, tmp_path):
    f = str(_write(tmp_path, "name: d\n" + TINY + "matrix:\n  batch_size: [4]\ninclude:\n  - {batch_size: 8, timeout_per_run: 9}\n"))
    r = cli("sweep", f, "--dry-run", "--timeout-per-run", "42", "--format", "json")
    assert r.code == 0, r.stderr
    assert [p["timeout_s"] for p in json.loads(r.stdout)["points"]] == [42, 42]  # the option overrides the file
    assert "42 s" in cli("sweep", f, "--dry-run", "--timeout-per-run", "42").stdout
    for bad in ("0", "-3", "nan", "inf"):
        r = cli("sweep", f, "--dry-run", "--timeout-per-run", bad)
        assert r.code == 2 and r.stderr.strip() == f"error: --timeout-per-run must be a number of seconds > 0, got {bad}"


def _records_by_point(db: Path) -> dict[str, list]:
    out: dict[str, list] = {}
    with Store.open(db) as s:
        for r in s.query():
            out.setdefault(r.raw.get("sweep_point"), []).append(r)
    return out


@pytest.mark.slow
@pytest.mark.long
def test_a_crash_and_a_timeout_are_recorded_and_the_sweep_goes_on(tmp_path):
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1":
        pytest.skip("vm.overcommit_memory=1 would let the out-of-memory point allocate instead of failing at once")
    db = tmp_path / "runs.db"
    text = ("name: crashy\n" + TINY + "matrix:\n  batch_size: [4, 8]\ninclude:\n"
            "  - {batch_size: 200000000}\n"                      # 2.4 TB of input: the allocation fails
            "  - {steps: 1000000, timeout_per_run: 3}\n")       # far too many steps for 3 s: killed
    sw = spec.load(_write(tmp_path, text))
    p = subprocess.run([sys.executable, "-m", "dlscale.cli.app", "sweep", str(tmp_path / "sweep.yaml"), "--db", str(db)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr
    assert "2 of 4 points failed" in p.stderr
    recs = _records_by_point(db)
    assert set(recs) == {pt.hash for pt in sw.points} and all(len(v) == 1 for v in recs.values())
    status = {pt.options.get("batch_size", pt.options.get("steps")): recs[pt.hash][0] for pt in sw.points}
    assert status[4].status == "ok" and status[8].status == "ok" and status[8].tag == "crashy"
    assert status[200000000].status == "failed" and "out of memory" in status[200000000].error
    assert status[1000000].status == "failed" and "timed out after 3 s" in status[1000000].error


def _alive_with(point_hash: str) -> list[int]:
    """Processes whose environment carries this sweep point (the point's process, if still running)."""
    return marked_processes(f"DLSCALE_SWEEP_POINT={point_hash}")


@pytest.mark.slow
@pytest.mark.long
def test_kill_9_mid_sweep_then_resume_runs_every_point_exactly_once(tmp_path):
    db = tmp_path / "runs.db"
    f = _write(tmp_path, "name: killed\n" + TINY + "matrix:\n  batch_size: [4, 8]\n")
    sw = spec.load(f)
    cmd = [sys.executable, "-m", "dlscale.cli.app", "sweep", str(f), "--db", str(db)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists() and sum(len(v) for v in _records_by_point(db).values()) >= 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(1.0)
    assert all(not _alive_with(p.hash) for p in sw.points), "a point outlived the killed sweep"
    before = _records_by_point(db)
    assert len(before) == 1
    dry = subprocess.run(cmd + ["--resume", "--dry-run", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert sum(p["done"] for p in json.loads(dry.stdout)["points"]) == len(before)
    p = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    after = _records_by_point(db)
    assert set(after) == {pt.hash for pt in sw.points}
    assert all(len(v) == 1 and v[0].status == "ok" for v in after.values())
    assert {k: v[0].run_id for k, v in before.items()} == {k: after[k][0].run_id for k in before}


@pytest.mark.slow
def test_kill_9_of_a_sweep_takes_a_points_torchrun_and_ranks_with_it(tmp_path):
    f = _write(tmp_path, "name: ranks\nfixed: {model: tinycnn, image_size: 32, warmup_steps: 0, steps: 100000, "
                         "nproc_per_node: 2, threads_per_rank: 1, device: cpu}\nmatrix:\n  batch_size: [4]\n")
    cmd = [sys.executable, "-m", "dlscale.cli.app", "sweep", str(f), "--db", str(tmp_path / "r.db")]
    left = survivors_of_kill_9(cmd, lambda marker: len(marked_ranks(marker)) == 2)
    assert not left, f"outlived the sweep: {left}"


def test_resume_takes_a_points_latest_record(tmp_path):
    from dlscale.record import RunRecord
    from dlscale.sweep.driver import finished_points

    sw = spec.load(_write(tmp_path, "name: twice\n" + TINY + "matrix:\n  batch_size: [4, 8]\n"))
    requeued, late = sw.points

    def rec(point, created, finished, error=None):
        r = RunRecord(kind="train", workload="tinycnn", config=dict(point.options), raw={"sweep_point": point.hash},
                      created_at=f"2026-01-01T{created}.000+00:00", finished_at=f"2026-01-01T{finished}.000+00:00")
        if error:
            r.fail(error)
        return r

    with Store.open(tmp_path / "r.db") as s:
        # recorded lost by the submitter, then Slurm requeued the job, which ran again and recorded itself
        s.insert(rec(requeued, "10:00:00", "10:00:00", "Slurm job 7 UNKNOWN without recording a run"))
        again = rec(requeued, "10:05:00", "10:09:00")
        # a run that started before the submitter gave it up and recorded itself after
        own = rec(late, "09:50:00", "10:30:00")
        for r in (again, own, rec(late, "10:00:00", "10:00:00", "Slurm job 8 UNKNOWN without recording a run")):
            s.insert(r)
        done = finished_points(s, sw)
    assert done[requeued.hash] == (again.run_id, "ok", None)
    assert done[late.hash] == (own.run_id, "ok", None)


def test_a_command_that_records_several_runs_is_one_outcome():
    from dlscale.sweep.driver import _record_from_stdout

    two = json.dumps([{"run_id": "a", "status": "ok"}, {"run_id": "b", "status": "failed", "error": "oom"}])
    assert _record_from_stdout(two) == {"run_id": "a,b", "status": "failed", "error": "oom"}
    assert _record_from_stdout(json.dumps({"run_id": "a", "status": "ok"}))["status"] == "ok"
    assert _record_from_stdout("not json") is None and _record_from_stdout("") is None


def _load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(UsageError) as e:
        spec.load(_write(tmp_path, text))
    return str(e.value)


def test_a_point_is_checked_by_its_typed_config_at_its_line(tmp_path):
    err = _load_error(tmp_path, "name: t\n" + TINY + "matrix:\n  batch_size: [4, 0]\n")
    assert err.startswith(f"{tmp_path / 'sweep.yaml'}:4: matrix.batch_size.1: --batch-size must be > 0, got 0"), err
    err = _load_error(tmp_path, "name: t\n" + TINY + "include:\n  - {batch_size: 4}\n  - {nproc_per_node: 0}\n")
    assert err.startswith(f"{tmp_path / 'sweep.yaml'}:5: include.1.nproc_per_node: --nproc-per-node must be >= 1, got 0"), err
    err = _load_error(tmp_path, "name: t\nfixed: {model: tinycnn, timeout: 0}\nmatrix:\n  batch_size: [4]\n")
    assert err.startswith(f"{tmp_path / 'sweep.yaml'}:2: fixed.timeout: --timeout must be > 0 seconds"), err


def test_a_micro_kind_takes_only_the_fields_it_reads(tmp_path):
    err = _load_error(tmp_path, "name: m\ncommand: micro\nfixed: {kind: gemm}\nmatrix:\n  sizes: [1M]\n")
    assert err.startswith(f"{tmp_path / 'sweep.yaml'}:5: matrix.sizes.0: micro gemm does not read sizes; it reads"), err
    err = _load_error(tmp_path, "name: m\ncommand: micro\nmatrix:\n  kind: [memory]\n  nproc_per_node: [2]\n")
    assert ":5: matrix.nproc_per_node.0: micro memory does not read nproc_per_node" in err, err
    err = _load_error(tmp_path, "name: m\ncommand: micro\nmatrix:\n  kind: [gemm, matmul]\n")
    assert ":4: matrix.kind.1: unknown microbenchmark 'matmul'" in err, err
    err = _load_error(tmp_path, "name: m\ncommand: micro\nmatrix:\n  kind: [gemm]\n  precision: [fp32, fp8]\n")
    assert ":5: matrix.precision.1: unknown --precision 'fp8'" in err, err
    err = _load_error(tmp_path, "name: m\ncommand: micro\nmatrix:\n  kind: [collectives]\n  iters: [0]\n")
    assert ":5: matrix.iters.0: collectives need --iters >= 1" in err, err


def test_micro_collectives_on_emulated_nodes_validates_and_runs_as_typed(tmp_path):
    text = ("name: m\ncommand: micro\nfixed: {kind: collectives, sizes: 1M:4M, emulate_nodes: 2, link_bandwidth: 1gbit}\n"
            "matrix:\n  iters: [5]\n")
    (point,) = spec.load(_write(tmp_path, text)).points
    assert point.argv == ("micro", "collectives", "--sizes", "1M:4M", "--emulate-nodes", "2", "--link-bandwidth",
                          "1gbit", "--iters", "5", "--tag", "m")
    gemm = spec.load(_write(tmp_path, "name: g\ncommand: micro\ninclude:\n"
                                      "  - {kind: gemm, precision: [fp32, bf16], full: true, iters: 3}\n"
                                      "  - {kind: conv, channels_last: false, full: false, case_budget: 0.2}\n"))
    assert gemm.points[0].argv == ("micro", "gemm", "--precision", "fp32,bf16", "--full", "--iters", "3", "--tag", "g")
    assert gemm.points[1].argv == ("micro", "conv", "--no-channels-last", "--case-budget", "0.2", "--tag", "g")


def test_micro_links_with_a_node_set_apart_validates_and_runs_as_typed(tmp_path):
    text = ("name: l\ncommand: micro\nfixed: {kind: links, sizes: 2M, emulate_nodes: 3, link_bandwidth: 1gbit}\n"
            "matrix:\n  node_link_bandwidth: ['2=100mbit', [1=10mbit, 2=100mbit]]\n")
    points = spec.load(_write(tmp_path, text)).points
    assert [p.argv[-4:] for p in points] == [("--node-link-bandwidth", "2=100mbit", "--tag", "l"),
                                             ("--node-link-bandwidth", "1=10mbit,2=100mbit", "--tag", "l")]
    assert points[0].argv[:3] == ("micro", "links", "--sizes")
    err = _load_error(tmp_path, "name: l\ncommand: micro\nmatrix:\n  kind: [links]\n  emulate_nodes: [2]\n"
                                "  node_cpu_quota: [2=0.5]\n")
    assert ":6: matrix.node_cpu_quota.0: --node-cpu-quota names node 2" in err, err


def test_the_sweep_does_not_import_the_cli():
    src = Path(__file__).resolve().parent.parent / "src" / "dlscale" / "sweep"
    from test_layering import cli_imports

    assert not [hit for f in src.glob("*.py") for hit in cli_imports(f)]


# -- config: FILE (the YAML of `dlscale train --config`, e.g. what `dlscale tune` wrote) ---------------

BEST = "model: tinycnn\nbatch_size: 16\nprecision: bf16\nchannels_last: false\nthreads_per_rank: 1\n"


def test_a_config_file_merges_under_the_points_own_keys(tmp_path):
    _write(tmp_path, BEST, "best.yaml")
    _write(tmp_path, "batch_size: 2\ncompile_mode: max-autotune\noptimizer_impl: fused\n", "other.yaml")
    text = ("name: c\nfixed: {config: best.yaml, image_size: 32, channels_last: true}\nmatrix:\n  batch_size: [4]\n"
            "include:\n  - {model: tinycnn}\n  - {config: other.yaml, model: tinycnn}\n")
    sw = spec.load(_write(tmp_path, text))
    by = [p.options for p in sw.points]
    # the matrix's batch size and fixed's channels_last win over the file; the file fills the rest
    assert by[0] == {"model": "tinycnn", "batch_size": 4, "precision": "bf16", "channels_last": True,
                     "threads_per_rank": 1, "image_size": 32, "tag": "c"}
    assert by[1]["batch_size"] == 16 and by[1]["precision"] == "bf16"  # the point takes its model and batch from it
    assert by[2]["batch_size"] == 2 and by[2]["compile_mode"] == "max-autotune" and "precision" not in by[2]
    assert "--compile-mode" in sw.points[2].argv and "--optimizer-impl" in sw.points[2].argv
    assert "config" not in by[0] and "--threads-per-rank" in sw.points[0].argv


def test_config_file_problems_name_both_places(tmp_path):
    _write(tmp_path, "batch_size: 8\nprecison: bf16\n", "bad.yaml")
    with pytest.raises(UsageError, match=r"sweep\.yaml:1: fixed\.config: .*bad\.yaml:2: precison: unknown field"):
        spec.load(_write(tmp_path, "fixed: {config: bad.yaml, model: tinycnn}\nmatrix:\n  steps: [2]\n"))
    _write(tmp_path, BEST, "best.yaml")
    with pytest.raises(UsageError, match=r"sweep\.yaml:3: include\.0\.config: .*is for model 'tinycnn', not 'resnet18'"):
        spec.load(_write(tmp_path, "name: t\ninclude:\n  - {config: best.yaml, model: resnet18}\n"))
    with pytest.raises(UsageError, match=r"include\.0\.config: .*cannot read it"):
        spec.load(_write(tmp_path, "name: t\ninclude:\n  - {config: missing.yaml, model: tinycnn}\n"))
    with pytest.raises(UsageError, match=r"sweep\.yaml:3: matrix\.config\.0: expected the name of"):
        spec.load(_write(tmp_path, "name: t\nmatrix:\n  config: [3]\n"))
    # a value from the file that its point cannot take: the error points at the config: line
    _write(tmp_path, "model: tinycnn\nprecision: tf64\n", "prec.yaml")
    with pytest.raises(UsageError, match=r"sweep\.yaml:2: fixed\.config: unknown --precision 'tf64'"):
        spec.load(_write(tmp_path, "name: t\nfixed: {config: prec.yaml}\ninclude:\n  - {steps: 2}\n"))


def test_new_train_knobs_are_sweep_fields(tmp_path):
    text = ("name: k\nfixed: {model: tinycnn, steps: 2}\nmatrix:\n  compile_mode: [max-autotune]\n"
            "  optimizer_impl: [foreach, fused]\n")
    sw = spec.load(_write(tmp_path, text))
    argv = sw.points[1].argv
    assert argv[argv.index("--compile-mode") + 1] == "max-autotune" and argv[argv.index("--optimizer-impl") + 1] == "fused"
    ddp = ("name: d\nfixed: {model: tinycnn, ddp_static_graph: true, ddp_broadcast_buffers: true, "
           "ddp_grad_as_bucket_view: false}\nmatrix:\n  nproc_per_node: [2]\n")
    argv = spec.load(_write(tmp_path, ddp, "d.yaml")).points[0].argv
    assert {"--ddp-static-graph", "--ddp-broadcast-buffers", "--no-ddp-grad-as-bucket-view"} <= set(argv)
    one = "name: d\nfixed: {model: tinycnn}\nmatrix:\n  ddp_bucket_mb: [10]\n"
    with pytest.raises(UsageError, match=r"d1\.yaml:4: matrix\.ddp_bucket_mb\.0: --ddp-bucket-mb applies to"):
        spec.load(_write(tmp_path, one, "d1.yaml"))


@pytest.mark.parametrize("args", [
    ["sweep", "{f}", "--dry-run"],
    ["accept", "--spec", "{f}"],
    ["train", "tinycnn", "--config", "{f}"],
    ["train", "tinycnn", "--systems-file", "{f}"],
    ["accept", "--quick", "--refs", "{f}"],
])
def test_a_yaml_file_that_is_not_utf8_is_one_line_naming_it(cli, db_path, tmp_path, args):
    """Every YAML file goes through one reader (yamlfile.compose_yaml): Latin-1 bytes are bad input, not a crash."""
    f = tmp_path / "latin1.yaml"
    f.write_bytes("name: x\n# caf\u00e9 notes\nmatrix: {}\n".encode("latin-1"))
    res = cli(*[a.format(f=f) for a in args])
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and line == f"error: {f}:2: not UTF-8 text (byte 0xe9 at offset 13); save the file as UTF-8"


def test_progress_eta_comes_from_the_wall_clock_so_points_run_at_once_do_not_add_up(monkeypatch, capsys):
    """Slurm runs a sweep's points at the same time: two 60 s points that ended together 60 s after the
    start leave an ETA of 60 s for the other two, not the 120 s their own times would add up to."""
    from types import SimpleNamespace

    from dlscale.cli.common import Format
    from dlscale.cli.sweep import _Progress

    monkeypatch.delenv("DLSCALE_QUIET", raising=False)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    prog = _Progress(4, Format.json)
    clock[0] += 60.0
    for i in range(2):
        prog.done(SimpleNamespace(status="ok", seconds=60.0, error=None, point=SimpleNamespace(index=i, label=f"p{i}")))
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("(60.0 s; eta 180 s)")  # one of four done after 60 s
    assert err[1].endswith("(60.0 s; eta 60 s)")  # two of four after the same 60 s
