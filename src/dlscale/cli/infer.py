"""``dlscale infer MODEL``: inference throughput and latency by batch size (+ LoadGen scenarios, LLM decode)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dlscale.cli import costopts as copt
from dlscale.cli import shapeopts as sopt
from dlscale.cli.common import DbOpt, Format, FormatOpt, MinDurationOpt, TagOpt, emit

HELP = """Measure MODEL's inference throughput and latency at each batch size and record it.

At each batch size one synthetic batch stays on the device (--samples-on host: copied in from pinned
host memory for every forward, as LoadGen's samples then are); warm-up forwards are not counted,
then each timed forward (under torch.inference_mode, or onnxruntime) is timed on its own.
Prints samples/s in the family's unit with its 95% CI and CV, and latency per batch p50/p90/p99/max.
--precision int8 quantises with PyTorch's PT2E flow (x86 inductor quantizer, CPU).
--find-max-batch finds the largest batch that fits (device memory, or a --max-memory cap such as
16G or 70%). --scenario runs an MLPerf LoadGen scenario over the model and reports MLPerf's figure
(single-/multi-stream: LoadGen's early-stopping 90th/99th percentile latency; server: completed
samples/s; offline: samples/s) with the raw one beside it; a server run far above what the model
sustains stops at LoadGen's max query count, INVALID. llm models with --prompt-len/--output-len
measure prefill and decode with a KV cache instead of the forward sweep; --decode picks how a token
is decoded: eager (DynamicCache, one Python forward per token), compiled (= --compile: a static KV
cache and the one-token step under torch.compile: Inductor's fused kernels, as CUDA graphs on a GPU) or
graph-eager (static cache, the eager step's unfused kernels captured as one CUDA graph; CUDA only).
Compile/capture time is recorded apart from the figures. Each decode figure comes with the bytes a
step reads (weights + KV cache) per second and its fraction of the device's copy bandwidth (measured
first) and of its datasheet memory bandwidth; a model whose weights, KV cache and activations exceed
the device's free memory is refused before it is built."""

EPILOG = """Examples:\n\n
  dlscale infer resnet50 --batch-sizes 1,8,32\n\n
  dlscale infer resnet18 --image-size 64 --precision int8 --format json\n\n
  dlscale infer resnet50 --runtime onnxruntime --batch-sizes 1,16\n\n
  dlscale infer resnet50 --find-max-batch --max-memory 16G\n\n
  dlscale infer tinycnn --scenario server --find-peak --latency-bound 0.01\n\n
  dlscale infer llama_tiny --prompt-len 128 --output-len 32 --batch-sizes 1,4\n\n
  dlscale infer llama_small --prompt-len 128 --output-len 64 --batch-sizes 1 --decode compiled"""


def infer(
    model: Annotated[str, typer.Argument(help="Model name; `dlscale models` lists them.", show_default=False)],
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", "-b", help="Comma-separated batch sizes to measure.")] = "1,2,4,8,16,32",
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Input size in pixels (default: the model's native).", show_default=False)] = None,
    seq_len: sopt.SeqLenOpt = None,
    model_config: sopt.ModelConfigOpt = None,
    max_table_rows: sopt.MaxRowsOpt = None,
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32 (TF32 off) | tf32 (TF32 matmuls and convolutions; CUDA) | bf16 | fp16 (the model cast once; detection: autocast) | int8 (PT2E, CPU).")] = "fp32",
    runtime: Annotated[str, typer.Option("--runtime", help="torch | onnxruntime (ONNX export, CPU or CUDA provider).")] = "torch",
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the model (compiles during warm-up); llm decode: --decode compiled.")] = False,
    channels_last: Annotated[Optional[bool], typer.Option("--channels-last/--no-channels-last", help="Image memory format (default: channels_last on CPU and for reduced precision).", show_default=False)] = None,
    cudnn_benchmark: sopt.CudnnBenchmarkOpt = True,
    warmup: Annotated[int, typer.Option("--warmup", help="Uncounted forwards before the timed ones, at each batch size.")] = 3,
    iters: Annotated[int, typer.Option("--iters", "-n", help="Timed forwards at each batch size.")] = 20,
    min_duration: MinDurationOpt = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights and synthetic samples.")] = 0,
    find_max_batch: Annotated[bool, typer.Option("--find-max-batch", help="Find the largest batch that fits (doubling, then bisection).")] = False,
    max_memory: Annotated[Optional[str], typer.Option("--max-memory", help="Memory cap for --find-max-batch, e.g. 16G, 12000M, 8000000000 (bytes) or 70% (CPU: peak RSS, a share of RAM, default 80% of available; GPUs: peak allocated, a share of the GPU's memory).", show_default=False)] = None,
    scenario: Annotated[Optional[str], typer.Option("--scenario", help="MLPerf LoadGen scenario: single-stream | multi-stream | server | offline.", show_default=False)] = None,
    find_peak: Annotated[bool, typer.Option("--find-peak", help="Server: search the highest QPS whose p99 latency meets --latency-bound.")] = False,
    latency_bound: Annotated[Optional[float], typer.Option("--latency-bound", help="Server: p99 latency bound in seconds (default: LoadGen's 0.1; with --mlperf-durations mlperf.conf's for the model).", show_default=False)] = None,
    target_qps: Annotated[Optional[float], typer.Option("--target-qps", help="Server/offline: target queries per second.", show_default=False)] = None,
    mlperf_durations: Annotated[bool, typer.Option("--mlperf-durations", help="LoadGen's mlperf.conf settings for the model: official minimum durations and query counts (default: short runs), and for server its latency bound (e.g. 15 ms for resnet50, 10 ms for models mlperf.conf does not name) unless --latency-bound is given.")] = False,
    duration: Annotated[Optional[float], typer.Option("--duration", help="Seconds of each LoadGen run (default: short).", show_default=False)] = None,
    batch_timeout: Annotated[Optional[float], typer.Option("--batch-timeout", help="Server: seconds the oldest waiting query waits for its batch to fill (default: 1/10 of the latency bound).", show_default=False)] = None,
    scenario_runs: Annotated[int, typer.Option("--scenario-runs", help="LoadGen runs of the scenario; the record keeps the median one and every run's figure.")] = 1,
    samples_on: Annotated[Optional[str], typer.Option("--samples-on", help="Where the samples of the sweep and of LoadGen are held: device (default) | host (pinned memory, copied in per batch).", show_default=False)] = None,
    prompt_len: Annotated[Optional[int], typer.Option("--prompt-len", help="llm: prompt tokens (prefill) per sequence.", show_default=False)] = None,
    output_len: Annotated[Optional[int], typer.Option("--output-len", help="llm: generated tokens (decode, KV cache) per sequence.", show_default=False)] = None,
    decode: Annotated[Optional[str], typer.Option("--decode", help="llm: eager | compiled (static KV cache + torch.compile; CUDA graphs on a GPU) | graph-eager (static KV cache, the eager step's kernels in one CUDA graph; CUDA only). Default eager, compiled with --compile.", show_default=False)] = None,
    tag: TagOpt = None,
    db: DbOpt = None,
    price_per_hour: copt.PriceOpt = None,
    systems_file: copt.SystemsFileOpt = None,
    system: copt.SystemOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale import api
    from dlscale.cli.train import failed_as_json
    from dlscale.infer.config import InferConfig

    cfg = InferConfig(
        model=model, batch_sizes=batch_sizes, image_size=image_size, seq_len=seq_len, model_config=model_config,
        max_table_rows=max_table_rows, precision=precision, runtime=runtime, compile=compile,
        channels_last=channels_last, cudnn_benchmark=cudnn_benchmark, warmup=warmup, iters=iters, device=device,
        seed=seed, tag=tag, find_max_batch=find_max_batch, max_memory=max_memory, scenario=scenario, find_peak=find_peak,
        latency_bound=latency_bound, target_qps=target_qps, mlperf_durations=mlperf_durations, duration=duration,
        batch_timeout=batch_timeout, scenario_runs=scenario_runs, samples_on=samples_on,
        prompt_len=prompt_len, output_len=output_len, decode=decode,
    )
    price = copt.price(price_per_hour, systems_file, system)
    with failed_as_json(fmt, db):
        rec = api.infer(config=cfg, db=db, price=price)
    report(rec, fmt)


def report(rec, fmt: Format) -> None:
    """Warnings on stderr; the record as JSON, or the batch table and the extra figures, on stdout."""
    def tables(r):
        extra = extra_table(r)
        return (batch_table(r), extra) if extra.row_count else (batch_table(r),)

    emit(rec, fmt, tables)


def batch_table(rec):
    """Batch size vs throughput (95% CI, CV) and latency per batch p50/p90/p99/max."""
    from rich.table import Table

    from dlscale.format import fmt_ci, fmt_num, fmt_pct, fmt_seconds

    m, c = rec.metrics, rec.config
    unit = c.get("sample_unit", "samples")
    how = f", decode {c['decode']}" if c.get("decode") else ", compiled" if c.get("compile") else ""
    t = Table(title=f"dlscale infer {rec.workload}  [{rec.status}]  {c.get('precision')}, {c.get('runtime_version')}"
                    f"{how}, {c.get('device')} ({c.get('device_name')})  run {rec.run_id}", title_justify="left")
    for col in ("batch", f"{unit}/s", "95% CI", "CV", "p50", "p90", "p99", "max"):
        t.add_column(col, justify="right")
    best = m.get("best_batch_size")
    for i, b in enumerate(m.get("batch_sizes") or []):
        ci = (m.get("throughput_ci95_by_batch") or [None] * (i + 1))[i]
        thr = fmt_num(m["throughput_by_batch"][i])
        lat = [fmt_seconds((m.get(f"latency_{k}_by_batch") or [None] * (i + 1))[i]) for k in ("p50", "p90", "p99", "max")]
        t.add_row(f"[bold]{b}[/bold]" if b == best else str(b), f"[bold]{thr}[/bold]" if b == best else thr,
                  fmt_ci(ci[0], ci[1]) if ci else "-",
                  fmt_pct((m.get("cv_by_batch") or [None] * (i + 1))[i]), *lat)
    if rec.status != "ok":
        t.caption = f"error: {rec.error}"
    return t


_EXTRA = ("max_batch_size", "max_batch_peak_memory", "max_memory_cap", "scenario", "scenario_metric_name",
          "scenario_metric", "scenario_metric_runs", "mlperf_result_key", "latency_bound_s", "latency_bound_source",
          "batch_timeout_s", "probed_samples_per_s", "max_query_count", "samples_on", "valid", "prefill_tokens_per_s",
          "decode_tokens_per_s", "time_to_first_token_s", "time_per_output_token_s", "decode_memory_gbps",
          "decode_fraction_of_copy", "decode_fraction_of_datasheet")
_LLM = ("prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_s", "time_per_output_token_s",
        "decode_memory_gbps", "decode_fraction_of_copy", "decode_fraction_of_datasheet")


def extra_table(rec):
    """The largest batch, the LoadGen scenario's figures (MLPerf's headline, then the raw figure beside it,
    named as such) and the LLM headline, where measured."""
    from rich.table import Table

    from dlscale.cli.render import energy_cost_rows
    from dlscale.format import fmt_seconds, format_metric

    m, mode = rec.metrics, rec.config.get("decode")
    t = Table(show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    for k in _EXTRA:
        if m.get(k) is not None:
            label = k.replace("_", " ") + (f" ({mode})" if mode and k in _LLM else "")
            t.add_row(label, format_metric(k, m[k], rec.units.get(k)))
        elif k == "scenario_metric" and m.get("scenario"):
            t.add_row("scenario metric", "none (the warnings say why)")
        raw = m.get("scenario_raw_name")
        if k == "scenario_metric" and raw and m.get(raw) is not None:
            t.add_row(f"{raw.replace('_', ' ')} (raw, not MLPerf's figure)", format_metric(raw, m[raw], rec.units.get(raw)))
    if m.get("compile_s_by_batch"):
        what = "capture" if mode == "graph-eager" else "compile"
        t.add_row(f"{what} time by batch (not in any figure)",
                  ", ".join(f"{b}: {fmt_seconds(s)}" for b, s in zip(m["batch_sizes"], m["compile_s_by_batch"])))
    sheet = (rec.raw.get("memory_limit") or {}).get("datasheet_source")
    if "decode_fraction_of_datasheet" in m and m["decode_fraction_of_datasheet"] is None and sheet:
        t.add_row("decode fraction of datasheet", f"none: {sheet}")
    for what, words in energy_cost_rows(rec):
        t.add_row(what, words)
    return t
