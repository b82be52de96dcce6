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
