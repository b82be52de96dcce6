"""The JPEG dataset maker, the loader (skip/strict), train --data end to end, and the staged data bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.errors import UsageError


@pytest.fixture(scope="module")
def tiny_ds(tmp_path_factory):
    """24 training images of 3 classes, 48 px: made once for the module."""
    from dlscale.data.synth import DatasetSpec, make_dataset

    root = tmp_path_factory.mktemp("ds") / "imgs"
    make_dataset(root, DatasetSpec(images=24, classes=3, size=48))
    return root


def _corrupt_copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    bad = dst / "train" / "c0001" / "zz_bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    return bad


def test_dataset_make_writes_the_imagenet_layout(cli, tmp_path):
    root = tmp_path / "made"
    r = cli("dataset", "make", str(root), "--images", "12", "--classes", "3", "--size", "40", "--format", "json")
    assert r.code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["train"]["images"] == 12 and summary["val"]["images"] == 3  # a tenth, at least one per class
    assert sorted(p.name for p in (root / "train").iterdir()) == ["c0000", "c0001", "c0002"]
    assert len(list((root / "train").glob("*/*.jpg"))) == 12
    assert len(list((root / "val").glob("*/*.jpg"))) == 3
    from dlscale.data.loader import decode

    img = decode(str(next((root / "train" / "c0000").glob("*.jpg"))))
    assert img.shape[0] == 3 and img.shape[1] == 40 and 30 <= img.shape[2] <= 54  # width: aspect 3:4 .. 4:3


def test_dataset_make_rejects_bad_sizes(cli, tmp_path):
    r = cli("dataset", "make", str(tmp_path / "x"), "--images", "2", "--classes", "5")
    assert r.code == 2 and "--images 2 is fewer than --classes 5" in r.stderr


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_batches_and_labels(tiny_ds, workers):
    from dlscale.data.loader import build_loader

    loader = build_loader(tiny_ds, "train", 8, 32, workers)
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert len(batches) == 3 == len(loader)
    x, y = batches[0]
    assert tuple(x.shape) == (8, 3, 32, 32) and str(x.dtype) == "torch.float32"
    labels = sorted(int(v) for _x, yb in batches for v in yb)
    assert labels == sorted([0, 1, 2] * 8)  # one epoch visits every image once
    assert loader.num_classes == 3 and loader.skipped == 0


def test_loader_uint8_channels_last_and_device_normalisation(tiny_ds):
    import torch

    from dlscale.data.loader import MEAN, STD, build_loader, normalize_on_device

    loader = build_loader(tiny_ds, "val", 3, 32, 0, train=False, normalize=False, channels_last=True)
    x, _y = next(iter(loader))
    assert x.dtype == torch.uint8 and x.is_contiguous(memory_format=torch.channels_last)
    z = normalize_on_device(x, channels_last=True)
    want = (x[0, 1, 0, 0].item() / 255 - MEAN[1]) / STD[1]
    assert z[0, 1, 0, 0].item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_jpeg_is_skipped_and_counted(tiny_ds, tmp_path, workers):
    from dlscale.data.loader import build_loader

    root = tmp_path / "c"
    bad = _corrupt_copy(tiny_ds, root)
    loader = build_loader(root, "train", 5, 32, workers)
    try:
        n = sum(len(y) for _x, y in loader)
    finally:
        loader.close()
    assert n == 25  # 25 files, 5 full batches: the bad one replaced by the next image
    assert loader.skipped == 1 and loader.skipped_paths == [str(bad)]


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_jpeg_fails_under_strict_with_its_path(tiny_ds, tmp_path, workers):
    from dlscale.data.loader import CorruptImage, build_loader

    root = tmp_path / "c"
    bad = _corrupt_copy(tiny_ds, root)
    loader = build_loader(root, "train", 5, 32, workers, strict=True)
    with pytest.raises(CorruptImage) as ei:
        try:
            list(loader)
        finally:
            loader.close()
    assert str(ei.value).startswith(f"cannot read or decode {bad}:")


def test_loader_usage_errors(tmp_path, tiny_ds):
    from dlscale.data.loader import build_loader

    with pytest.raises(UsageError, match="is not a directory"):
        build_loader(tmp_path, "train", 4, 32, 0)
    with pytest.raises(UsageError, match="fewer than one batch"):
        build_loader(tiny_ds, "train", 100, 32, 0)


@pytest.mark.slow
def test_train_with_data_end_to_end(cli, db_path, tiny_ds):
    r = cli("train", "tinycnn", "--data", str(tiny_ds), "--workers", "1", "--batch-size", "8", "--image-size", "32",
            "--warmup-steps", "1", "--steps", "4", "--breakdown-steps", "2", "--monitor-interval", "0.2", "--format", "json")
    assert r.code == 0, r.stderr
    rec = json.loads(r.stdout)
    m = rec["metrics"]
    assert rec["status"] == "ok" and rec["config"]["data_source"] == str(tiny_ds)
    assert m["loader_workers"] == 1 and m["images_skipped"] == 0
    assert m["loader_rate"] > 0 and m["decode_rate_per_core"] > 0 and m["input_cores_needed"] > 0
    assert m["verdict"] in ("input-bound", "compute-bound") and m["verdict_reason"]
    assert len(rec["raw"]["phase_seconds"]["forward"]) == 2
    assert rec["raw"]["monitor"]["columns"]["t_s"]
    shown = cli("results", "show", rec["run_id"])
    assert shown.code == 0 and "step breakdown" in shown.stdout and "verdict" in shown.stdout
    assert "resources during the measured window" in shown.stdout


@pytest.mark.slow
def test_train_strict_fails_the_run_naming_the_file(cli, db_path, tiny_ds, tmp_path):
    root = tmp_path / "c"
    bad = _corrupt_copy(tiny_ds, root)
    r = cli("train", "tinycnn", "--data", str(root), "--workers", "0", "--batch-size", "5", "--image-size", "32",
            "--warmup-steps", "5", "--steps", "2", "--strict", "--monitor-interval", "0")
    assert r.code == 1
    assert str(bad) in r.stderr and "failed" in r.stderr


def test_train_data_usage_errors(cli, db_path, tmp_path):
    r = cli("train", "tinycnn", "--data", str(tmp_path / "nope"))
    assert r.code == 2 and "no " in r.stderr and "dlscale dataset make" in r.stderr
    r = cli("train", "tinycnn", "--workers", "-1")
    assert r.code == 2 and "--workers must be >= 0" in r.stderr
    r = cli("train", "tinycnn", "--monitor-interval", "-1")
    assert r.code == 2 and "--monitor-interval" in r.stderr


@pytest.mark.slow
def test_data_bench_rates_for_0_1_2_workers(cli, db_path, tiny_ds):
    r = cli("data", str(tiny_ds), "--batch-size", "4", "--image-size", "32", "--images", "16", "--max-workers", "2",
            "--target-rate", "100000", "--format", "json")
    assert r.code == 0, r.stderr
    rec = json.loads(r.stdout)
    m = rec["metrics"]
    assert rec["kind"] == "data" and m["loader_workers"] == [0, 1, 2]
    assert len(m["loader_rates"]) == 3 and all(x > 0 for x in m["loader_rates"])
    assert m["worker_scaling_efficiency"][0] is None and m["worker_scaling_efficiency"][1] == pytest.approx(1.0)
    assert m["worker_scaling_efficiency"][2] == pytest.approx(m["loader_rates"][2] / (2 * m["loader_rates"][1]))
    assert m["read_MBps_cold"] > 0 and m["read_MBps_warm"] > 0 and m["decode_rate_per_core"] > 0
    assert m["cores_needed"] == pytest.approx(100000 / m["decode_rate_per_core"])
    assert m["workers_needed"] is None and "no measured worker count reaches" in r.stderr
    shown = cli("results", "show", rec["run_id"])
    assert shown.code == 0 and "decode+augment, one core" in shown.stdout and "loader, 2 workers" in shown.stdout


def test_data_bench_target_from_a_recorded_run(cli, db_path, tiny_ds):
    from dlscale.record import RunRecord
    from dlscale.store import Store

    src = RunRecord(kind="train", workload="alexnet", config={}, metrics={"throughput": 50.0})
    with Store.open(str(db_path)) as s:
        s.insert(src)
    r = cli("data", str(tiny_ds), "--run", src.run_id, "--batch-size", "4", "--image-size", "32", "--images", "8",
            "--max-workers", "0", "--no-cold", "--format", "json")
    assert r.code == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    assert m["target_rate"] == 50.0 and m["cores_needed"] == pytest.approx(50.0 / m["decode_rate_per_core"])
    assert "read_MBps_cold" not in m and "--no-cold" in m["cold_read_note"]
    r = cli("data", str(tiny_ds), "--run", src.run_id, "--target-rate", "5")
    assert r.code == 2 and "not both" in r.stderr


def test_cold_read_impossible_on_tmpfs_says_so(monkeypatch, tiny_ds):
    from dlscale.data import bench

    monkeypatch.setattr(bench, "fs_type", lambda _p: "tmpfs")
    assert "tmpfs" in bench.evict([str(next(tiny_ds.glob("train/*/*.jpg")))])


def test_a_stuck_worker_times_out_instead_of_hanging(tiny_ds, monkeypatch):
    import time

    from dlscale.data import loader as ld

    monkeypatch.setattr(ld, "decode", lambda path: time.sleep(60))  # the forked worker inherits the stall
    loader = ld.build_loader(tiny_ds, "train", 4, 32, 1, timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out"):
        try:
            next(iter(loader))
        finally:
            loader.close()
    assert time.monotonic() - t0 < 30
