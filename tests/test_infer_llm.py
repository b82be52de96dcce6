"""LLM inference (dlscale.infer.llm): prefill and greedy decode with a KV cache on llama_tiny.

The figures are checked against hand-computed values from given times, the timing against an
injected clock, the cache against a from-scratch recompute (same tokens) and a hook that sees one
token fed per decode step, and the whole run for figures, units and exact relations between them.
"""

from __future__ import annotations

import json
import math

import pytest

from dlscale import workloads
from dlscale.errors import UsageError
from dlscale.infer.llm import (UNITS, check_inputs, collect, greedy_generate, llm_config, llm_figures,
                               run_llm_inference)


@pytest.fixture(scope="module")
def tiny():
    """llama_tiny (random init, seed 0) in eval mode, and its TrainConfig with seq_len = 8 prompt tokens."""
    import torch

    cfg = llm_config("llama_tiny", None, prompt_len=8, output_len=6, precision="fp32")
    torch.manual_seed(0)
    return workloads.get("llama_tiny").build(cfg).eval(), cfg


def _prompt(cfg, batch: int, seed: int = 0):
    from dataclasses import replace

    return workloads.get("llama_tiny").make_batch(replace(cfg, batch_size=batch), "cpu", seed)[0]


# -- the arithmetic ------------------------------------------------------------------------------------
def test_figures_by_hand():
    """batch 2, prompt 4 tokens, output 3 tokens (2 decode steps), 3 generations.

    TTFTs 0.1, 0.2, 0.3: mean 0.2, s = 0.1, CI 0.2 -/+ 4.3027 * 0.1 / sqrt(3) = 0.2 -/+ 0.248418;
    prefill tokens/s = 2 * 4 * 3 / 0.6 = 40, CI [8 / 0.448418, inf] (the lower time bound is < 0).
    Decode steps [.01, .03], [.02, .03], [.04, .02]: totals .04, .05, .06 (mean .05, s .01, half
    4.3027 * .01 / sqrt(3) = .0248418); decode tokens/s = 2 * 2 * 3 / 0.15 = 80, CI [4 / .0748418,
    4 / .0251582]; TPOT = 0.15 / 6 = 0.025 = batch / decode tokens/s, CI the totals' CI / 2;
    sorted steps .01 .02 .02 .03 .03 .04: p50 at h = 2.5 -> .025, p90 at h = 4.5 -> .035, p99 at
    h = 4.95 -> .0395, max .04;
    request latency 0.2 + 0.05 = 0.25; CV .01 / .05 = 0.2.
    """
    f = llm_figures(2, 4, 3, [0.1, 0.2, 0.3], [[0.01, 0.03], [0.02, 0.03], [0.04, 0.02]])
    half_p, half_d = 4.3027 * 0.1 / math.sqrt(3), 4.3027 * 0.01 / math.sqrt(3)
    assert f["prefill_tokens_per_s"] == pytest.approx(40.0)
    assert f["prefill_tokens_per_s_ci95"][0] == pytest.approx(8 / (0.2 + half_p))
    assert f["prefill_tokens_per_s_ci95"][1] == math.inf
    assert f["time_to_first_token_s"] == pytest.approx(0.2)
    assert f["time_to_first_token_ci95"] == pytest.approx([0.2 - half_p, 0.2 + half_p])
    assert f["decode_tokens_per_s"] == pytest.approx(80.0)
    assert f["decode_tokens_per_s_ci95"] == pytest.approx([4 / (0.05 + half_d), 4 / (0.05 - half_d)])
    assert f["time_per_output_token_s"] == pytest.approx(0.025)
    assert f["time_per_output_token_ci95"] == pytest.approx([(0.05 - half_d) / 2, (0.05 + half_d) / 2])
    assert f["decode_step_p50_s"] == pytest.approx(0.025)
    assert f["decode_step_p90_s"] == pytest.approx(0.035)
    assert f["decode_step_p99_s"] == pytest.approx(0.0395) and f["decode_step_max_s"] == 0.04
    assert f["request_latency_s"] == pytest.approx(0.25)
    assert f["cv"] == pytest.approx(0.2)


def test_figures_of_one_generation_have_no_interval():
    f = llm_figures(1, 10, 2, [0.5], [[0.1]])
    assert f["prefill_tokens_per_s"] == pytest.approx(20.0) and f["decode_tokens_per_s"] == pytest.approx(10.0)
    assert f["prefill_tokens_per_s_ci95"] is None and f["time_per_output_token_ci95"] is None
    with pytest.raises(ValueError):
        llm_figures(1, 10, 3, [0.5], [[0.1]])  # output 3 tokens needs 2 decode steps


