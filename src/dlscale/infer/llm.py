"""LLM inference for the Llama family: prefill and greedy decode with a KV cache, at each batch size.

The model is the registered ``llm`` workload built from a ``TrainConfig`` (so ``--model-config``
selects or varies it exactly as for training), random weights, eval mode, under
``torch.inference_mode``. The model is made directly on the device in the run's dtype
(``LlamaLM.build_in``: its random init runs there, nothing is materialised in fp32 on the host
first), as inference servers load their weights, and runs without autocast: autocast over fp32
weights would re-cast every weight at every forward, because its weight-cast cache is off under
``inference_mode`` (a one-token decode step is mostly reading weights, so that made bf16 decode
slower than fp32 on a CPU). Before it is made, a run whose weights, KV cache and activations exceed
the device's free memory is refused in one line (``check_memory``), and the device's copy bandwidth
is measured (``dlscale.infer.limit``). The
prompts are ``batch`` rows of ``prompt_len`` random token ids: the workload's own synthetic batch,
deterministic from the seed.

One generation of ``output_len`` tokens (all rows at once, no padding), in the decode mode
``--decode`` names (``dlscale.infer.decode``: eager DynamicCache, or a static cache with the
one-token step compiled, or its eager kernels captured as a CUDA graph):

- **prefill**: one forward over the whole prompt into the KV cache that returns the logits of the
  last position only (``logits_to_keep=1``, as ``generate`` does); their argmax is the first
  generated token. Its time is the **time to first token** (TTFT): from the request's start to the
  first token's id, i.e. the prefill forward plus the argmax.
- **decode**: ``output_len - 1`` steps, each feeding the previous step's greedy (argmax) token,
  one token per row, with the cache, and taking the argmax of the new logits. The first token is
  not a decode step, so ``output_len`` must be at least 2.

The spans are consecutive marks of ``harness.timing.MarkClock`` (CUDA events with one synchronise
per generation; ``perf_counter`` on the CPU). The cache ends holding ``prompt_len + output_len - 1``
positions; ``prompt_len + output_len`` may not exceed the model's ``max_position_embeddings``. At
each batch size the decoder is prepared first (compiled/graph: compile or capture and untimed whole
generations, their wall time recorded as ``compile_s_by_batch``, never in a figure), then ``warmup``
whole generations run and are not counted; then ``iters`` measured generations. Figures (see
:func:`llm_figures`, and docs/METRICS.md): prefill tokens/s ``batch·prompt_len / mean TTFT``, decode
tokens/s ``batch / mean step time``, time per output token (TPOT) the mean decode step time, p50/p90
of the pooled step times; CIs are the t-intervals of the mean per-generation time, mapped through
the reciprocal; each batch size's decode against its memory-bandwidth limit (:func:`limit_figures`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from dlscale import stats
from dlscale.errors import UsageError
from dlscale.infer.decode import Generation, make_decoder, resolve_mode

PRECISIONS = ("fp32", "bf16", "fp16")
NO_CI = "one measured generation per batch size: no confidence interval; use --iters >= 2"

UNITS = {
    "batch_sizes": "sequences",
    "prompt_len": "tokens",
    "output_len": "tokens",
    "prefill_tokens_per_s_by_batch": "tokens/s",
    "prefill_tokens_per_s_ci95_by_batch": "tokens/s",
    "decode_tokens_per_s_by_batch": "tokens/s",
    "decode_tokens_per_s_ci95_by_batch": "tokens/s",
    "time_to_first_token_s_by_batch": "s",
    "time_to_first_token_ci95_by_batch": "s",
    "time_per_output_token_s_by_batch": "s",
    "time_per_output_token_ci95_by_batch": "s",
    "decode_step_p50_s_by_batch": "s",
    "decode_step_p90_s_by_batch": "s",
    "decode_step_p99_s_by_batch": "s",
    "decode_step_max_s_by_batch": "s",
    "request_latency_s_by_batch": "s",
    "cv_by_batch": "fraction",
    "throughput_by_batch": "tokens/s",
    "throughput_ci95_by_batch": "tokens/s",
    "latency_p50_by_batch": "s",
    "latency_p90_by_batch": "s",
    "latency_p99_by_batch": "s",
    "latency_max_by_batch": "s",
    "throughput": "tokens/s",
    "best_batch_size": "sequences",
    "headline_batch_size": "sequences",
    "prefill_tokens_per_s": "tokens/s",
    "decode_tokens_per_s": "tokens/s",
    "time_to_first_token_s": "s",
    "time_per_output_token_s": "s",
    "iters": "generations",
    "compile_s_by_batch": "s",
    "compiles_by_batch": "graphs",
}

# Per-batch figure (from llm_figures) -> the metric that lists it across batch sizes.
_BY_BATCH = {
    "prefill_tokens_per_s": "prefill_tokens_per_s_by_batch",
    "prefill_tokens_per_s_ci95": "prefill_tokens_per_s_ci95_by_batch",
    "decode_tokens_per_s": "decode_tokens_per_s_by_batch",
    "decode_tokens_per_s_ci95": "decode_tokens_per_s_ci95_by_batch",
    "time_to_first_token_s": "time_to_first_token_s_by_batch",
    "time_to_first_token_ci95": "time_to_first_token_ci95_by_batch",
    "time_per_output_token_s": "time_per_output_token_s_by_batch",
    "time_per_output_token_ci95": "time_per_output_token_ci95_by_batch",
    "decode_step_p50_s": "decode_step_p50_s_by_batch",
    "decode_step_p90_s": "decode_step_p90_s_by_batch",
    "decode_step_p99_s": "decode_step_p99_s_by_batch",
    "decode_step_max_s": "decode_step_max_s_by_batch",
    "request_latency_s": "request_latency_s_by_batch",
    "cv": "cv_by_batch",
}
_HEADLINES = ("prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_s", "time_per_output_token_s")


def check_inputs(batch_sizes: Sequence[int], prompt_len: int, output_len: int, precision: str,
                 warmup: int, iters: int) -> None:
    """Refuse values no measurement can take, each with one line naming its option."""
    if not batch_sizes:
        raise UsageError("--batch-sizes is empty; give at least one batch size, e.g. 1,4")
    bad = [b for b in batch_sizes if isinstance(b, bool) or not isinstance(b, int) or b <= 0]
    if bad:
        raise UsageError(f"--batch-sizes must be positive integers, got {bad[0]!r}")
    if prompt_len <= 0:
        raise UsageError(f"--prompt-len must be > 0 tokens, got {prompt_len}")
    if output_len < 2:
        raise UsageError(f"--output-len must be >= 2 tokens (the first comes from the prefill, decode needs "
                         f"at least one more), got {output_len}")
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r} is not available for LLM inference; choose one of "
                         f"{', '.join(PRECISIONS)}")
    if warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {warmup}")
    if iters <= 0:
        raise UsageError(f"--iters must be > 0, got {iters}")


def llm_config(model: str, model_config: str | None, prompt_len: int, output_len: int,
               precision: str) -> Any:
    """The ``TrainConfig`` the workload builds from (seq_len = prompt_len); a ``UsageError`` for a model
    that is not an LLM or a sequence longer than the model's positions."""
    from dlscale import workloads
    from dlscale.config import TrainConfig

    w = workloads.get(model)  # unknown name -> UsageError listing the known ones
    if w.family != "llm":
        raise UsageError(f"{model} is a {w.family} model; LLM inference (--prompt-len/--output-len) takes an llm "
                         "model such as llama_tiny")
    cfg = TrainConfig(model=model, batch_size=1, model_config=model_config, precision=precision)
    most = w.fields(cfg)["max_position_embeddings"]
    if prompt_len + output_len > most:
        raise UsageError(f"--prompt-len {prompt_len} + --output-len {output_len} = {prompt_len + output_len} "
                         f"tokens exceeds {model}'s max_position_embeddings {most}; shorten them")
    return replace(cfg, seq_len=prompt_len)


