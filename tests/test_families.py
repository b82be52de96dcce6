"""Workload families through the shared config, short test, FSDP and CLI surfaces."""

import json
import subprocess
import sys

import pytest

from dlscale import workloads
from dlscale.config import TrainConfig
from dlscale.errors import UsageError
from dlscale.workloads.base import FAMILIES, SHAPE_FIELDS


def test_every_workload_is_in_a_known_family_with_its_unit():
    for w in workloads.all_workloads():
        assert w.family in FAMILIES and w.sample_unit == FAMILIES[w.family]


@pytest.mark.parametrize("field,value", [("seq_len", 128), ("tokens_per_batch", 1024), ("model_config", "x.json"),
                                         ("max_table_rows", 10)])
def test_shape_fields_of_other_families_are_refused_for_a_classifier(field, value):
    with pytest.raises(UsageError) as e:
        TrainConfig(model="tinycnn", **{field: value})
    msg = str(e.value)
    assert "--" + field.replace("_", "-") in msg and "classification" in msg and "\n" not in msg
    assert all(f in msg for f in SHAPE_FIELDS[field])


def test_bad_shape_values_and_choices_are_refused():
    with pytest.raises(UsageError, match="--seq-len must be > 0"):
        TrainConfig(model="tinycnn", seq_len=0)
    with pytest.raises(UsageError, match="--parallel"):
        TrainConfig(model="tinycnn", parallel="zero3")
    with pytest.raises(UsageError, match="channels-last"):
        TrainConfig(model="tinycnn", parallel="fsdp", channels_last=True).resolve("cpu")


def test_fsdp_resolves_to_contiguous_parameters():
    cfg = TrainConfig(model="tinycnn", parallel="fsdp").resolve("cpu")
    assert cfg.channels_last is False and cfg.image_size == 32


def test_classifier_units_per_batch_is_the_batch():
    w = workloads.get("tinycnn")
    assert w.units_per_batch(TrainConfig(model="tinycnn", batch_size=7).resolve("cpu")) == 7


def test_activation_checkpointing_needs_blocks(tmp_path):
    from dlscale import api
    from dlscale.errors import RunFailure

    with pytest.raises((UsageError, RunFailure)) as e:
        api.train(model="tinycnn", activation_checkpointing=True, steps=1, warmup_steps=0, db=str(tmp_path / "r.db"),
                  monitor_interval=0, breakdown_steps=0)
    assert "repeated blocks" in str(e.value)


def test_models_json_lists_family_unit_and_defaults():
    p = subprocess.run([sys.executable, "-m", "dlscale.cli.app", "models", "--format", "json"],
                       capture_output=True, text=True, check=True)
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    assert rows["resnet50"]["family"] == "classification" and rows["resnet50"]["sample_unit"] == "images"
    assert rows["resnet50"]["defaults"].startswith("224px")
    assert {r["family"] for r in rows.values()} <= set(FAMILIES)


