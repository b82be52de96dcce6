"""Every domain beyond image classification, end to end through the CLI: a run SIGKILLed once its
epoch-2 checkpoint exists and then resumed ends with the same curve (so the same epoch count to
any target) as the uninterrupted run; two gloo ranks reach the target with the speed-up split."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

EPOCHS = 5
# domain -> (model, made-dataset scale or None for RL, tta options keeping each epoch short, an unreachable target)
DOMAINS = {
    "detection": ("detector_tiny", 0.12, ["--batch-size", "8"], "1.0"),
    "translation": ("transformer_tiny", 0.1, ["--batch-size", "32"], "100"),
    "recommendation": ("ncf", 0.2, ["--batch-size", "1024"], "1.0"),
    "llm": ("llama_tiny", 0.04, ["--batch-size", "16", "--seq-len", "32"], "0.0"),
    "reinforcement": ("ppo_mlp", None, ["--batch-size", "512"], "501"),
}


def _args(model: str, data: str, extra: list[str], target: str, ck, db) -> list[str]:
    return ["tta", model, "--data", data, "--target", target, "--max-epochs", str(EPOCHS), "--threads", "1",
            "--checkpoint-dir", str(ck), "--db", str(db), "--format", "json", *extra]


def _kill_after_epoch(args: list[str], ck, epoch: int) -> int:
    """Start ``dlscale ARGS``; SIGKILL it once its checkpoint holds ``epoch`` epochs; the epoch it held."""
    import torch

    proc = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if (ck / "last.pt").exists():
                held = torch.load(ck / "last.pt", weights_only=False)["epoch"]
                if held >= epoch:
                    os.killpg(proc.pid, signal.SIGKILL)
                    return held
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return -1


@pytest.mark.slow
@pytest.mark.parametrize("domain", list(DOMAINS))
@pytest.mark.long
def test_kill_then_resume_matches_the_uninterrupted_run(domain, tmp_path, cli):
    model, scale, extra, target = DOMAINS[domain]
    data = "CartPole-v1"
    if scale is not None:
        data = str(tmp_path / "data")
        made = cli("dataset", domain, data, "--scale", str(scale), "--seed", "0")
        assert made.code == 0, made.stderr
    db, ck = tmp_path / "r.db", tmp_path / "killed"
    killed_after = _kill_after_epoch(_args(model, data, extra, target, ck, db), ck, 2)
    assert 2 <= killed_after < EPOCHS, f"the run was not killed between epoch 2 and its end ({killed_after})"

    resumed = cli(*_args(model, data, extra, target, ck, db), "--resume")
    assert resumed.code == 0, resumed.stderr
    whole = cli(*_args(model, data, extra, target, tmp_path / "whole", db))
    assert whole.code == 0, whole.stderr
    r, w = json.loads(resumed.stdout), json.loads(whole.stdout)
    assert r["metrics"]["resumed_from_epoch"] == killed_after and r["metrics"]["resume_gap"] > 0
    assert [c["epoch"] for c in r["raw"]["curve"]] == list(range(1, EPOCHS + 1))
    assert [c["quality"] for c in r["raw"]["curve"]] == [c["quality"] for c in w["raw"]["curve"]]
    assert r["raw"]["curve"][-1]["train_loss"] == pytest.approx(w["raw"]["curve"][-1]["train_loss"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("domain, model, scale, extra, target", [
    ("recommendation", "ncf", 0.2, ["--batch-size", "512"], "0.4"),
    ("translation", "transformer_tiny", 0.1, ["--batch-size", "16", "--lr", "0.002"], "20"),
])
@pytest.mark.long
def test_two_gloo_ranks_reach_the_target_and_split_the_speedup(domain, model, scale, extra, target, tmp_path, cli,
                                                                db_path):
    """Two ranks on gloo (DDP) train one model to the target; the speed-up over the one-rank run of
    the same config splits into throughput and epochs (docs/METRICS.md)."""
    data = str(tmp_path / "data")
    assert cli("dataset", domain, data, "--scale", str(scale)).code == 0
    args = ["tta", model, "--data", data, "--target", target, "--max-epochs", "16", "--threads", "1",
            "--format", "json", *extra]
    one = cli(*args)
    assert one.code == 0, one.stderr
    two = cli(*args, "--nproc-per-node", "2")
    assert two.code == 0, two.stderr
    r1, r2 = json.loads(one.stdout), json.loads(two.stdout)
    m = r2["metrics"]
    assert m["reached_target"] is True and m["world_size"] == 2 and r2["config"]["family"] == domain
    assert m["global_batch"] == 2 * r1["metrics"]["global_batch"]
    assert m["steps_per_epoch"] in (r1["metrics"]["steps_per_epoch"] // 2, (r1["metrics"]["steps_per_epoch"] + 1) // 2)
    assert m["reference_run_id"] == r1["run_id"]
    assert m["speedup"] == pytest.approx(r1["metrics"]["time_to_target"] / m["time_to_target"])
    assert m["train_time_speedup"] == pytest.approx(m["throughput_speedup"] * m["epochs_ratio"])


@pytest.mark.slow
def test_runs_give_the_olympic_mean(tmp_path, cli, db_path):
    """--runs 3 in a domain beyond classification: three seeds, then MLPerf's olympic mean."""
    res = cli("tta", "ppo_mlp", "--target", "150", "--max-epochs", "15", "--threads", "1", "--runs", "3",
              "--format", "json")
    assert res.code == 0, res.stderr
    doc = json.loads(res.stdout)
    times = [r["metrics"]["time_to_target"] for r in doc["runs"]]
    assert [r["config"]["seed"] for r in doc["runs"]] == [0, 1, 2] and all(t is not None for t in times)
    assert doc["olympic"]["metrics"]["olympic_time_to_target"] == pytest.approx(sorted(times)[1])