def greedy_generate(model: Any, prompt: Any, output_len: int, device: Any, mode: str = "eager",
                    clock: Callable[[], float] = time.perf_counter) -> Generation:
    """One generation of ``output_len`` tokens in a decode mode (its decoder prepared first).

    Call it under ``torch.inference_mode``. On the CPU ``clock`` is read at each of the
    ``output_len + 1`` marks, so a test can feed it known times.
    """
    from dlscale.harness.timing import MarkClock

    decoder = make_decoder(mode, model, device, output_len)
    decoder.prepare(prompt)
    with decoder.frozen():
        return decoder.generate(prompt, MarkClock(device, output_len + 1, clock))


def _ci(ci: tuple[float, float] | None) -> list[float] | None:
    return list(ci) if ci is not None else None


def llm_figures(batch: int, prompt_len: int, output_len: int, prefill_s: Sequence[float],
                decode_step_s: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The figures of one batch size from its measured generations' times (pure arithmetic).

    ``prefill_s[i]`` is generation i's TTFT, ``decode_step_s[i]`` its ``output_len - 1`` step times.
    Throughputs are tokens over the summed time of all generations (so decode tokens/s is exactly
    batch / TPOT and prefill tokens/s batch * prompt_len / TTFT); their CIs map the t-interval of the
    mean per-generation time. ``cv`` is the CV of the per-generation decode times.
    """
    if not prefill_s or len(prefill_s) != len(decode_step_s):
        raise ValueError("one prefill time and one list of decode step times per generation")
    steps = output_len - 1
    if any(len(d) != steps for d in decode_step_s):
        raise ValueError(f"every generation needs output_len - 1 = {steps} decode step times")
    decode_totals = [math.fsum(d) for d in decode_step_s]
    pooled = [t for d in decode_step_s for t in d]
    ttft, tpot = stats.mean(prefill_s), stats.mean(pooled)
    tpot_ci = stats.mean_ci95(decode_totals)
    return {
        "prefill_tokens_per_s": stats.throughput(batch * prompt_len, prefill_s),
        "prefill_tokens_per_s_ci95": _ci(stats.throughput_ci95_from_steps(batch * prompt_len, prefill_s)),
        "decode_tokens_per_s": stats.throughput(batch * steps, decode_totals),
        "decode_tokens_per_s_ci95": _ci(stats.throughput_ci95_from_steps(batch * steps, decode_totals)),
        "time_to_first_token_s": ttft,
        "time_to_first_token_ci95": _ci(stats.mean_ci95(prefill_s)),
        "time_per_output_token_s": tpot,
        "time_per_output_token_ci95": [t / steps for t in tpot_ci] if tpot_ci is not None else None,
        "decode_step_p50_s": stats.percentile(pooled, 50),
        "decode_step_p90_s": stats.percentile(pooled, 90),
        "decode_step_p99_s": stats.percentile(pooled, 99),
        "decode_step_max_s": max(pooled),
        "request_latency_s": ttft + stats.mean(decode_totals),
        "cv": stats.cv(decode_totals),
    }


def collect(batch_sizes: Sequence[int], per_batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-batch figures as lists aligned with ``batch_sizes``; headlines at the largest batch.

    The inference record's generic names hold the decode figures: ``throughput_by_batch`` (and its
    CI) is decode tokens/s, ``latency_*_by_batch`` the decode step percentiles (one batch's one-token
    forward), ``throughput`` the decode tokens/s of the best batch, ``best_batch_size`` that batch."""
    m: dict[str, Any] = {"batch_sizes": list(batch_sizes)}
    for fig, name in _BY_BATCH.items():
        m[name] = [f[fig] for f in per_batch]
    top = max(range(len(batch_sizes)), key=lambda i: batch_sizes[i])
    m["headline_batch_size"] = batch_sizes[top]
    m.update({h: per_batch[top][h] for h in _HEADLINES})
    m["throughput_by_batch"] = list(m["decode_tokens_per_s_by_batch"])
    m["throughput_ci95_by_batch"] = list(m["decode_tokens_per_s_ci95_by_batch"])
    for q in ("p50", "p90", "p99", "max"):
        m[f"latency_{q}_by_batch"] = list(m[f"decode_step_{q}_s_by_batch"])
    best = max(range(len(batch_sizes)), key=lambda i: m["throughput_by_batch"][i])
    m["throughput"], m["best_batch_size"] = m["throughput_by_batch"][best], batch_sizes[best]
    return m


def _device(device: Any) -> Any:
    """A torch.device from a device or a name ('auto', 'cpu', 'cuda')."""
    import torch

    from dlscale.harness.device import select_device

    if isinstance(device, torch.device):
        return device
    return select_device(str(device)) if str(device) in ("auto", "cpu", "cuda") else torch.device(device)


def _measure_batch(w: Any, cfg: Any, decoder: Any, batch: int, output_len: int, device: Any, warmup: int,
                   iters: int, seed: int, meter: Any = None) -> list[Generation]:
    """The decoder prepared for one batch of prompts (compile/capture, untimed), ``warmup`` uncounted
    generations, then ``iters`` measured ones (``meter``, an EnergyMeter, read after the warm-up's
    last synchronisation and the last generation's)."""
    from dlscale.harness.device import synchronize
    from dlscale.harness.timing import MarkClock

    prompt, _ = w.make_batch(replace(cfg, batch_size=batch), device, seed)
    decoder.prepare(prompt)
    clock = MarkClock(device, output_len + 1)  # its events are made once, before any timed generation
    with decoder.frozen():
        for _ in range(warmup):
            decoder.generate(prompt, clock)
        synchronize(device)
        if meter is not None:
            meter.begin()
        gens = [decoder.generate(prompt, clock) for _ in range(iters)]
    if meter is not None:
        meter.end()
    return gens


def run_llm_inference(model: str, *, batch_sizes: list[int], prompt_len: int, output_len: int, precision: str,
                      device: Any, model_config: str | None = None, warmup: int = 1, iters: int = 3,
                      seed: int = 0, decode: str = "eager", cudnn_benchmark: bool = True
                      ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], list[str]]:
    """(metrics, units, raw, warnings) of prefill and decode with a KV cache at each batch size, in the
    decode mode ``decode`` (eager, compiled or graph-eager: ``dlscale.infer.decode``), with each batch
    size's decode against its memory-bandwidth limit (``dlscale.infer.limit``), under the precision's TF32
    and cuDNN flags (``harness.device.run_flags``: set for the run, restored after it)."""
    import torch

    from dlscale import workloads
    from dlscale.harness import energy_meter as energy
    from dlscale.harness.device import autocast_dtype, check_precision, run_flags
    from dlscale.harness.energy_meter import EnergyMeter
    from dlscale.infer import limit

    check_inputs(batch_sizes, prompt_len, output_len, precision, warmup, iters)
    cfg = llm_config(model, model_config, prompt_len, output_len, precision)
    w, dev = workloads.get(model), _device(device)
    mode = resolve_mode(decode, False, dev.type)
    check_precision(precision, dev)
    with run_flags(precision, dev, cudnn_benchmark):
        dtype = autocast_dtype(precision) or torch.float32
        fields, nbytes = w.fields(cfg), torch.empty((), dtype=dtype).element_size()
        check_memory(model, fields, nbytes, precision, max(batch_sizes), prompt_len, output_len, dev)
        bandwidth = (limit.copy_bandwidth(dev), limit.datasheet_bandwidth(dev))  # before the model takes memory
        torch.manual_seed(seed)
        net = w.build_in(cfg, dev, dtype).eval()  # in its dtype on the device, no autocast: see the module docstring
        decoder = make_decoder(mode, net, dev, output_len)
        per_batch, raw_runs, prepared, energy_by_batch = [], [], [], []
        with torch.inference_mode(), EnergyMeter(dev) as meter:
            for b in batch_sizes:
                gens = _measure_batch(w, cfg, decoder, b, output_len, dev, warmup, iters, seed, meter)
                prepared.append((decoder.compile_s, decoder.compiles))
                per_batch.append(llm_figures(b, prompt_len, output_len, [g.prefill_s for g in gens],
                                             [g.decode_step_s for g in gens]))
                energy_by_batch.append(energy.figures(meter.take(), b * output_len * iters, "tokens"))
                raw_runs.append({"batch_size": b, "prefill_s": [g.prefill_s for g in gens],
                                 "decode_step_s": [g.decode_step_s for g in gens],
                                 "first_row_tokens": gens[-1].tokens[0].tolist()})
        metrics = {**collect(batch_sizes, per_batch), "prompt_len": prompt_len, "output_len": output_len,
                   "iters": iters}
        if mode != "eager":
            metrics["compile_s_by_batch"] = [c for c, _ in prepared]
            metrics["compiles_by_batch"] = [n for _, n in prepared]
        units = dict(UNITS)
        if any(m for m, _, _ in energy_by_batch):  # J per generated token, prefill included; headline at the top batch
            metrics["energy_per_unit_j_by_batch"] = [m.get("energy_per_unit_j") for m, _, _ in energy_by_batch]
            top = energy_by_batch[batch_sizes.index(metrics["headline_batch_size"])]
            metrics.update(top[0])
            units.update(top[1], energy_per_unit_j_by_batch="J/tokens")
        limit_metrics, limit_raw = limit_figures(fields, nbytes, metrics, bandwidth)
        metrics.update(limit_metrics)
        units.update(limit.UNITS)
        raw = {"by_batch": raw_runs, "decode_mode": mode, "decode": f"greedy (argmax) tokens, one per row per step; "
               f"{decoder.description}", "timing": _timing_words(dev),
               "weights_dtype": str(next(net.parameters()).dtype).removeprefix("torch."),
               "model_config": cfg.model_config, "precision": precision, "device": str(dev), "memory_limit": limit_raw,
               **energy_by_batch[batch_sizes.index(metrics["headline_batch_size"])][2]}
        return metrics, units, raw, _warnings(batch_sizes, metrics["cv_by_batch"], iters)


