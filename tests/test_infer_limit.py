"""Decode against its physical limit (dlscale.infer.limit) and the 7B-class shape's sizing, by hand.

The 7B shape is never built with weights here: its sizes are checked on the meta device and its
refusal with a stated amount of free memory, so the suite stays as quick as the small shapes make it.
"""

from __future__ import annotations

import pytest

from dlscale import workloads
from dlscale.domains.llm.workload import inference_memory, kv_bytes_per_position, param_counts
from dlscale.errors import UsageError
from dlscale.infer import limit
from dlscale.infer.llm import check_memory, limit_figures, llm_config

GIB = 2**30


def _fields(model: str) -> dict:
    return workloads.get(model).fields(llm_config(model, None, 128, 64, "bf16"))


# -- the arithmetic ------------------------------------------------------------------------------------
def test_a_7b_model_at_100_tokens_per_s_reads_1_35_tb_per_s():
    """13.5 GB of bf16 weights read once per token at 100 tokens/s (batch 1, KV left out) is 1.35 TB/s:
    0.28 of an H200's 4.8 TB/s datasheet rate, and 1350 / 4186.5 = 0.3225 of the d2d copy the H200 run
    measured."""
    f = limit.figures(13.5e9, 1, 100.0, 4186.5, 4800.0)
    assert f["decode_memory_gbps"] == pytest.approx(1350.0)
    assert f["decode_fraction_of_datasheet"] == pytest.approx(0.28125)
    assert f["decode_fraction_of_copy"] == pytest.approx(1350.0 / 4186.5)
    assert f["decode_bytes_per_token"] == pytest.approx(13.5e9)
    none = limit.figures(13.5e9, 1, 100.0, None, None)
    assert none["decode_fraction_of_copy"] is None and none["decode_fraction_of_datasheet"] is None


def test_at_batch_b_the_weights_are_read_once_per_step_and_the_kv_cache_per_sequence():
    """W = 1 GB, K = 1 MB per position, batch 4, prompt 100, output 20: the mean context is 100 + 20/2 =
    110 positions, a step reads 1e9 + 4 x 1e6 x 110 = 1.44e9 bytes for 4 tokens (3.6e8 per token), and at
    400 tokens/s (100 steps/s) that is 144 GB/s."""
    step = limit.step_bytes(1e9, 1e6, 4, 100, 20)
    assert step == pytest.approx(1.44e9)
    f = limit.figures(step, 4, 400.0, 288.0, None)
    assert f["decode_bytes_per_token"] == pytest.approx(3.6e8)
    assert f["decode_memory_gbps"] == pytest.approx(144.0) and f["decode_fraction_of_copy"] == pytest.approx(0.5)


def test_the_mean_context_is_the_average_of_what_each_step_attends_over():
    """Step j of N - 1 attends over P + j positions: for P 3, N 5 the steps see 4, 5, 6, 7 (mean 5.5 = 3 + 5/2)."""
    per_step = [3 + j for j in range(1, 5)]
    assert limit.step_bytes(0, 1, 1, 3, 5) == pytest.approx(sum(per_step) / len(per_step))


def test_limit_figures_follow_each_batch_size_and_headline_the_largest():
    fields = _fields("llama_tiny")
    metrics = {"batch_sizes": [1, 2], "decode_tokens_per_s_by_batch": [10.0, 30.0], "headline_batch_size": 2,
               "prompt_len": 8, "output_len": 4}
    out, raw = limit_figures(fields, 4, metrics, ((2.0, "measured"), (None, "no datasheet")))
    w, kv = param_counts(fields)[0] * 4, kv_bytes_per_position(fields, 4)
    assert raw["weight_bytes_read_per_step"] == w and raw["kv_bytes_per_position"] == kv
    assert raw["mean_context_positions"] == 10 and raw["datasheet_source"] == "no datasheet"
    for i, (b, tps) in enumerate(((1, 10.0), (2, 30.0))):
        gbps = (w + b * kv * 10) * tps / b / 1e9
        assert out["decode_memory_gbps_by_batch"][i] == pytest.approx(gbps)
        assert out["decode_fraction_of_copy_by_batch"][i] == pytest.approx(gbps / 2.0)
    assert out["decode_memory_gbps"] == out["decode_memory_gbps_by_batch"][1]
    assert out["decode_fraction_of_datasheet"] is None and out["reference_copy_gbps"] == 2.0
    assert set(out) <= set(limit.UNITS)


# -- the 7B shape ----------------------------------------------------------------------------------------
def test_llama_7b_has_llama_2_7b_sizes_by_hand():
    """Per layer 4 x 4096^2 (attention, 32 KV heads) + 3 x 4096 x 11008 (SwiGLU) + 2 x 4096 (norms) =
    202,383,360; x 32 + 4096 (final norm) + 32000 x 4096 (output) = N 6,607,343,616 read per token; with
    the input embedding 6,738,415,616 parameters (Llama 2 7B's 6.74B). bf16: 13,214,687,232 bytes read per
    step, KV 2 x 32 x 32 x 128 x 2 = 524,288 bytes per position."""
    f = _fields("llama_7b")
    assert param_counts(f) == (6_607_343_616, 131_072_000)
    assert limit.weight_bytes_read(f, 2) == 13_214_687_232
    assert kv_bytes_per_position(f, 2) == 524_288