def test_collect_headlines_at_the_largest_batch_and_throughput_at_the_best():
    per = [llm_figures(b, 4, 2, [t], [[d]]) for b, t, d in ((4, 1.0, 0.1), (1, 1.0, 0.01), (2, 1.0, 1.0))]
    m = collect([4, 1, 2], per)
    assert m["batch_sizes"] == [4, 1, 2] and m["headline_batch_size"] == 4
    assert m["decode_tokens_per_s_by_batch"] == pytest.approx([40.0, 100.0, 2.0])
    assert m["decode_tokens_per_s"] == pytest.approx(40.0) and m["prefill_tokens_per_s"] == pytest.approx(16.0)
    assert m["throughput"] == pytest.approx(100.0) and m["best_batch_size"] == 1
    assert m["throughput_by_batch"] == m["decode_tokens_per_s_by_batch"]
    assert m["latency_p90_by_batch"] == m["decode_step_p90_s_by_batch"] == pytest.approx([0.1, 0.01, 1.0])


# -- the generation ------------------------------------------------------------------------------------
def test_generation_times_come_from_the_clock(tiny):
    """One clock read per mark, the spans tiling the generation: prefill 0 -> 0.5, decode steps
    0.5 -> 0.75 and 0.75 -> 1.25."""
    import torch

    model, cfg = tiny
    ticks = iter([0.0, 0.5, 0.75, 1.25])
    with torch.inference_mode():
        g = greedy_generate(model, _prompt(cfg, 2), 3, torch.device("cpu"), clock=lambda: next(ticks))
    assert g.prefill_s == 0.5 and g.decode_step_s == [0.25, 0.5]
    assert tuple(g.tokens.shape) == (2, 3)


def test_decode_feeds_one_token_per_step_into_a_growing_cache(tiny):
    """A hook on the decoder sees the prompt once, then one token per row per step, with the cache
    already holding every earlier position."""
    import torch

    model, cfg = tiny
    seen: list[tuple[int, int, int]] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.x renamed the keyword
        seen.append((ids.shape[0], ids.shape[1], cache.get_seq_length()))

    handle = model.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.inference_mode():
            greedy_generate(model, _prompt(cfg, 3), 5, torch.device("cpu"))
    finally:
        handle.remove()
    assert seen == [(3, 8, 0), (3, 1, 8), (3, 1, 9), (3, 1, 10), (3, 1, 11)]


def test_cached_greedy_equals_recompute_from_scratch(tiny):
    """The same greedy tokens as re-running the whole sequence without a cache at every step."""
    import torch

    model, cfg = tiny
    prompt = _prompt(cfg, 2, seed=3)
    with torch.inference_mode():
        cached = greedy_generate(model, prompt, 6, torch.device("cpu")).tokens
        ids = prompt
        for _ in range(6):
            nxt = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    assert torch.equal(cached, ids[:, prompt.shape[1]:])


# -- the whole run -------------------------------------------------------------------------------------
def test_run_reports_every_figure_with_units():
    m, units, raw, warnings = run_llm_inference("llama_tiny", batch_sizes=[1, 2], prompt_len=8, output_len=4,
                                                precision="fp32", device="cpu", warmup=1, iters=2)
    from dlscale.infer import limit

    assert set(m) <= set(units) and units == {**UNITS, **limit.UNITS}
    assert units["decode_tokens_per_s"] == "tokens/s" and units["time_to_first_token_s"] == "s"
    assert m["batch_sizes"] == [1, 2] and m["headline_batch_size"] == 2 and m["iters"] == 2
    for name in ("prefill_tokens_per_s_by_batch", "decode_tokens_per_s_by_batch", "time_to_first_token_s_by_batch",
                 "time_per_output_token_s_by_batch", "decode_step_p50_s_by_batch", "decode_step_p90_s_by_batch"):
        assert len(m[name]) == 2 and all(v > 0 for v in m[name]), name
    for i, b in enumerate([1, 2]):
        assert m["decode_tokens_per_s_by_batch"][i] == pytest.approx(b / m["time_per_output_token_s_by_batch"][i])
        assert m["prefill_tokens_per_s_by_batch"][i] == pytest.approx(b * 8 / m["time_to_first_token_s_by_batch"][i])
        run = raw["by_batch"][i]
        assert run["batch_size"] == b and len(run["prefill_s"]) == 2
        assert [len(d) for d in run["decode_step_s"]] == [3, 3] and len(run["first_row_tokens"]) == 4
    assert m["decode_tokens_per_s"] == m["decode_tokens_per_s_by_batch"][1]
    assert all(w.count("\n") == 0 for w in warnings)
    assert raw["decode_mode"] == "eager" and raw["decode"].startswith("greedy") and "eager" in raw["decode"]
    assert "compile_s_by_batch" not in m  # nothing compiled: no compile time to record
    # against the limit: the copy measured here, no datasheet on a CPU, the bytes/s exactly the formula's
    assert m["reference_copy_gbps"] > 0 and m["datasheet_memory_gbps"] is None
    assert raw["memory_limit"]["datasheet_source"] == limit.NO_CPU_DATASHEET
    lim = raw["memory_limit"]
    for i, b in enumerate([1, 2]):
        step = limit.step_bytes(lim["weight_bytes_read_per_step"], lim["kv_bytes_per_position"], b, 8, 4)
        assert m["decode_memory_gbps_by_batch"][i] == pytest.approx(step * m["decode_tokens_per_s_by_batch"][i] / b / 1e9)
        assert m["decode_fraction_of_copy_by_batch"][i] == pytest.approx(m["decode_memory_gbps_by_batch"][i]
                                                                          / m["reference_copy_gbps"])
    assert m["decode_fraction_of_datasheet_by_batch"] == [None, None]
    json.dumps(raw)  # the record stores it


