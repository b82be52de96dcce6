"""dlscale infer: the batch-size sweep record, its figures, int8 and onnxruntime, the largest-batch
search, the CLI's errors and JSON output, and sweeps of ``command: infer`` (tiny models, few iters)."""

from __future__ import annotations

import json
import math

import pytest

from dlscale.errors import UsageError


def test_sweep_records_inference_with_the_contract_fields(db_path):
    from dlscale import api
    from dlscale.store import Store

    rec = api.infer(model="tinycnn", batch_sizes="1,4", iters=3, warmup=1, db=str(db_path))
    assert rec.kind == "inference" and rec.status == "ok" and rec.workload == "tinycnn"
    c, m, u = rec.config, rec.metrics, rec.units
    assert c["runtime"] == "torch" and c["runtime_version"].startswith("torch ")
    assert c["sample_unit"] == "images" and c["family"] == "classification" and c["device_name"]
    assert c["batch_sizes"] == [1, 4] and c["image_size"] == 32 and c["scenario"] is None
    assert m["batch_sizes"] == [1, 4] and m["units_by_batch"] == [1, 4]
    for k in ("throughput_by_batch", "latency_p50_by_batch", "latency_p90_by_batch", "latency_p99_by_batch",
              "latency_max_by_batch", "throughput_ci95_by_batch", "cv_by_batch"):
        assert len(m[k]) == 2, k
    for i in range(2):
        assert m["latency_p50_by_batch"][i] <= m["latency_p90_by_batch"][i] <= m["latency_p99_by_batch"][i] \
            <= m["latency_max_by_batch"][i]
        lo, hi = m["throughput_ci95_by_batch"][i]
        assert lo <= m["throughput_by_batch"][i] <= hi
        assert len(rec.raw["batch_times"][str(m["batch_sizes"][i])]) == 3
    best = m["throughput_by_batch"].index(max(m["throughput_by_batch"]))
    assert m["throughput"] == m["throughput_by_batch"][best] and m["best_batch_size"] == [1, 4][best]
    assert u["throughput_by_batch"] == "images/s" and u["latency_p99_by_batch"] == "s"
    with Store.open(str(db_path)) as s:
        assert s.get(rec.run_id).kind == "inference"


def test_batch_figures_against_a_hand_computed_case():
    """Times 10..100 ms at 4 images a batch. Type-7 percentiles: h = 9q/100 over the sorted times,
    p50 = 55 ms, p90 = 91 ms, p99 = 99.1 ms, max 100 ms; throughput = 4 * 10 / 0.55 s = 72.727 images/s;
    CV = stdev / mean = sqrt(10 * 11 / 12) * 10 ms / 55 ms = 0.550482."""
    from dlscale.infer.run import batch_figures

    fig, warnings = batch_figures(4, [k / 100 for k in range(10, 0, -1)])  # unsorted on purpose
    assert fig["latency_p50"] == pytest.approx(0.055)
    assert fig["latency_p90"] == pytest.approx(0.091)
    assert fig["latency_p99"] == pytest.approx(0.0991)
    assert fig["latency_max"] == pytest.approx(0.100)
    assert fig["throughput"] == pytest.approx(40 / 0.55)
    assert fig["cv"] == pytest.approx(math.sqrt(110 / 12) / 5.5, rel=1e-6)
    lo, hi = fig["throughput_ci95"]  # t(0.975, 9) = 2.2622: mean 55 ms -/+ 2.2622 * 30.2765 / sqrt(10) ms
    half = 2.2622 * math.sqrt(110 / 12) * 0.01 / math.sqrt(10)
    assert lo == pytest.approx(4 / (0.055 + half)) and hi == pytest.approx(4 / (0.055 - half))
    assert any("--iters" in w for w in warnings)  # CV above 2%: the warning names infer's options


