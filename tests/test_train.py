"""End-to-end short tests through the CLI, the JSON contract, and the record in the store."""

import csv
import io
import json

import pytest

REQUIRED_METRICS = ("throughput", "throughput_ci95", "step_time_p50", "step_time_p90", "step_time_p99",
                    "cv", "mfu", "peak_memory_bytes")


def _check_record(rec, model, batch, image_size, steps):
    for key in ("run_id", "status", "workload", "config", "system", "metrics"):
        assert key in rec
    assert rec["status"] == "ok" and rec["workload"] == model and rec["error"] is None
    cfg = rec["config"]
    assert cfg["batch_size"] == batch and cfg["image_size"] == image_size and cfg["steps"] == steps
    assert cfg["device"] == "cpu" and cfg["channels_last"] is True  # the CPU fast path by default
    m = rec["metrics"]
    for key in REQUIRED_METRICS:
        assert key in m, key
    times = rec["raw"]["step_times_s"][0]
    assert len(times) == steps and all(t > 0 for t in times)
    # throughput is samples over the measured window, recomputed here from the raw step times
    assert m["throughput"] == pytest.approx(batch * steps / sum(times))
    lo, hi = m["throughput_ci95"]
    assert lo <= m["throughput"] <= (float("inf") if hi is None else hi)  # null: unbounded above
    assert m["step_time_p50"] <= m["step_time_p90"] <= m["step_time_p99"] <= max(times)
    assert m["cv"] >= 0 and m["peak_memory_bytes"] > 0
    assert m["flops_per_sample"] > 0 and 0 < m["mfu"] < 5
    assert m["achieved_flops"] == pytest.approx(m["flops_per_sample"] * m["throughput"])
    assert rec["units"]["throughput"] == "images/s" and rec["units"]["peak_memory_bytes"] == "bytes"
    sysinfo = rec["system"]
    assert sysinfo["hostname"] and sysinfo["cpu"]["logical_cpus"] >= 1 and sysinfo["software"]["torch"]


def test_tinycnn_end_to_end_json(cli, db_path):
    res = cli("train", "tinycnn", "--batch-size", "8", "--warmup-steps", "2", "--steps", "12",
              "--format", "json", "--tag", "e2e")
    assert res.code == 0, res.stderr
    rec = json.loads(res.stdout)
    _check_record(rec, "tinycnn", 8, 32, 12)
    assert rec["tag"] == "e2e"
    shown = json.loads(cli("results", "show", rec["run_id"], "--format", "json").stdout)
    assert shown == rec  # the store returns exactly what was printed


@pytest.mark.slow
def test_resnet18_small_image_end_to_end(cli, db_path):
    res = cli("train", "resnet18", "--image-size", "32", "--batch-size", "4", "--warmup-steps", "1",
              "--steps", "5", "--format", "json")
    assert res.code == 0, res.stderr
    _check_record(json.loads(res.stdout), "resnet18", 4, 32, 5)


@pytest.mark.isa
def test_repeats_bf16_and_human_output(cli, db_path):
    res = cli("train", "tinycnn", "--batch-size", "4", "--warmup-steps", "1", "--steps", "4",
              "--repeat", "2", "--precision", "bf16")
    assert res.code == 0, res.stderr
    assert "throughput" in res.stdout and "over repeats" in res.stdout
    rec = json.loads(cli("results", "list", "--format", "json").stdout)[0]
    full = json.loads(cli("results", "show", rec["run_id"], "--format", "json").stdout)
    assert len(full["raw"]["step_times_s"]) == 2 and len(full["metrics"]["repeat_throughputs"]) == 2
    assert full["metrics"]["throughput_ci_method"] == "repeats"
    assert full["config"]["precision"] == "bf16"
    human = cli("results", "show", rec["run_id"])
    assert human.code == 0 and "config" in human.stdout and "metrics" in human.stdout and "system" in human.stdout


def test_results_filters_and_export(cli, db_path):
    for tag in ("a", "b"):
        assert cli("train", "tinycnn", "--batch-size", "4", "--warmup-steps", "0", "--steps", "2",
                   "--tag", tag).code == 0
    only_a = json.loads(cli("results", "list", "--tag", "a", "--format", "json").stdout)
    assert [r["tag"] for r in only_a] == ["a"]
    assert json.loads(cli("results", "list", "--model", "resnet50", "--format", "json").stdout) == []
    rows = list(csv.DictReader(io.StringIO(cli("results", "export", "--format", "csv").stdout)))
    assert len(rows) == 2 and {r["tag"] for r in rows} == {"a", "b"}
    assert float(rows[0]["metrics.throughput"]) > 0 and rows[0]["config.batch_size"] == "4"
    full = json.loads(cli("results", "export", "--format", "json", "--tag", "b").stdout)
    assert len(full) == 1 and full[0]["raw"]["step_times_s"]