@pytest.mark.isa
def test_bf16_runs_with_bf16_weights_and_one_generation_warns():
    m, _, raw, warnings = run_llm_inference("llama_tiny", batch_sizes=[2], prompt_len=4, output_len=2,
                                            precision="bf16", device="cpu", warmup=0, iters=1)
    assert m["decode_tokens_per_s"] > 0 and raw["precision"] == "bf16" and raw["weights_dtype"] == "bfloat16"
    from dlscale.domains.llm.workload import param_counts

    fields = workloads.get("llama_tiny").fields(llm_config("llama_tiny", None, 4, 2, "bf16"))
    assert raw["memory_limit"]["weight_bytes_read_per_step"] == 2 * param_counts(fields)[0]  # 2 bytes a weight
    assert m["decode_tokens_per_s_ci95_by_batch"] == [None]
    assert any("--iters" in w for w in warnings)


# -- refused inputs ------------------------------------------------------------------------------------
def _refused(call, *args, **kwargs) -> str:
    with pytest.raises(UsageError) as e:
        call(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


_OK = {"batch_sizes": [1], "prompt_len": 8, "output_len": 4, "precision": "fp32", "warmup": 0, "iters": 1}


@pytest.mark.parametrize("change, option", [
    ({"batch_sizes": [1, 0]}, "--batch-sizes"), ({"batch_sizes": []}, "--batch-sizes"),
    ({"prompt_len": 0}, "--prompt-len"), ({"output_len": 1}, "--output-len"),
    ({"precision": "int8"}, "--precision"), ({"iters": 0}, "--iters"), ({"warmup": -1}, "--warmup"),
])
def test_bad_values_are_refused(change, option):
    assert option in _refused(check_inputs, **{**_OK, **change})


def test_a_sequence_past_the_positions_is_refused(tmp_path):
    msg = _refused(run_llm_inference, "llama_tiny", batch_sizes=[1], prompt_len=1000, output_len=25,
                   precision="fp32", device="cpu")
    assert "--prompt-len 1000" in msg and "--output-len 25" in msg and "1024" in msg
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 16}))
    msg = _refused(llm_config, "llama_tiny", str(short), 8, 9, "fp32")
    assert "--prompt-len 8" in msg and "16" in msg
    assert llm_config("llama_tiny", str(short), 8, 8, "fp32").seq_len == 8  # 16 positions fit exactly


def test_other_models_are_refused():
    assert "llm" in _refused(run_llm_inference, "tinycnn", batch_sizes=[1], prompt_len=8, output_len=4,
                             precision="fp32", device="cpu")
    assert "--model-config" in _refused(llm_config, "llama", None, 8, 4, "fp32")
    _refused(llm_config, "no_such_model", None, 8, 4, "fp32")


def test_cache_keyword_follows_the_installed_forward_signature():
    """transformers 5.x takes the KV cache as ``cache``; 4.x as ``past_key_values``: the adapter reads
    the model's own forward, so either end of the declared range gets the keyword it knows."""
    from dlscale.infer.decode import cache_keyword

    class Old:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kwargs):
            pass

    class New:
        def forward(self, input_ids=None, cache=None, use_cache=None, logits_to_keep=0, **kwargs):
            pass

    assert cache_keyword(Old()) == "past_key_values"
    assert cache_keyword(New()) == "cache"


