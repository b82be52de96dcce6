"""Atomic per-epoch checkpoints, and kill-then-resume reaching the same result as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from dlscale.errors import UsageError  # noqa: E402
from dlscale.tta import checkpoint  # noqa: E402


def test_save_and_load(tmp_path):
    p = checkpoint.save_atomic({"config_key": "k", "epoch": 3, "w": torch.ones(2)}, tmp_path / "ck")
    assert p == tmp_path / "ck" / "last.pt"
    state = checkpoint.load(tmp_path / "ck", "k")
    assert state["epoch"] == 3 and torch.equal(state["w"], torch.ones(2))
    assert [f.name for f in (tmp_path / "ck").iterdir()] == ["last.pt"]  # no temporary file left


def test_load_refuses_missing_or_other_config(tmp_path):
    with pytest.raises(UsageError, match="no checkpoint"):
        checkpoint.load(tmp_path, "k")
    checkpoint.save_atomic({"config_key": "k", "epoch": 1}, tmp_path)
    with pytest.raises(UsageError, match="another config"):
        checkpoint.load(tmp_path, "other")


def test_a_truncated_checkpoint_is_refused_naming_the_file(tmp_path):
    p = checkpoint.save_atomic({"config_key": "k", "epoch": 1, "model": {}, "optimizer": {}, "elapsed_s": 1.0,
                                "w": torch.ones(1000)}, tmp_path)
    whole = p.read_bytes()
    p.write_bytes(whole[: len(whole) // 2])  # a copy cut short, a disk that filled up
    with pytest.raises(UsageError, match=f"{p} is not a readable checkpoint") as e:
        checkpoint.load(tmp_path, "k")
    assert "zip" not in str(e.value).split("(")[0]  # the reason follows the file, PyTorch's words only in brackets
    with pytest.raises(UsageError, match="not a readable checkpoint"):
        checkpoint.check_readable(p)
    torch.save(["not", "a", "training", "state"], p)
    with pytest.raises(UsageError, match="holds no dlscale training state"):
        checkpoint.load(tmp_path, "k")


def test_resume_from_a_truncated_checkpoint_is_one_line_exit_2(cli, digits_root, tmp_path, db_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "last.pt").write_bytes(b"PK\x03\x04" + b"\0" * 100)  # the start of a zip and nothing else
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--target-top1", "0.9", "--checkpoint-dir", str(ck),
              "--resume")
    assert res.code == 2, res.stderr
    assert f"{ck / 'last.pt'} is not a readable checkpoint" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_the_progress_mark_tells_the_time_lost_after_a_checkpoint(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(checkpoint, "MARK_INTERVAL_S", 0.02)
    clock = [10.0]
    mark = checkpoint.ProgressMark(tmp_path, "k", lambda: clock[0]).start()
    state = {"config_key": "k", "elapsed_s": 10.0}
    clock[0] = 13.5  # the run works on past its checkpoint at 10 s ...
    deadline = time.monotonic() + 10
    while checkpoint.lost_after(tmp_path, state) < 3.5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert checkpoint.lost_after(tmp_path, state) == pytest.approx(3.5)  # ... and is killed: the mark has it
    clock[0] = 14.0
    mark.stop()  # a failure writes the mark at once
    assert checkpoint.lost_after(tmp_path, state) == pytest.approx(4.0)
    assert checkpoint.lost_after(tmp_path, {"config_key": "other", "elapsed_s": 10.0}) == 0.0
    assert checkpoint.lost_after(tmp_path, {"config_key": "k", "elapsed_s": 20.0}) == 0.0  # a mark older than it
    assert checkpoint.lost_after(tmp_path / "none", state) == 0.0


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("disk full")


def test_failed_write_keeps_previous_checkpoint(tmp_path):
    checkpoint.save_atomic({"config_key": "k", "epoch": 1}, tmp_path)
    with pytest.raises(RuntimeError, match="disk full"):
        checkpoint.save_atomic({"config_key": "k", "epoch": 2, "bad": _Unpicklable()}, tmp_path)
    assert checkpoint.load(tmp_path, "k")["epoch"] == 1
    assert [f.name for f in tmp_path.iterdir()] == ["last.pt"]


def _tta_args(data, ckpt, db):
    return ["tta", "tinycnn", "--data", str(data), "--image-size", "16", "--target-top1", "1.0",
            "--max-epochs", "4", "--threads", "1", "--seed", "3", "--checkpoint-dir", str(ckpt),
            "--db", str(db), "--format", "json"]


@pytest.mark.slow
@pytest.mark.long
def test_kill_at_epoch_2_then_resume_matches_uninterrupted(digits_root, tmp_path, cli):
    """SIGKILL once the epoch-2 checkpoint exists; --resume then ends where an uninterrupted run ends."""
    db = tmp_path / "r.db"
    ck = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", *_tta_args(digits_root, ck, db)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        killed_after = None
        while time.monotonic() < deadline and proc.poll() is None:
            if (ck / "last.pt").exists():
                epoch = torch.load(ck / "last.pt", weights_only=False)["epoch"]
                if epoch >= 2:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed_after = epoch
                    break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert killed_after is not None and killed_after < 4, "the run was not killed between epoch 2 and the end"

    resumed = cli(*_tta_args(digits_root, ck, db), "--resume")
    assert resumed.code == 0, resumed.stderr
    whole = cli(*_tta_args(digits_root, tmp_path / "whole", db))
    assert whole.code == 0, whole.stderr

    import json

    r, w = json.loads(resumed.stdout), json.loads(whole.stdout)
    assert r["metrics"]["resumed_from_epoch"] == killed_after
    assert r["metrics"]["resume_gap"] > 0
    assert [c["epoch"] for c in r["raw"]["curve"]] == [1, 2, 3, 4]
    assert [c["top1"] for c in r["raw"]["curve"]] == [c["top1"] for c in w["raw"]["curve"]]
    assert r["metrics"]["final_top1"] == w["metrics"]["final_top1"]
    assert r["raw"]["curve"][-1]["train_loss"] == pytest.approx(w["raw"]["curve"][-1]["train_loss"], rel=1e-6)


def test_resume_needs_a_checkpoint_dir(cli, digits_root, db_path):
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--target-top1", "0.9", "--resume")
    assert res.code == 2 and "--checkpoint-dir" in res.stderr


def test_resume_without_checkpoint_is_usage_error(cli, digits_root, tmp_path, db_path):
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--target-top1", "0.9",
              "--checkpoint-dir", str(tmp_path / "empty"), "--resume")
    assert res.code == 2 and "no checkpoint" in res.stderr