def _session(precision: str = "fp32", runtime: str = "torch", model: str = "tinycnn", **kw):
    import torch

    from dlscale.infer.config import InferConfig
    from dlscale.infer.session import open_session

    cfg = InferConfig(model, batch_sizes="4", precision=precision, runtime=runtime, iters=1, warmup=0, **kw)
    return open_session(cfg.resolve("cpu"), torch.device("cpu"))


@pytest.mark.isa
@pytest.mark.slow
@pytest.mark.long
def test_int8_output_is_close_to_fp32():
    """PT2E int8 (x86 inductor quantizer, compiled) against fp32 on the same 16 samples: the largest
    logit difference is within 5% of the fp32 logits' range, and top-1 agrees on at least 14 of 16."""
    import torch

    fp32, int8 = _session("fp32"), _session("int8")
    samples = [fp32.sample(i) for i in range(16)]
    assert all(torch.equal(a, int8.sample(i)) for i, a in enumerate(samples))
    ref, out = fp32.run(samples).float(), int8.run(samples).float()
    assert out.shape == ref.shape == (16, 10)
    span = (ref.max() - ref.min()).item()
    assert (out - ref).abs().max().item() <= 0.05 * span
    assert (out.argmax(1) == ref.argmax(1)).sum().item() >= 14
    assert int8.describe()["compile"] is True and "PT2E" in int8.describe()["quantization"]


def test_onnxruntime_runs_tinycnn_and_matches_torch():
    import numpy as np

    pt, ort = _session("fp32"), _session("fp32", runtime="onnxruntime", channels_last=False)
    samples = [pt.sample(i) for i in range(3)]  # batch 3: the export's batch (2) is dynamic
    ref = pt.run(samples).numpy()
    out = ort.run(samples)[0]
    assert out.shape == ref.shape == (3, 10)
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)
    d = ort.describe()
    assert d["runtime_version"].startswith("onnxruntime ") and d["provider"] == "CPUExecutionProvider"


def test_find_max_batch_doubles_then_bisects():
    from dlscale.infer.run import find_max_batch

    best, tried = find_max_batch(lambda b: b <= 37)
    assert best == 37
    assert tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert find_max_batch(lambda b: False)[0] == 0
    assert find_max_batch(lambda b: True, limit=16) == (16, [1, 2, 4, 8, 16])


class _FakeSession:
    """A session whose forward 'runs out of memory' above ``oom_above`` and 'uses' 1000 bytes a sample."""

    runtime = "torch"

    def __init__(self, oom_above: int) -> None:
        import torch

        self.device, self.oom_above, self.last = torch.device("cpu"), oom_above, 0

    def sample(self, index: int) -> int:
        return index

    def run(self, samples: list) -> None:
        if len(samples) > self.oom_above:
            raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {len(samples)}")
        self.last = len(samples)


def test_largest_batch_search_stops_at_a_fake_oom_and_at_a_memory_cap():
    from dlscale.infer.run import find_max_batch, memory_probe

    s, log = _FakeSession(oom_above=100), []
    best, _ = find_max_batch(memory_probe(s, None, log, measure=lambda: s.last * 1000, reset=lambda: None))
    assert best == 100 and {"batch": 128, "fits": False, "reason": "out of memory"} in log
    s, log = _FakeSession(oom_above=10**6), []
    best, _ = find_max_batch(memory_probe(s, 50_000, log, measure=lambda: s.last * 1000, reset=lambda: None))
    assert best == 50  # 50 * 1000 bytes is the cap exactly
    assert {"batch": 51, "fits": False, "peak_bytes": 51_000, "reason": "past the memory cap"} in log


def test_find_max_batch_on_a_real_model_under_a_tiny_cap(db_path):
    """A cap below the process's own RSS: not even batch 1 fits, said in a warning."""
    from dlscale import api

    rec = api.infer(model="tinycnn", batch_sizes="1", iters=2, warmup=0, find_max_batch=True, max_memory=1,
                    db=str(db_path))
    assert rec.metrics["max_batch_size"] == 0 and rec.metrics["max_memory_cap"] == 1
    assert any("raise --max-memory" in w for w in rec.warnings)
    assert rec.raw["max_batch_probes"][0]["reason"] == "past the memory cap"


