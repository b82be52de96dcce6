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