# -- the command ---------------------------------------------------------------------------------------
_LLM_ARGS = ("infer", "llama_tiny", "--prompt-len", "4", "--output-len", "3", "--batch-sizes", "1,2", "--iters", "2",
             "--warmup", "0", "--device", "cpu")


@pytest.mark.parametrize("args, words", [
    (["--decode", "fast"], "--decode 'fast'"),
    (["--decode", "eager", "--compile"], "--compile"),
    (["--decode", "graph-eager"], "--decode graph-eager captures a CUDA graph"),
    (["--decode", "graph"], "--decode graph is named graph-eager"),
    (["--scenario", "offline"], "--scenario does not apply to LLM"),
    (["--find-max-batch"], "--find-max-batch does not apply to LLM"),
    (["--runtime", "onnxruntime"], "--runtime onnxruntime does not apply to LLM"),
])
def test_bad_llm_options_exit_2_with_one_line(cli, db_path, args, words):
    r = cli(*_LLM_ARGS, *args)
    assert r.code == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and r.stdout == ""


@pytest.mark.parametrize("args, words", [
    (["--prompt-len", "100000", "--output-len", "8"],  # before: "--seq-len 100000 is longer than ...": not given
     "--prompt-len 100000 + --output-len 8 = 100008 tokens exceeds llama_tiny's max_position_embeddings 1024"),
    (["--prompt-len", "100000"], "--prompt-len and --output-len go together"),
    (["--seq-len", "100000"], "--seq-len 100000 is longer than llama_tiny's max_position_embeddings 1024"),
])
def test_a_length_past_the_models_positions_names_the_option_given(cli, db_path, args, words):
    r = cli("infer", "llama_tiny", "--batch-sizes", "1", "--device", "cpu", *args)
    lines = r.stderr.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and words in lines[0], r.stderr
    assert "--seq-len" not in lines[0] or "--seq-len" in args


def test_decode_needs_an_llm_prefill_run():
    from dlscale.infer.config import InferConfig

    assert "--prompt-len" in _refused(InferConfig, model="llama_tiny", decode="compiled")
    assert InferConfig(model="llama_tiny", prompt_len=4, output_len=3, compile=True).resolve("cpu").decode == "compiled"
    assert InferConfig(model="llama_tiny", prompt_len=4, output_len=3).resolve("cpu").decode == "eager"
    assert InferConfig(model="tinycnn").resolve("cpu").decode is None


def test_the_table_and_the_record_say_the_decode_mode(cli, db_path):
    r = cli(*_LLM_ARGS)
    assert r.code == 0, r.stderr
    assert "decode eager" in r.stdout and "decode tokens per s (eager)" in r.stdout
    assert "compile time" not in r.stdout


@pytest.mark.long
def test_compile_runs_the_compiled_decode_and_keeps_the_eager_tokens(cli, db_path, monkeypatch, tmp_path):
    """--compile is --decode compiled: a static cache and a compiled step (traced here by Dynamo's eager
    backend, on a one-layer llama_tiny: the wiring, not Inductor, is under test), one compile per batch
    size, recorded apart, and the same greedy tokens as the eager run of the same seed."""
    from dlscale.infer import decode, llm

    one_layer = tmp_path / "one_layer.json"
    one_layer.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))

    def traced_only(mode, model, device, output_len):
        if mode == "compiled":
            return decode.CompiledDecoder(model, device, output_len, backend="eager")
        return decode.make_decoder(mode, model, device, output_len)

    monkeypatch.setattr(llm, "make_decoder", traced_only)
    runs = {}
    for extra in ([], ["--compile"]):
        r = cli(*_LLM_ARGS, "--model-config", str(one_layer), "--format", "json", *extra)
        assert r.code == 0, r.stderr
        runs[bool(extra)] = json.loads(r.stdout)
    eager, compiled = runs[False], runs[True]
    assert compiled["config"]["decode"] == "compiled" == compiled["raw"]["decode_mode"]
    assert eager["config"]["decode"] == "eager" and "compile_s_by_batch" not in eager["metrics"]
    m = compiled["metrics"]
    assert len(m["compile_s_by_batch"]) == 2 and all(s > 0 for s in m["compile_s_by_batch"])
    assert m["compiles_by_batch"] in ([1, 1], [None, None]) and compiled["units"]["compile_s_by_batch"] == "s"
    assert [b["first_row_tokens"] for b in compiled["raw"]["by_batch"]] == \
        [b["first_row_tokens"] for b in eager["raw"]["by_batch"]]