def check_memory(model: str, fields: dict[str, Any], nbytes: int, precision: str, batch: int, prompt_len: int,
                 output_len: int, device: Any, free: int | None = None) -> None:
    """Refuse in one line (exit 2), before anything is allocated, a run whose largest batch's weights, KV
    cache and activations (``domains.llm.workload.inference_memory``) exceed the device's free memory (``free``:
    measured where None)."""
    from dlscale.infer import limit
    from dlscale.domains.llm.workload import inference_memory

    need = inference_memory(fields, nbytes, batch, prompt_len, output_len)
    shape = f"batch {batch}, prompt {prompt_len} + output {output_len} tokens"
    limit.check_fits(model, need, precision, shape, device, limit.free_memory(device) if free is None else free)


def limit_figures(fields: dict[str, Any], nbytes: int, metrics: dict[str, Any],
                  bandwidth: tuple[tuple[float | None, str], tuple[float | None, str]]
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, raw) of every batch size's decode against the memory-bandwidth limit
    (``dlscale.infer.limit``), the headline at the headline batch size."""
    from dlscale.infer import limit
    from dlscale.domains.llm.workload import kv_bytes_per_position

    (copy_gbps, copy_how), (sheet_gbps, sheet_how) = bandwidth
    weights, kv = limit.weight_bytes_read(fields, nbytes), kv_bytes_per_position(fields, nbytes)
    rows = [limit.figures(limit.step_bytes(weights, kv, b, metrics["prompt_len"], metrics["output_len"]), b, tps,
                          copy_gbps, sheet_gbps)
            for b, tps in zip(metrics["batch_sizes"], metrics["decode_tokens_per_s_by_batch"])]
    out: dict[str, Any] = {f"{k}_by_batch": [r[k] for r in rows] for k in rows[0]}
    out.update(rows[metrics["batch_sizes"].index(metrics["headline_batch_size"])])
    out.update(reference_copy_gbps=copy_gbps, datasheet_memory_gbps=sheet_gbps)
    raw = {"weight_bytes_read_per_step": weights, "kv_bytes_per_position": kv,
           "mean_context_positions": metrics["prompt_len"] + metrics["output_len"] / 2,
           "bytes_per_step": "weights once + batch x KV bytes per position x (prompt_len + output_len / 2)",
           "copy_source": copy_how, "datasheet_source": sheet_how}
    return out, raw


def _timing_words(dev: Any) -> str:
    if dev.type == "cuda":
        return "CUDA events at every token, one device synchronise per generation"
    return "time.perf_counter at every token (CPU work is synchronous)"


def _warnings(batch_sizes: Sequence[int], cvs: Sequence[float], iters: int) -> list[str]:
    """No CI with one generation; decode times that vary more than training's stability criterion."""
    from dlscale.harness.metrics import CV_WARN

    out = [NO_CI] if iters < 2 else []
    noisy = [f"{b} ({cv:.1%})" for b, cv in zip(batch_sizes, cvs) if cv > CV_WARN]
    if noisy:
        out.append(f"decode time varies between generations above the {CV_WARN:.0%} stability criterion at batch "
                   f"{', '.join(noisy)}: the figures are noisy; use more --iters, more --warmup or a quieter machine")
    return out