@pytest.mark.parametrize("args, option", [
    (["--batch-sizes", "0"], "--batch-sizes"),
    (["--batch-sizes", "1,x"], "--batch-sizes"),
    (["--precision", "int4"], "--precision"),
    (["--runtime", "tensorrt"], "--runtime"),
    (["--scenario", "batch"], "--scenario"),
    (["--scenario", "server", "--latency-bound", "0"], "--latency-bound"),
    (["--latency-bound", "0.1"], "--latency-bound"),
    (["--prompt-len", "8", "--output-len", "4"], "--prompt-len"),
    (["--runtime", "onnxruntime", "--precision", "bf16"], "--runtime onnxruntime"),
    (["--max-memory", "1000"], "--max-memory caps the --find-max-batch search"),
    (["--find-max-batch", "--max-memory", "lots"], "--max-memory 'lots'"),
])
def test_bad_inputs_exit_2_with_one_line(cli, db_path, args, option):
    r = cli("infer", "tinycnn", *args)
    assert r.code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and option in lines[0]
    assert r.stdout == ""


def test_format_json_parses(cli, db_path):
    r = cli("infer", "tinycnn", "--batch-sizes", "2", "--iters", "2", "--warmup", "0", "--format", "json",
            "--tag", "t1")
    assert r.code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "inference" and doc["tag"] == "t1" and doc["metrics"]["batch_sizes"] == [2]


def test_sweep_accepts_command_infer(tmp_path):
    from dlscale.sweep import spec
    from dlscale.sweep.fields import record_kind

    f = tmp_path / "s.yaml"
    f.write_text("name: inf\ncommand: infer\nfixed: {model: tinycnn, iters: 2}\n"
                 "matrix:\n  batch_sizes: [[1, 2], 4]\n  precision: [fp32, int8]\n")
    sw = spec.load(str(f))
    assert [p.argv[:2] for p in sw.points] == [("infer", "tinycnn")] * 4
    assert "--batch-sizes" in sw.points[0].argv and "1,2" in sw.points[0].argv
    assert record_kind("infer") == "inference" and record_kind("train") == "train"
    f.write_text("name: inf\ncommand: infer\nfixed: {model: tinycnn}\nmatrix:\n  batch_sizes: [0, 2]\n")
    with pytest.raises(UsageError, match="--batch-sizes"):
        spec.load(str(f))


def test_config_resolves_shape_and_refuses_what_the_device_cannot_run():
    from dlscale.infer.config import InferConfig

    cfg = InferConfig("tinycnn", batch_sizes=[8, 2, 2]).resolve("cpu")
    assert cfg.batch_sizes == (2, 8) and cfg.image_size == 32 and cfg.channels_last is True
    assert InferConfig("tinycnn", precision="int8").resolve("cpu").channels_last is False
    with pytest.raises(UsageError, match="--precision int8"):
        InferConfig("tinycnn", precision="int8").resolve("cuda")
    with pytest.raises(UsageError, match="--image-size"):
        InferConfig("tinycnn", image_size=4)
    with pytest.raises(UsageError, match="--find-peak"):
        InferConfig("tinycnn", scenario="offline", find_peak=True)


@pytest.mark.isa
@pytest.mark.slow
@pytest.mark.long
def test_int8_resnet18_quantises_its_shared_relu_and_stays_close():
    """ResNet reuses one ReLU module per block: strict export keeps one partition per call, which the
    x86 quantizer needs. The converted (uncompiled, reference-kernel) int8 graph at 32 px against fp32
    on 8 samples: max logit difference within 10% of the fp32 logits' range."""
    import torch

    from dlscale import workloads
    from dlscale.infer import quant
    from dlscale.infer.session import Family, Flat

    cfg = _config("resnet18", image_size=32)
    fam = Family(workloads.get("resnet18"), cfg)
    torch.manual_seed(0)
    model = Flat(workloads.get("resnet18").build().eval(), fam)
    x = torch.stack([fam.sample(i, 0) for i in range(8)])
    calib = [(torch.stack([fam.sample(100 + 4 * k + i, 0) for i in range(4)]),) for k in range(4)]
    q = quant.quantize_int8(model, calib[0], calib, compile=False)
    with torch.no_grad():
        ref, out = model(x), q(x)
    assert (out - ref).abs().max().item() <= 0.10 * (ref.max() - ref.min()).item()


