"""The CLI contract: one-line errors, exit 2 for bad input, 1 for failed runs (recorded), lazy torch."""

import json
import subprocess
import sys

import pytest

from conftest import has_cuda


def _one_error_line(res):
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert "Traceback" not in res.stderr
    return errors[0]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "nosuchnet"], "known models: alexnet"),
        (["train", "tinycnn", "--batch-size", "0"], "--batch-size must be > 0"),
        (["train", "tinycnn", "--batch-size", "-3"], "--batch-size must be > 0"),
        (["train", "tinycnn", "--batch-size", "many"], "batch-size"),
        (["train", "tinycnn", "--steps", "0"], "--steps must be > 0"),
        (["train", "tinycnn", "--warmup-steps", "-1"], "--warmup-steps must be >= 0"),
        (["train", "tinycnn", "--repeat", "0"], "--repeat must be > 0"),
        (["train", "tinycnn", "--precision", "fp8"], "unknown --precision 'fp8'"),
        (["train", "tinycnn", "--optimizer", "lbfgs"], "unknown --optimizer"),
        (["train", "alexnet", "--image-size", "32"], "too small for alexnet"),
        (["train", "tinycnn", "--device", "tpu"], "unknown --device"),
        (["train"], "give MODEL (e.g. dlscale train resnet50"),
        (["nosuchcommand"], "No such command"),
        (["results", "show", "does-not-exist"], "no run"),
        (["results", "list", "--limit", "0"], "--limit must be >= 1 (rows to list, newest first), got 0"),
        (["results", "list", "--limit", "-1"], "--limit must be >= 1 (rows to list, newest first), got -1"),
        # past any real run: refused where the config is built, not run for ever or recorded as failed
        (["train", "tinycnn", "--steps", "100000000000000000000"],
         "--steps must be <= 1,000,000 (steps of one short test), got 100,000,000,000,000,000,000"),
        (["train", "tinycnn", "--image-size", "1000000000"], "--image-size must be <= 16,384 (pixels a side)"),
        (["infer", "tinycnn", "--image-size", "1000000000"], "--image-size must be <= 16,384 (pixels a side)"),
        (["infer", "tinycnn", "--iters", "10000000"], "--iters must be <= 1,000,000 (iterations of a measurement)"),
        (["micro", "gemm", "--iters", "10000000"], "--iters must be <= 1,000,000 (calls of one case)"),
        (["tta", "tinycnn", "--target-top1", "0.9", "--max-epochs", "1000000"],
         "--max-epochs must be <= 100,000 (epochs of one run)"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, db_path, args, needle):
    from dlscale.store import Store

    Store.open(db_path).close()  # an empty database, there for the commands that only read
    res = cli(*args)
    assert res.code == 2, (res.code, res.stderr)
    assert needle in _one_error_line(res)


@pytest.mark.parametrize("args, line", [
    (["tune", "tinycnn", "--budget", "nan"], "--budget must be a finite number, got nan"),  # it never ran out
    (["tune", "tinycnn", "--budget", "inf"], "--budget must be a finite number, got inf"),
    (["train", "tinycnn", "--lr", "inf"], "--lr must be a finite number, got inf"),  # it failed at step 1
    (["train", "tinycnn", "--batch-size", "99999999999999999999"],  # it started, overflowed, recorded a failure
     "--batch-size must be <= 2,147,483,648 (samples of one batch), got 99,999,999,999,999,999,999"),
    (["train", "tinycnn", "--seed", "99999999999999999999"],
     "--seed must be <= 9,223,372,036,854,775,807 (the largest whole number an option takes, int64), got "
     "99,999,999,999,999,999,999"),
    (["results", "list", "--limit", "-99999999999999999999"],
     "--limit must be >= -9,223,372,036,854,775,807 (the smallest whole number an option takes, int64), got "
     "-99,999,999,999,999,999,999"),
    (["train", "tinycnn", "--batch-size", "4611686018427387904"],  # 2^62: torch's storage size overflowed
     "--batch-size must be <= 2,147,483,648 (samples of one batch), got 4,611,686,018,427,387,904"),
    (["infer", "tinycnn", "--batch-sizes", "1,99999999999999999999"],
     "--batch-sizes must be <= 2,147,483,648 (samples of one batch), got 99,999,999,999,999,999,999"),
    (["infer", "tinycnn", "--scenario", "server", "--target-qps", "inf"], "--target-qps must be a finite number, got inf"),
    (["tta", "tinycnn", "--lr", "nan"], "--lr must be a finite number, got nan"),
    (["micro", "collectives", "--budget", "inf"], "--budget must be a finite number, got inf"),
    (["data", "/nonexistent", "--target-rate", "-inf"], "--target-rate must be a finite number, got -inf"),
    (["serve-bench", "http://127.0.0.1:9", "--model", "m", "--burstiness", "nan"],
     "--burstiness must be a finite number, got nan"),
    (["serve-bench", "http://127.0.0.1:9", "--model", "m", "--requests", "5000000"],
     "--requests must be <= 1,000,000 (requests of one load point), got 5,000,000"),
    (["sweep", "x.yaml", "--timeout-per-run", "inf"], "--timeout-per-run must be a number of seconds > 0, got inf"),
])
def test_non_finite_and_past_any_limit_numbers_are_refused_before_anything_runs(cli, db_path, args, line):
    res = cli(*args)
    assert res.code == 2 and _one_error_line(res) == f"error: {line}", res.stderr
    assert not db_path.exists()  # nothing ran, nothing was recorded