# -- the knobs dlscale tune searches: compile mode, optimizer implementation, DDP, input pipeline -------

def test_compile_mode_implies_compile_and_gpu_only_options_are_refused_on_cpu(tmp_path):
    from dlscale.config import TrainConfig
    from dlscale.errors import UsageError

    cfg = TrainConfig("tinycnn", compile_mode="max-autotune")
    assert cfg.compile is True and cfg.to_dict()["compile_mode"] == "max-autotune"
    assert TrainConfig("tinycnn", compile=True).compile_mode is None  # --compile alone: torch's default mode
    with pytest.raises(UsageError, match=r"unknown --compile-mode 'fast'; choose one of default, reduce-overhead"):
        TrainConfig("tinycnn", compile_mode="fast")
    with pytest.raises(UsageError, match=r"--compile-mode reduce-overhead records CUDA graphs and needs a CUDA"):
        TrainConfig("tinycnn", compile_mode="reduce-overhead").resolve("cpu")
    assert TrainConfig("tinycnn", compile_mode="reduce-overhead").resolve("cuda").compile_mode == "reduce-overhead"
    with pytest.raises(UsageError, match=r"unknown --optimizer-impl 'apex'"):
        TrainConfig("tinycnn", optimizer_impl="apex")


def test_ddp_options_need_ddp_and_several_ranks():
    from dlscale.config import TrainConfig
    from dlscale.distributed.worker import ddp_options
    from dlscale.errors import UsageError

    from dlscale import compat

    sync = "forward_sync_buffers" if compat.available("ddp_forward_sync_buffers") else "broadcast_buffers"
    cfg = TrainConfig("tinycnn", ddp_bucket_mb=4.5, ddp_grad_as_bucket_view=False, ddp_static_graph=True,
                      ddp_broadcast_buffers=True)
    assert ddp_options(cfg.resolve("cpu")) == {"bucket_cap_mb": 4.5, "gradient_as_bucket_view": False,
                                               "static_graph": True, sync: True}
    # dlscale's defaults, as the record holds them: gradients as bucket views, no per-step buffer broadcast
    plain = TrainConfig("tinycnn").resolve("cpu")
    assert (plain.ddp_grad_as_bucket_view, plain.ddp_broadcast_buffers) == (True, False)
    assert ddp_options(plain) == {"gradient_as_bucket_view": True, "static_graph": False, sync: False}
    alone = TrainConfig("tinycnn", parallel="none").resolve("cpu")  # nothing wrapped in DDP: nothing of it on
    assert (alone.ddp_grad_as_bucket_view, alone.ddp_broadcast_buffers) == (False, False)
    cfg.check_layout(distributed=True)
    with pytest.raises(UsageError, match=r"^--ddp-broadcast-buffers is a DistributedDataParallel option; --parallel"):
        TrainConfig("tinycnn", parallel="none", ddp_broadcast_buffers=True)
    with pytest.raises(UsageError, match=r"^--dp-reference applies to data-parallel runs of several ranks"):
        TrainConfig("tinycnn", dp_reference="abc").check_layout(distributed=False)
    with pytest.raises(UsageError, match=r"^--dp-reference is the training alone a data-parallel run is held to"):
        TrainConfig("tinycnn", parallel="none", dp_reference="abc")
    with pytest.raises(UsageError, match=r"^--ddp-bucket-mb applies to data-parallel runs of several ranks"):
        cfg.check_layout(distributed=False)
    with pytest.raises(UsageError, match=r"^--ddp-static-graph is a DistributedDataParallel option; --parallel fsdp"):
        TrainConfig("llama_tiny", parallel="fsdp", ddp_static_graph=True)
    with pytest.raises(UsageError, match=r"--ddp-bucket-mb must be > 0"):
        TrainConfig("tinycnn", ddp_bucket_mb=0)


