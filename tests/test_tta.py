"""Time to accuracy on the digits: the target is reached and the curve recorded; olympic and speed-up arithmetic."""

from __future__ import annotations

import json

import pytest

from dlscale.errors import UsageError
from dlscale.tta.aggregate import olympic_mean, speedup_split
from dlscale.tta.config import TTAConfig

from conftest import requires_cuda

FAST = ["--image-size", "16", "--threads", "1"]


def test_olympic_mean_drops_fastest_and_slowest():
    assert olympic_mean([10, 12, 11, 50, 9]) == pytest.approx(11)  # drop 9 and 50: (10 + 11 + 12) / 3
    assert olympic_mean([3, 1, 2]) == pytest.approx(2)
    assert olympic_mean([None, 10, 11, 12, 13]) == pytest.approx(12)  # a miss is the slowest, dropped
    assert olympic_mean([None, None, 11, 12, 13]) is None  # two misses: no result
    with pytest.raises(ValueError):
        olympic_mean([1.0, 2.0])


@pytest.mark.parametrize("nodes, speedup, epochs, throughput_x", [
    (2, 1.8, 62, 1.830), (4, 3.3, 65, 3.516), (8, 4.9, 81, 6.507),  # hand: speedup * epochs / 61
])
def test_speedup_split_seed_003(nodes, speedup, epochs, throughput_x):
    # seed 003: 1.8x, 3.3x, 4.9x faster to 74.9% on 2, 4, 8 nodes, converging in 62, 65, 81 epochs
    # instead of 61. With T = E * S / X the throughput must have scaled by speedup * E_N / 61.
    s, x1 = 1.28e6, 1000.0
    xn = x1 * throughput_x
    split = speedup_split(61 * s / x1, x1, 61, epochs * s / xn, xn, epochs)
    assert split["speedup"] == pytest.approx(speedup, abs=2e-3)
    assert split["throughput_speedup"] == pytest.approx(throughput_x)
    assert split["epochs_ratio"] == pytest.approx(61 / epochs)
    assert split["train_time_speedup"] == pytest.approx(split["speedup"])


@pytest.mark.parametrize("kw, words", [
    (dict(target_top1=75.9), "fraction"), (dict(max_epochs=0), "--max-epochs"), (dict(optimizer="adam"), "--optimizer"),
    (dict(lr_schedule="0.4;10"), "--lr-schedule"), (dict(warmup_epochs=90), "--warmup-epochs"),
    (dict(label_smoothing=1.0), "--label-smoothing"), (dict(runs=3, resume=True, checkpoint_dir="x"), "--resume"),
])
def test_config_validation(kw, words):
    with pytest.raises(UsageError, match=words):
        TTAConfig(**{"model": "tinycnn", "data": "d", "target_top1": 0.9, **kw})


def test_bad_data_dir_is_usage_error(cli, tmp_path, db_path):
    res = cli("tta", "tinycnn", "--data", str(tmp_path / "none"), "--target-top1", "0.9", *FAST)
    assert res.code == 2 and "ImageNet layout" in res.stderr


def test_digits_dataset(digits_root):
    meta = json.loads((digits_root / "dlscale-digits.json").read_text())
    assert (meta["train"], meta["val"], meta["classes"]) == (1438, 359, 10)  # 1797 images, 20% held out per class
    assert sorted(p.name for p in (digits_root / "train").iterdir()) == [str(k) for k in range(10)]
    from torchvision.io import decode_jpeg, read_file

    img = decode_jpeg(read_file(str(next((digits_root / "val" / "3").iterdir()))))
    assert tuple(img.shape) == (3, 16, 16)


@pytest.mark.slow
def test_tta_reaches_target_and_records_curve(cli, digits_root, db_path):
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--target-top1", "0.9", "--target-top5", "0.98",
              "--max-epochs", "8", *FAST, "--format", "json")
    assert res.code == 0, res.stderr
    rec = json.loads(res.stdout)
    m, curve = rec["metrics"], rec["raw"]["curve"]
    assert rec["kind"] == "tta" and rec["status"] == "ok"
    assert m["reached_target"] is True and m["epochs_to_target"] == len(curve) == m["epochs_run"]
    last = curve[-1]
    assert last["top1"] >= 0.9 and last["top5"] >= 0.98 and all(c["top1"] < 0.9 or c["top5"] < 0.98 for c in curve[:-1])
    assert m["time_to_target"] == last["wall_s"] and m["time_to_target_train"] == last["train_s"]
    assert [c["epoch"] for c in curve] == list(range(1, len(curve) + 1))
    assert all(a["wall_s"] < b["wall_s"] for a, b in zip(curve, curve[1:]))
    # the clock's disjoint parts fit inside it; evaluation is recorded on its own
    assert m["train_time"] + m["eval_time"] + m["setup_time"] <= m["time_to_target"]
    assert m["eval_time"] == pytest.approx(sum(c["eval_s"] for c in curve))
    # top-1 is a count over the 359 validation images, each counted once
    assert all(abs(c["top1"] * 359 - round(c["top1"] * 359)) < 1e-6 for c in curve)
    assert m["samples_per_epoch"] == 44 * 32 and m["peak_lr"] == pytest.approx(0.1 * 32 / 256)
    # the linear-scaling rule is said when the run starts, with the value it applied
    assert "linear scaling: peak lr = --lr 0.1 x global batch 32 / 256 = 0.0125" in res.stderr
    assert m["throughput"] == pytest.approx(m["samples_per_epoch"] * len(curve) / m["train_time"])
    assert rec["units"]["time_to_target"] == "s" and rec["units"]["final_top1"] == "fraction"
    shown = cli("results", "show", rec["run_id"])
    assert shown.code == 0 and "time_to_target" in shown.stdout and "accuracy curve" in shown.stdout