def test_every_numeric_option_of_every_command_is_checked():
    """The check sits on every int and float option as it is parsed (cli/badinput.guard_numbers), not on a list."""
    import typing

    import typer

    from dlscale.cli.app import app
    from dlscale.cli.badinput import guard_numbers
    from dlscale.errors import UsageError

    command = typer.main.get_command(app)
    guard_numbers(command)
    seen = 0

    def walk(c):
        nonlocal seen
        for sub in (getattr(c, "commands", None) or {}).values():
            walk(sub)
        for p in c.params:
            kind = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            if not {kind, *typing.get_args(kind)} & {int, float}:
                continue
            seen += 1
            bad = float("nan") if float in {kind, *typing.get_args(kind)} else 10**20
            with pytest.raises(UsageError, match=p.opts[0] if p.opts else p.name.upper()):
                p.callback(None, p, bad)
            good = 1.5 if bad != 10**20 else 3
            assert p.callback(None, p, good) == good

    walk(command)
    assert seen > 150  # every command's


def test_the_typed_configs_refuse_them_too():
    from dlscale import api
    from dlscale.config import TrainConfig
    from dlscale.errors import UsageError
    from dlscale.serve.config import ServeConfig

    with pytest.raises(UsageError, match="--lr must be a finite number, got inf"):
        TrainConfig(model="tinycnn", lr=float("inf"))
    with pytest.raises(UsageError, match="--momentum must be a finite number, got nan"):
        TrainConfig(model="tinycnn", momentum=float("nan"))
    with pytest.raises(UsageError, match="--budget must be a finite number, got nan"):
        api.tune("tinycnn", budget_s=float("nan"))
    with pytest.raises(UsageError, match="--slo-ttft must be a finite number"):
        ServeConfig(url="http://h:1", model="m", slo_ttft=float("inf"))
    assert ServeConfig(url="http://h:1", model="m", rates="inf").rates == (float("inf"),)  # all at once: a rate


@pytest.mark.parametrize("args, line", [
    (["train", "tinycnn", "--steps", "abc"], "--steps 'abc': give a whole number"),
    (["train", "tinycnn", "--steps", "1.5"], "--steps '1.5': give a whole number"),
    (["train", "tinycnn", "--lr", "fast"], "--lr 'fast': give a number"),
    (["tune", "tinycnn", "--budget", "1e"], "--budget '1e': give a number"),
    (["results", "list", "--format", "xml"], "--format 'xml': choose one of human, json"),
    (["report", "--format", "pdf"], "--format 'pdf': choose one of html, md, both"),
    (["micro", "gemm", "--iters", "z"], "--iters 'z': give a whole number"),
])
def test_bad_option_values_are_worded_by_dlscale_not_the_validation_library(cli, db_path, args, line):
    res = cli(*args)
    assert res.code == 2 and _one_error_line(res) == f"error: {line}"
    assert "Input should be" not in res.stderr and "Value error" not in res.stderr