def test_input_pipeline_options_need_data_and_pinning_a_gpu(tmp_path):
    from types import SimpleNamespace

    from dlscale.config import TrainConfig
    from dlscale.data.loader import pipeline_options
    from dlscale.errors import UsageError

    with pytest.raises(UsageError, match=r"^--pin-memory is an input-pipeline option of --data"):
        TrainConfig("tinycnn", pin_memory=False)
    with pytest.raises(UsageError, match=r"^--prefetch-factor is an input-pipeline option of --data"):
        TrainConfig("tinycnn", prefetch_factor=4)
    (tmp_path / "train").mkdir()
    with pytest.raises(UsageError, match=r"^--prefetch-factor needs --workers >= 1"):
        TrainConfig("tinycnn", data=str(tmp_path), workers=0, prefetch_factor=4)
    with pytest.raises(UsageError, match=r"^--pin-memory needs a CUDA device"):
        TrainConfig("tinycnn", data=str(tmp_path), pin_memory=True).resolve("cpu")
    assert TrainConfig("tinycnn", data=str(tmp_path)).resolve("cpu").pin_memory is False  # recorded as it ran
    assert TrainConfig("tinycnn", data=str(tmp_path)).resolve("cuda").pin_memory is True
    assert TrainConfig("tinycnn").resolve("cpu").pin_memory is None  # synthetic: nothing to pin
    opts = lambda **kw: SimpleNamespace(**{"pin_memory": None, "prefetch_factor": None, **kw})  # noqa: E731
    assert pipeline_options(opts(), "cpu") == {"pin_memory": False, "prefetch_factor": None}
    assert pipeline_options(opts(prefetch_factor=4), "cuda") == {"pin_memory": True, "prefetch_factor": 4}
    assert pipeline_options(opts(pin_memory=False), "cuda")["pin_memory"] is False


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_implementations_run_and_are_recorded(cli, db_path, impl):
    for opt in ("sgd", "adamw"):
        res = cli("train", "tinycnn", "--batch-size", "4", "--warmup-steps", "1", "--steps", "2", "--optimizer", opt,
                  "--optimizer-impl", impl, "--breakdown-steps", "0", "--monitor-interval", "0", "--format", "json")
        assert res.code == 0, res.stderr
        rec = json.loads(res.stdout)
        assert rec["config"]["optimizer_impl"] == impl and rec["metrics"]["throughput"] > 0


def test_the_optimizer_gets_the_implementation():
    import torch

    from dlscale.config import TrainConfig
    from dlscale.train.shorttest import _optimizer

    model = torch.nn.Linear(4, 2)
    assert _optimizer(TrainConfig("tinycnn", optimizer_impl="fused"), model).defaults["fused"] is True
    assert _optimizer(TrainConfig("tinycnn", optimizer="adamw", optimizer_impl="foreach"), model).defaults["foreach"]
    assert not _optimizer(TrainConfig("tinycnn"), model).defaults.get("fused")


def test_single_rank_run_refuses_ddp_options(cli, db_path):
    res = cli("train", "tinycnn", "--steps", "2", "--ddp-grad-as-bucket-view")
    assert res.code == 2 and "--ddp-grad-as-bucket-view applies to data-parallel runs of several ranks" in res.stderr


@pytest.mark.slow
def test_two_rank_ddp_with_bucket_options_and_fused_optimizer(cli_subprocess):
    res = cli_subprocess("train", "tinycnn", "--batch-size", "4", "--warmup-steps", "1", "--steps", "3",
                         "--nproc-per-node", "2", "--threads-per-rank", "1", "--ddp-bucket-mb", "1",
                         "--no-ddp-grad-as-bucket-view", "--ddp-static-graph", "--ddp-broadcast-buffers",
                         "--optimizer-impl", "fused", "--dp-reference", "none",
                         "--breakdown-steps", "0", "--monitor-interval", "0", "--format", "json")
    assert res.code == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["metrics"]["world_size"] == 2 and rec["config"]["ddp_bucket_mb"] == 1.0
    assert rec["config"]["ddp_grad_as_bucket_view"] is False and rec["config"]["ddp_static_graph"] is True
    assert rec["config"]["ddp_broadcast_buffers"] is True
    # what DDP itself ran with, read back from the wrapped model
    assert rec["config"]["ddp"] == {"bucket_mb": 1.0, "gradient_as_bucket_view": False,
                                    "sync_buffers_every_forward": True, "static_graph": True}
    assert rec["metrics"]["dp_efficiency"] is None
    assert rec["metrics"]["dp_efficiency_source"] == "none: not asked for (--dp-reference none)"