def _config(model: str, **kw):
    from dlscale.infer.config import InferConfig

    return InferConfig(model, batch_sizes="1", **kw).resolve("cpu")


@pytest.mark.parametrize("cap", ["1K", "0.0001%"])
def test_max_memory_takes_tunes_forms(cli, db_path, cap):
    """infer --max-memory reads 16G or 70% as tune does (dlscale.memsize); a cap below the process's
    own RSS fits no batch, which keeps the search to one probe. A share is of the machine's memory."""
    r = cli("infer", "tinycnn", "--batch-sizes", "1", "--iters", "2", "--warmup", "0", "--find-max-batch",
            "--max-memory", cap, "--format", "json")
    assert r.code == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    if cap.endswith("%"):
        from dlscale.memsize import total_memory

        assert m["max_memory_cap"] == int(0.0001 / 100 * total_memory())
    else:
        assert m["max_memory_cap"] == 1024
    assert m["max_batch_size"] == 0


def test_max_memory_share_is_of_the_gpus_memory_on_cuda(monkeypatch):
    import torch

    from dlscale.infer.config import InferConfig
    from dlscale.infer.run import memory_cap
    from fakes_gpu import GB, fake_cuda

    fake_cuda(monkeypatch, ["NVIDIA H100 80GB HBM3"])
    def cfg(cap):
        return InferConfig("tinycnn", find_max_batch=True, max_memory=cap)

    assert memory_cap(cfg("50%").max_memory, torch.device("cuda", 0)) == 40 * GB
    assert memory_cap(cfg("16G").max_memory, torch.device("cuda", 0)) == 16 * 2**30
    assert cfg(8_000_000_000).max_memory == 8_000_000_000
    with pytest.raises(UsageError, match="--max-memory 'lots'"):
        cfg("lots")


def test_mlperf_durations_help_says_it_sets_the_server_bound(cli):
    r = cli("infer", "--help")
    text = " ".join(r.stdout.replace("│", " ").split())
    assert "and for server its latency bound (e.g. 15 ms for resnet50, 10 ms for models mlperf.conf does not" in text


def test_printout_shows_mlperfs_figure_then_the_raw_one_named_as_such():
    from rich.console import Console

    from dlscale.cli.infer import extra_table
    from dlscale.record import RunRecord

    def shown(**metrics) -> str:
        rec = RunRecord(kind="inference", workload="tinycnn", config={}, metrics=metrics,
                        units={"scenario_metric": "s", "latency_p90": "s", "latency_bound_s": "s",
                               "max_query_count": "queries", "scheduled_samples_per_s": "images/s"})
        console = Console(width=200, record=True)
        console.print(extra_table(rec))
        return console.export_text()

    text = shown(scenario="single-stream", scenario_metric_name="early_stopping_latency_p90", scenario_metric=0.001357,
                 scenario_raw_name="latency_p90", latency_p90=0.00114, mlperf_result_key="early_stopping_latency_ss")
    assert text.index("1.36 ms") < text.index("latency p90 (raw, not MLPerf's figure) │ 1.14 ms")
    text = shown(scenario="server", scenario_metric_name="completed_samples_per_s", scenario_metric=None,
                 scenario_raw_name="scheduled_samples_per_s", scheduled_samples_per_s=93336.2, latency_bound_s=0.001,
                 latency_bound_source="--latency-bound", max_query_count=128, valid=False)
    assert "scenario metric" in text and "none (the warnings say why)" in text
    assert "max query count" in text and "128 queries" in text and "latency bound source" in text