def test_precision_unsupported_on_this_device(cli, db_path):
    if has_cuda():
        pytest.skip("this machine has a GPU, where tf32 may be supported")
    res = cli("train", "tinycnn", "--precision", "tf32", "--steps", "1")
    assert res.code == 2 and "tf32 needs a CUDA device" in _one_error_line(res)


def test_cuda_requested_without_gpu(cli, db_path):
    if has_cuda():
        pytest.skip("this machine has a GPU")
    res = cli("train", "tinycnn", "--device", "cuda")
    assert res.code == 2 and "no CUDA device" in _one_error_line(res)


def test_unwritable_db_is_a_usage_error(cli, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    res = cli("train", "tinycnn", "--steps", "1", "--db", str(blocker / "sub" / "r.db"))
    assert res.code == 2 and "results database" in _one_error_line(res)
    res = cli("results", "list", "--db", str(tmp_path))
    assert res.code == 2 and "is a directory" in _one_error_line(res)


def test_out_of_memory_is_recorded_as_failed(cli, db_path):
    # The synthetic batch alone would need ~20 TB: the allocator refuses at once.
    res = cli("train", "tinycnn", "--batch-size", "100000", "--image-size", "4096", "--steps", "1",
              "--warmup-steps", "0", "--format", "json")
    assert res.code == 1
    assert "out of memory" in _one_error_line(res) and "lower --batch-size" in res.stderr
    rec = json.loads(res.stdout)
    assert rec["status"] == "failed" and "out of memory" in rec["error"]
    listed = json.loads(cli("results", "list", "--format", "json").stdout)
    assert [r["status"] for r in listed] == ["failed"] and listed[0]["run_id"] == rec["run_id"]


def test_nan_loss_is_recorded_as_failed(cli, db_path):
    res = cli("train", "tinycnn", "--lr", "1e30", "--warmup-steps", "0", "--steps", "6", "--batch-size", "8")
    assert res.code == 1
    line = _one_error_line(res)
    assert "loss became" in line and "lower --lr" in line
    rec = json.loads(cli("results", "list", "--format", "json").stdout)[0]
    assert rec["status"] == "failed"


def test_debug_env_shows_the_traceback(db_path):
    from conftest import run_dlscale

    res = run_dlscale("train", "tinycnn", "--batch-size", "0", env={"DLSCALE_DEBUG": "1"})
    assert res.code == 2 and "Traceback" in res.stderr


def _imports_torch(*args: str) -> bool:
    code = (
        "import sys\nfrom dlscale.cli.app import main\n"
        f"try:\n    main({list(args)!r})\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('TORCH=%s' % ('torch' in sys.modules))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return "TORCH=True" in p.stderr


def test_help_and_results_list_do_not_import_torch(db_path):
    assert not _imports_torch("--help")
    assert not _imports_torch("train", "--help")
    assert not _imports_torch("results", "list")
    assert not _imports_torch("models")


def test_models_lists_the_zoo(cli):
    res = cli("models", "--format", "json")
    names = {m["name"] for m in json.loads(res.stdout)}
    assert {"resnet50", "vgg16", "vgg19", "inception_v3", "inception_v4", "googlenet", "alexnet",
            "resnet18", "tinycnn"} <= names


def test_reading_commands_refuse_a_database_that_is_not_there_and_writing_ones_create_it(cli, tmp_path):
    typo = tmp_path / "resluts.db"
    for args in (["results", "list"], ["results", "show", "x"], ["results", "export", "--format", "json"],
                 ["results", "history", "kind:accept"], ["results", "push", "--to", str(tmp_path / "team.db")],
                 ["compare", "tag:a", "tag:b"], ["report", "--out", str(tmp_path / "rep")],
                 ["accept", "judge", "accept-x"]):
        res = cli(*args, "--db", str(typo))
        assert res.code == 2 and f"no results database at {typo}" in _one_error_line(res), (args, res.stderr)
    assert not typo.exists() and not (tmp_path / "team.db").exists()  # nothing made at the mistyped path
    res = cli("import", "--ref", "seed001-table5", "--db", str(typo))  # a command that writes makes it
    assert res.code == 0, res.stderr
    assert typo.exists() and cli("results", "list", "--db", str(typo)).code == 0