def test_llama_7b_builds_in_bf16_on_the_meta_device_with_that_many_parameters():
    """Made directly in its dtype on a device (here meta: no memory, no init work), never in fp32 first."""
    import torch

    w = workloads.get("llama_7b")
    net = w.build_in(llm_config("llama_7b", None, 128, 64, "bf16"), "meta", torch.bfloat16)
    params = list(net.parameters())
    assert sum(p.numel() for p in params) == 6_738_415_616
    assert {p.dtype for p in params} == {torch.bfloat16} and {p.device.type for p in params} == {"meta"}
    assert torch.get_default_dtype() == torch.float32  # restored


def test_the_memory_estimate_by_hand():
    """llama_7b bf16, batch 1, prompt 128, output 64: weights 6,738,415,616 x 2; KV 524,288 x 192;
    activations 128 x (4 x 4096 + 3 x 11008) x 2 + 32 x 128^2 x 2 + 32000 x 4 = 12,648,448 + 1,048,576 +
    128,000."""
    need = inference_memory(_fields("llama_7b"), 2, 1, 128, 64)
    assert need == {"weights": 13_476_831_232, "kv_cache": 100_663_296, "activations": 13_825_024,
                    "total": 13_476_831_232 + 100_663_296 + 13_825_024}


def test_a_generation_that_does_not_fit_is_refused_in_one_line_before_anything_is_built():
    f = _fields("llama_7b")
    with pytest.raises(UsageError) as e:
        check_memory("llama_7b", f, 2, "bf16", 1, 128, 64, "cuda:0", free=8 * GIB)
    msg = str(e.value)
    assert "\n" not in msg and "llama_7b in bf16" in msg and "12.66 GiB" in msg and "8.00 GiB free" in msg
    check_memory("llama_7b", f, 2, "bf16", 1, 128, 64, "cuda:0", free=80 * GIB)  # fits: no error
    limit.check_fits("llama_7b", inference_memory(f, 2, 1, 128, 64), "bf16", "b1", "cpu", None)  # free unknown


def test_the_command_refuses_the_7b_with_exit_2_where_memory_is_short(cli, db_path, monkeypatch):
    from dlscale.domains.llm.workload import LlamaLM

    def never(*_a, **_k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(limit, "free_memory", lambda device: 4 * GIB)
    monkeypatch.setattr(LlamaLM, "build_in", never)
    r = cli("infer", "llama_7b", "--prompt-len", "8", "--output-len", "2", "--batch-sizes", "1", "--device", "cpu",
            "--precision", "bf16")
    assert r.code == 2, r.stderr
    lines = r.stderr.strip().splitlines()  # the progress lines, then the error's one line
    assert "llama_7b in bf16" in lines[-1] and "4.00 GiB free" in lines[-1] and r.stdout == ""
    assert sum("needs about" in ln for ln in lines) == 1


# -- the two reference rates ------------------------------------------------------------------------------
class _Cuda:
    type = "cuda"


def test_the_datasheet_rate_is_the_gpus_row_and_none_on_a_cpu(monkeypatch):
    import torch

    from dlscale.harness import device as dev

    gbps, why = limit.datasheet_bandwidth(torch.device("cpu"))
    assert gbps is None and why == limit.NO_CPU_DATASHEET
    monkeypatch.setattr(dev, "device_name", lambda d: "NVIDIA H200")
    gbps, source = limit.datasheet_bandwidth(_Cuda())
    assert gbps == 4800 and "H200" in source and "4.8 TB/s" in source
    monkeypatch.setattr(dev, "device_name", lambda d: "NVIDIA GeForce RTX 4090")
    gbps, why = limit.datasheet_bandwidth(_Cuda())
    assert gbps is None and "RTX 4090" in why


def test_the_copy_rate_counts_read_and_write_as_micro_memory_does(monkeypatch):
    """CPU: STREAM copy's 2 arrays of n float64 over the mean call time (arrays capped at CPU_COPY_MIB, said where
    that is under STREAM's rule); GPU: 2 x 256 MiB over the median."""
    import torch

    from dlscale.micro import memory

    calls = []

    def timer(op, warmup, reps, device):
        calls.append((warmup, reps, device))
        return [0.01, 0.02, 0.03] if getattr(device, "type", "") == "cuda" else [0.1, 0.3]

    monkeypatch.setattr(memory, "default_array_mib", lambda: 1)
    monkeypatch.setattr(memory, "build_transfer", lambda kind, nbytes, device: (lambda: None))
    gbps, how = limit.copy_bandwidth(torch.device("cpu"), timer)
    assert gbps == pytest.approx(memory.stream_bytes("copy", 2**20 // 8) / 0.2 / 1e9) and "STREAM copy of 1 MiB" in how
    gbps, how = limit.copy_bandwidth(_Cuda(), timer)
    assert gbps == pytest.approx(2 * 256 * 2**20 / 0.02 / 1e9) and "device-to-device" in how and "median" in how
    assert [c[:2] for c in calls] == [(1, limit.CPU_COPY_REPS), (limit.COPY_WARMUP, limit.COPY_REPS)]
    monkeypatch.setattr(memory, "default_array_mib", lambda: 4096)  # a VM's huge cache: capped, and said
    monkeypatch.setattr(memory, "last_level_cache_bytes", lambda: 480 * 2**20)
    _, how = limit.copy_bandwidth(torch.device("cpu"), lambda *a: [1.0])
    assert f"STREAM copy of {limit.CPU_COPY_MIB} MiB" in how and "4x the last-level cache (480 MiB)" in how