def test_shape_option_on_the_wrong_family_exits_2_with_one_line():
    p = subprocess.run([sys.executable, "-m", "dlscale.cli.app", "train", "tinycnn", "--seq-len", "64"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "--seq-len" in p.stderr


@pytest.mark.slow
@pytest.mark.long
def test_fsdp_on_two_ranks_records_parallelism_and_memory_per_rank(tmp_path):
    from dlscale import api
    from dlscale.layout import Layout

    rec = api.train(model="tinycnn", layout=Layout(nproc_per_node=2), parallel="fsdp", steps=4, warmup_steps=1,
                    db=str(tmp_path / "r.db"), monitor_interval=0, breakdown_steps=0)
    assert rec.status == "ok" and rec.config["parallel"] == "fsdp"
    assert rec.metrics["world_size"] == 2 and rec.metrics["throughput"] > 0
    mem = rec.metrics["rank_peak_memory_bytes"]
    assert len(mem) == 2 and all(m > 0 for m in mem) and rec.units["rank_peak_memory_bytes"] == "bytes"
    assert rec.metrics["samples_per_step"] == 2 * 32


def test_a_sweep_over_families_checks_each_point_by_its_family(cli, db_path, tmp_path):
    """A shape field on a family it does not apply to is refused at its line; per-family shapes go through."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: fam\ncommand: train\nfixed:\n  steps: 2\n  seq_len: 64\nmatrix:\n  model: [llama_tiny, tinycnn]\n")
    r = cli("sweep", str(bad), "--dry-run")
    assert r.code == 2 and "--seq-len" in r.stderr and "bad.yaml:" in r.stderr and "tinycnn" in r.stderr
    good = tmp_path / "good.yaml"
    good.write_text("name: fam\ncommand: train\nfixed:\n  steps: 2\ninclude:\n"
                    "  - {model: llama_tiny, seq_len: 64, batch_size: 2}\n"
                    "  - {model: transformer_tiny, tokens_per_batch: 128, seq_len: 16}\n"
                    "  - {model: dlrm_tiny, max_table_rows: 100}\n")
    r = cli("sweep", str(good), "--dry-run", "--format", "json")
    assert r.code == 0, r.stderr
    commands = [p["command"] for p in json.loads(r.stdout)["points"]]
    assert "--seq-len 64" in commands[0] and "--tokens-per-batch 128" in commands[1] and "--max-table-rows 100" in commands[2]


@pytest.mark.slow
@pytest.mark.long
def test_llama_ddp_and_fsdp_with_checkpointing_on_two_ranks(tmp_path):
    """One LLM through both parallelisms on two gloo ranks: same tokens per step, FSDP sharded per decoder layer."""
    from dlscale import api
    from dlscale.layout import Layout

    common = dict(model="llama_tiny", seq_len=64, batch_size=2, steps=3, warmup_steps=1, db=str(tmp_path / "r.db"),
                  monitor_interval=0, breakdown_steps=0, layout=Layout(nproc_per_node=2, threads_per_rank=1))
    ddp = api.train(**common)
    fsdp = api.train(parallel="fsdp", activation_checkpointing=True, **common)
    for rec in (ddp, fsdp):
        assert rec.status == "ok" and rec.units["throughput"] == "tokens/s"
        assert rec.metrics["samples_per_step"] == 2 * 2 * 64 and rec.metrics["throughput"] > 0
    assert ddp.config["parallel"] == "ddp" and ddp.metrics["comm_fraction"] is not None
    assert fsdp.config["parallel"] == "fsdp" and fsdp.config["fsdp_shard_unit"] == "LlamaDecoderLayer"
    assert fsdp.config["activation_checkpointing"] is True and "comm_fraction" not in fsdp.metrics


@pytest.mark.slow
@pytest.mark.long
def test_a_scale_ladder_of_a_translation_model_counts_target_tokens(tmp_path):
    """scale runs any family: the rungs' throughput and the summary's figures are in tokens/s."""
    from dlscale import api

    recs = api.scale("transformer_tiny", devices=[1, 2], tokens_per_batch=128, seq_len=16, steps=3, warmup_steps=1,
                     threads_per_rank=1, db=str(tmp_path / "r.db"), monitor_interval=0, breakdown_steps=0)
    rungs, summary = recs[:-1], recs[-1]
    assert [r.metrics["world_size"] for r in rungs] == [1, 2] and all(r.status == "ok" for r in rungs)
    assert all(r.units["throughput"] == "tokens/s" for r in rungs)
    assert [r.metrics["samples_per_step"] for r in rungs] == [128, 256]
    assert summary.kind == "scale" and summary.config["sample_unit"] == "tokens"
    assert summary.config["tokens_per_batch"] == 128
    assert {u for k, u in summary.units.items() if k.startswith("throughput_")} == {"tokens/s"}
    # each rung's data-parallel efficiency is against the ladder's 1-device rung, as the summary's
    one, two = rungs
    assert two.metrics["dp_efficiency"] == pytest.approx(two.metrics["throughput"] / (2 * one.metrics["throughput"]))
    assert two.metrics["dp_efficiency"] == pytest.approx(summary.metrics["efficiency_1x2"])
    assert two.metrics["dp_efficiency_source"].startswith(f"given: run {one.run_id} (DDP over 1 rank")
    assert two.units["dp_reference_throughput"] == "tokens/s" and two.metrics["dp_reference_run_id"] == one.run_id
    assert one.metrics["dp_efficiency"] is None and one.metrics["dp_efficiency_source"].startswith("none: no ok run")
