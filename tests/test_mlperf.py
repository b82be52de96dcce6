"""MLPerf logs: a small run's log passes the official compliance checker (run here); broken ones fail."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import sigint_default
from dlscale.tta import mlperf
from dlscale.tta.config import TTAConfig

EPOCHS = 8  # the interrupted run's: interrupted in epoch 3, it has five more to go, so it cannot end first
LARS_ARGS = ["--optimizer", "lars", "--lr", "16", "--lr-schedule", "poly", "--end-lr", "0.0001",
             "--warmup-epochs", "1", "--weight-decay", "0.0001"]


def _cfg(**kw):
    base = dict(model="tinycnn", data="/nonexistent", target_top1=0.9, max_epochs=5, optimizer="lars", lr=16,
                lr_schedule="poly", end_lr=0.0001, warmup_epochs=1)
    return TTAConfig(**{**base, **kw})


def test_closed_division_rules():
    cfg = _cfg()
    assert mlperf.closed_division_problems(cfg, cfg.schedule()) == []
    cfg = _cfg(weight_decay=0.0002)  # 1e-4 x 2^1 is allowed
    assert mlperf.closed_division_problems(cfg, cfg.schedule()) == []
    for bad, words in ((dict(weight_decay=0.0003), "weight decay"), (dict(lr_schedule="cosine", end_lr=0.0), "polynomial"),
                       (dict(end_lr=0.001), "end learning rate"), (dict(poly_power=1.0), "power 2"),
                       (dict(target_top1=0.5), "0.759")):
        cfg = _cfg(**bad)
        problems = mlperf.closed_division_problems(cfg, cfg.schedule())
        assert any(words in p for p in problems), (bad, problems)


@pytest.mark.slow
@pytest.mark.long
def test_small_run_log_passes_official_checker(cli, digits_root, tmp_path, db_path):
    log = tmp_path / "mlperf.log"
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--image-size", "16", "--target-top1", "0.9",
              "--max-epochs", "6", "--threads", "1", *LARS_ARGS, "--mlperf-log", str(log), "--format", "json")
    assert res.code == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["metrics"]["reached_target"] is True
    assert not any("closed-division" in w for w in rec["warnings"])
    lines = [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in log.read_text().splitlines() if ":::MLLOG" in ln]
    keys = [ln["key"] for ln in lines]
    assert keys.count("eval_accuracy") == rec["metrics"]["epochs_to_target"]
    accs = [ln["value"] for ln in lines if ln["key"] == "eval_accuracy"]
    assert all(0 <= a <= 1 for a in accs) and accs[-1] == pytest.approx(rec["metrics"]["final_top1"])
    assert lines[-1]["key"] == "run_stop" and lines[-1]["metadata"]["status"] == "success"
    by_key = {ln["key"]: ln["value"] for ln in lines}
    assert by_key["submission_benchmark"] == "resnet" and by_key["opt_name"] == "lars"
    assert by_key["global_batch_size"] == 32 and by_key["lars_opt_base_learning_rate"] == pytest.approx(2.0)
    ok, text = mlperf.check(str(log), str(tmp_path / "checker.log"))
    assert ok, text

    # the same log with run_stop removed, or with the LARS epsilon changed, must fail the checker
    broken = tmp_path / "broken.log"
    broken.write_text("\n".join(ln for ln in log.read_text().splitlines() if '"run_stop"' not in ln) + "\n")
    assert not mlperf.check(str(broken), str(tmp_path / "checker2.log"))[0]
    broken.write_text(log.read_text().replace('"key": "lars_epsilon", "value": 0.0', '"key": "lars_epsilon", "value": 0.1'))
    assert not mlperf.check(str(broken), str(tmp_path / "checker3.log"))[0]


def test_mlperf_log_warns_when_config_breaks_closed_rules(cli, digits_root, tmp_path, db_path):
    log = tmp_path / "m.log"
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--image-size", "16", "--target-top1", "0.8",
              "--max-epochs", "1", "--threads", "1", "--mlperf-log", str(log), "--format", "json")
    assert res.code == 0, res.stderr
    rec = json.loads(res.stdout)
    assert any("closed-division" in w and "polynomial" in w for w in rec["warnings"])
    assert not mlperf.check(str(log), str(tmp_path / "c.log"))[0]


@pytest.mark.slow
@pytest.mark.long
def test_an_interrupted_then_resumed_runs_log_passes_the_checker(cli, digits_root, tmp_path, db_path):
    """Ctrl-C in epoch 3 writes the attempt's run_stop (aborted); --resume cuts the log back to its
    epoch-2 checkpoint, so the log holds one run and passes; the lost part of epoch 3 is in the time."""
    import torch

    log, ck = tmp_path / "mlperf.log", tmp_path / "ck"
    args = ["tta", "tinycnn", "--data", str(digits_root), "--image-size", "16", "--target-top1", "0.99",
            "--max-epochs", str(EPOCHS), "--threads", "1", *LARS_ARGS, "--mlperf-log", str(log), "--checkpoint-dir", str(ck),
            "--db", str(db_path), "--format", "json"]
    err = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", *args], stdout=subprocess.DEVNULL, stderr=err,
                            preexec_fn=sigint_default)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if (ck / "last.pt").exists() and torch.load(ck / "last.pt", weights_only=False)["epoch"] >= 2:
                break
            time.sleep(0.02)
        sent = time.time()  # in epoch 3, with epochs to spare: the run cannot end first on a fast machine
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        ended = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    # exit 130 with one line: what was kept and how to go on
    assert proc.returncode == 130
    assert (tmp_path / "stderr.txt").read_text().strip().splitlines()[-1] == (
        f"error: interrupted: tta tinycnn: the run is recorded as interrupted; its last checkpoint is in {ck}: "
        "resume with the same command and --resume")
    state = torch.load(ck / "last.pt", weights_only=False)
    held = state["epoch"]
    assert 2 <= held < EPOCHS and '"status": "aborted"' in log.read_text()
    res = cli(*args, "--resume")
    assert res.code == 0, res.stderr
    m = json.loads(res.stdout)["metrics"]
    # the lost work is the interrupted attempt's clock past the held checkpoint: from its save to the
    # signal at least, to the process's end at most (derived from what happened, not from a machine's speed)
    assert m["resumed_from_epoch"] == held
    assert sent - state["saved_at"] - 0.05 <= m["lost_time"] <= ended - state["saved_at"] + 0.05
    keys = [json.loads(ln.split(":::MLLOG ", 1)[1])["key"] for ln in log.read_text().splitlines() if ":::MLLOG" in ln]
    assert keys.count("run_start") == keys.count("run_stop") == 1
    ok, text = mlperf.check(str(log), str(tmp_path / "checker.log"))
    assert ok, text[-2000:]


def test_an_mlperf_log_path_that_cannot_be_written_is_refused_before_the_run(cli, digits_root, tmp_path, db_path):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    cases = [(tmp_path, f"--mlperf-log {tmp_path} is a directory: give a file to write"),
             (tmp_path / "nowhere" / "m.log", f"no directory {tmp_path / 'nowhere'}; create it")]
    if os.geteuid() != 0:  # root writes anywhere: the unwritable directory is a case for users only
        cases.append((locked / "m.log", f"the directory {locked} is not writable"))
    try:
        for path, words in cases:
            r = cli("tta", "tinycnn", "--data", str(digits_root), "--target-top1", "0.9", "--max-epochs", "1",
                    "--mlperf-log", str(path))
            (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert r.code == 2 and words in line, r.stderr
    finally:
        locked.chmod(0o700)
    from dlscale.store import Store

    with Store.open(db_path) as s:
        assert s.query() == []  # refused before anything ran or was recorded
