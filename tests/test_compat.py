"""compat: the installed torch's version-dependent features, probed, recorded, and refused in one line."""

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from dlscale import compat
from dlscale.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh_probes(monkeypatch):
    """Probes answered anew, and the cached answers of the real packages restored afterwards."""
    compat.available.cache_clear()
    yield
    monkeypatch.undo()
    compat.available.cache_clear()
    compat.torchrun_flags.cache_clear()


def test_the_launchers_torchrun_command_parses_with_the_installed_torchrun():
    """Every flag the launcher passes is one this torchrun has: its own parser accepts the command.
    (On torch 2.11 the launcher's --shutdown-timeout made every multi-process run fail; the
    lowest-torch CI set runs this test on the oldest supported torch.)"""
    from torch.distributed import run

    from dlscale.distributed.launch import _torchrun_cmd

    cmd = _torchrun_cmd("dlscale.distributed.rank", ["--spec", "x.json"], 2, 1, 0, "127.0.0.1", 29500, 30)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    args = run.get_args_parser().parse_args(cmd[3:])
    assert args.nproc_per_node == "2" and args.module and args.training_script == "dlscale.distributed.rank"
    launcher_flags = cmd[3:cmd.index("-m", 3)]
    for flag in (a.split("=", 1)[0] for a in launcher_flags):
        assert flag in compat.torchrun_flags()


def test_a_torchrun_without_shutdown_timeout_gets_no_such_flag(monkeypatch, fresh_probes):
    from dlscale.distributed.launch import _torchrun_cmd

    monkeypatch.setattr(compat, "torchrun_flags", lambda: frozenset({"--nnodes", "--nproc-per-node"}))
    compat.available.cache_clear()
    cmd = _torchrun_cmd("m", [], 1, 1, 0, "127.0.0.1", 29500, 30)
    assert not any(a.startswith("--shutdown-timeout") for a in cmd)
    monkeypatch.setattr(compat, "torchrun_flags", lambda: frozenset({"--shutdown-timeout"}))
    compat.available.cache_clear()
    assert "--shutdown-timeout=5" in _torchrun_cmd("m", [], 1, 1, 0, "127.0.0.1", 29500, 30)


def test_torchrun_flags_are_read_from_torchruns_own_parser():
    flags = compat.torchrun_flags()
    assert {"--nnodes", "--nproc-per-node", "--rdzv-backend", "--max-restarts"} <= flags
    assert all(f.startswith("--") for f in flags)


@pytest.mark.parametrize("version, supported", [
    ("2.8.0", False), ("2.9.0", True), ("2.9.1+cu128", True), ("2.11.0a0+git1234", True),
    ("2.14.1", True), ("2.15.0", True), ("2.16.0", False), ("3.0.0", False), ("garbage", False)])
def test_torch_support_is_the_declared_range(version, supported):
    assert compat.torch_support(version)["supported"] is supported


def test_the_supported_range_is_pyprojects_and_holds_the_lock():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    assert str(reqs["torch"].specifier) == ",".join(sorted(compat.torch_support("2.9.0")["range"].split(",")))
    low, high = compat.SUPPORTED_TORCH
    assert reqs["torch"].specifier.contains(f"{low[0]}.{low[1]}.0")
    assert not reqs["torch"].specifier.contains(f"{high[0]}.{high[1]}.0")
    assert not reqs["torch"].specifier.contains(f"{low[0]}.{low[1] - 1}.0")
    lock = dict(ln.split("==") for ln in (ROOT / "requirements.lock").read_text().splitlines()
                if "==" in ln and not ln.startswith("#"))
    assert reqs["torch"].specifier.contains(lock["torch"])
    assert reqs["torchvision"].specifier.contains(lock["torchvision"])
    # torchvision's range is torch's shifted by 15 minor releases (0.24 goes with 2.9)
    tv = reqs["torchvision"].specifier
    assert tv.contains(f"0.{low[1] + 15}.0") and not tv.contains(f"0.{low[1] + 14}.0")
    assert tv.contains(f"0.{high[1] + 14}.0") and not tv.contains(f"0.{high[1] + 15}.0")


def test_a_missing_feature_is_a_one_line_usage_error_naming_the_release(monkeypatch, fresh_probes):
    monkeypatch.setitem(compat.FEATURES, "fsdp2",
                        compat.Feature("fsdp2", "torch 2.6", "--parallel fsdp", lambda: False))
    with pytest.raises(UsageError) as err:
        compat.require("fsdp2", "--parallel fsdp")
    msg = str(err.value)
    assert "\n" not in msg and "--parallel fsdp needs torch 2.6 or newer" in msg and "this environment has torch" in msg


def test_a_probe_that_raises_counts_as_missing(monkeypatch, fresh_probes):
    def broken():
        raise RuntimeError("half-installed")

    monkeypatch.setitem(compat.FEATURES, "compile", compat.Feature("compile", "torch 2.0", "--compile", broken))
    assert compat.available("compile") is False


def test_train_refuses_fsdp_where_the_torch_has_no_fully_shard(monkeypatch, fresh_probes):
    from dlscale.config import TrainConfig

    monkeypatch.setitem(compat.FEATURES, "fsdp2",
                        compat.Feature("fsdp2", "torch 2.6", "--parallel fsdp", lambda: False))
    cfg = TrainConfig(model="tinycnn", parallel="fsdp")
    with pytest.raises(UsageError, match="--parallel fsdp needs torch 2.6"):
        cfg.resolve("cpu")


def test_infer_refuses_onnxruntime_where_the_exporter_is_missing(monkeypatch, fresh_probes):
    from dlscale.infer.config import InferConfig

    monkeypatch.setitem(compat.FEATURES, "onnx_dynamo_export",
                        compat.Feature("onnx_dynamo_export", "torch 2.5 with onnxscript", "x", lambda: False))
    with pytest.raises(UsageError, match="--runtime onnxruntime needs torch 2.5 with onnxscript"):
        InferConfig(model="tinycnn", runtime="onnxruntime").resolve("cpu")


def test_features_list_every_torch_probe_and_the_installed_torch_has_the_ones_dlscale_needs():
    import torch

    got = compat.features()
    assert got["torch_support"]["torch"] == torch.__version__
    for name, f in compat.FEATURES.items():
        if f.family == "torch":
            assert set(got[name]) == {"available", "needs"}
    # what every supported torch has (the lowest-torch CI set checks it on the oldest)
    for name in ("fsdp2", "compile", "process_group_device_id"):
        assert got[name]["available"], name


def test_a_recorded_run_says_which_features_were_available(tmp_path):
    from dlscale import api

    rec = api.train(model="tinycnn", image_size=16, batch_size=2, warmup_steps=1, steps=2, db=tmp_path / "r.db")
    feats = rec.system["software"]["features"]
    assert feats["fsdp2"]["available"] is True and feats["torch_support"]["supported"] in (True, False)