@pytest.mark.slow
def test_runs_olympic_record(cli, digits_root, db_path):
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--target-top1", "0.8", "--max-epochs", "3", *FAST,
              "--runs", "3", "--eval-every", "2", "--format", "json")
    assert res.code == 0, res.stderr
    doc = json.loads(res.stdout)
    runs, oly = doc["runs"], doc["olympic"]
    assert [r["config"]["seed"] for r in runs] == [0, 1, 2]
    for r in runs:  # evaluated at epochs 2 and 3 only (every 2 and after the last)
        curve = r["raw"]["curve"]
        assert curve[0]["top1"] is None and curve[0]["eval_s"] is None and curve[0]["train_loss"] > 0
        assert r["metrics"]["epochs_to_target"] in (2, 3) and curve[-1]["top1"] >= 0.8
    times = sorted(r["metrics"]["time_to_target"] for r in runs)
    assert oly["kind"] == "tta_olympic" and oly["metrics"]["olympic_time_to_target"] == pytest.approx(times[1])
    assert oly["raw"]["run_ids"] == [r["run_id"] for r in runs]


@pytest.mark.slow
def test_two_rank_gloo_reaches_target_with_speedup(cli, digits_root, db_path):
    args = ["tta", "tinycnn", "--data", str(digits_root), "--target-top1", "0.9", "--max-epochs", "6", *FAST,
            "--format", "json"]
    one = cli(*args)
    assert one.code == 0, one.stderr
    two = cli(*args, "--nproc-per-node", "2")
    assert two.code == 0, two.stderr
    r1, r2 = json.loads(one.stdout), json.loads(two.stdout)
    m = r2["metrics"]
    assert m["reached_target"] is True and m["world_size"] == 2 and m["global_batch"] == 64
    assert m["peak_lr"] == pytest.approx(0.1 * 64 / 256)  # the linear scaling rule on the global batch
    assert m["samples_per_epoch"] == 22 * 64  # 1438 images shard into 719 per rank: 22 batches of 32
    curve = r2["raw"]["curve"]
    assert all(abs(c["top1"] * 359 - round(c["top1"] * 359)) < 1e-6 for c in curve)  # one result over all 359
    assert m["reference_run_id"] == r1["run_id"]
    assert m["speedup"] == pytest.approx(r1["metrics"]["time_to_target"] / m["time_to_target"])
    assert m["epochs_ratio"] == pytest.approx(r1["metrics"]["epochs_to_target"] / m["epochs_to_target"])
    assert m["train_time_speedup"] == pytest.approx(m["throughput_speedup"] * m["epochs_ratio"])


@requires_cuda
@pytest.mark.gpu
def test_tta_on_cuda_bf16(cli, digits_root, db_path):
    res = cli("tta", "tinycnn", "--data", str(digits_root), "--image-size", "16", "--target-top1", "0.9",
              "--max-epochs", "8", "--device", "cuda", "--precision", "bf16", "--format", "json")
    assert res.code == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["config"]["device"] == "cuda" and rec["metrics"]["reached_target"] is True


def test_config_states_peak_lr_and_its_rule():
    cfg = TTAConfig(model="tinycnn", data="d", target_top1=0.9, lr=0.1, batch_size=32)
    assert cfg.peak_lr == pytest.approx(0.0125)  # 0.1 * 32 / 256
    assert cfg.lr_rule() == ("linear scaling: peak lr = --lr 0.1 x global batch 32 / 256 = 0.0125 "
                             "(--lr-scaling none to use --lr as given)")
    plain = TTAConfig(model="tinycnn", data="d", target_top1=0.9, lr=0.1, batch_size=32, lr_scaling="none")
    assert plain.peak_lr == 0.1 and plain.lr_rule().startswith("no scaling: peak lr = --lr 0.1, as given")


@pytest.mark.slow
def test_run_records_the_applied_peak_lr_and_rule(digits_root):
    import torch

    from dlscale.tta.classifier import run_tta

    cfg = TTAConfig(model="tinycnn", data=str(digits_root), target_top1=0.99, max_epochs=1, image_size=16, threads=1,
                    lr=0.1, batch_size=32, lr_schedule="constant")
    out = run_tta(cfg, torch.device("cpu"))
    assert out.config["peak_lr"] == pytest.approx(0.0125) and out.metrics["peak_lr"] == out.config["peak_lr"]
    assert out.config["lr_rule"] == cfg.lr_rule() and "= 0.0125 " in out.config["lr_rule"]
    assert out.raw["curve"][0]["lr"] == pytest.approx(0.0125)  # a constant schedule trains at the peak


def test_the_summary_says_the_target_and_the_quality_reached_apart():
    """Target 90% reached at 94.43%: the summary never prints the target as if it were the accuracy."""
    from rich.console import Console

    from dlscale.cli.tta import _summary_table
    from dlscale.record import RunRecord

    rec = RunRecord(kind="tta", workload="tinycnn", config={"target_top1": 0.9},
                    metrics={"reached_target": True, "time_to_target": 12.5, "epochs_to_target": 3,
                             "final_top1": 0.9443, "final_top5": 1.0})
    console = Console(width=200, record=True)
    console.print(_summary_table(rec))
    text = " ".join(console.export_text().replace("│", " ").split())
    assert "target top-1 >= 90.00% time to target 12.500 s in 3 epochs" in text
    assert "quality reached top-1 94.43% / top-5 100.00% (the last evaluation)" in text
    assert "(top-1 90.00%)" not in text
