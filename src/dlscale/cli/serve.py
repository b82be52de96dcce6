"""``dlscale serve-bench URL --model NAME``: an OpenAI-compatible LLM server under load (TTFT, TPOT, goodput at an SLO)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dlscale.cli import costopts as copt
from dlscale.cli.common import DbOpt, Format, FormatOpt, TagOpt, emit

HELP = """Measure an OpenAI-compatible LLM server under load and record it (kind `serving`).

Sends /v1/completions (or /v1/chat/completions with --api chat), streamed unless --no-stream,
from one asynchronous client: Poisson arrivals at each of --rates (requests/s; --burstiness sets
the gamma shape, < 1 burstier), with one --concurrencies value the cap in flight at every rate
(vLLM's --max-concurrency: an arrival past it waits for a slot), or a fixed number in flight at each
of --concurrencies (at most --requests). Every load point is bounded by --requests and --duration;
warm-up requests go first and are not counted (--warmup N of them, for --warmup-duration seconds,
or --warmup-until-stable); every request has a --timeout. Prompts are made from the model's tokenizer (--tokenizer, or the
model folder when --model is a local path) at --prompt-len tokens (N, uniform:LO:HI, normal:MEAN:STD,
lognormal:MEDIAN:SIGMA), with --shared-prefix tokens shared by --prefixes groups, or read from a
ShareGPT-format --dataset. Output length is fixed at --output-len (ignore_eos, min_tokens) where the
server accepts it. Prints per load point TTFT, TPOT, ITL and latency (median, p99), requests/s,
output tokens/s, tokens/s per user, goodput and errors by kind; the generator's lag behind its
schedule; the client's own overhead measured against an instant local server. A percentile of too
few requests is marked (a p99 needs 368), and a point that ran at two speeds (its first part slower
than the rest: a server not yet warm) is said. With --slo
(a preset such as mlperf-llama2-70b: p99 TTFT 2 s, TPOT 200 ms) each point is judged, and
--find-max searches the highest rate (or concurrency) whose p99 TTFT and TPOT meet it, saying
which SLO binds. The API key is read from the variable named by --api-key-env, never stored."""

EPILOG = """Examples:\n\n
  transformers serve ./tiny-llama --continuous-batching --cb-num-blocks 64 --cb-block-size 32 --cb-max-batch-tokens 256 --host 127.0.0.1 --port 8000 &\n\n
  dlscale serve-bench http://127.0.0.1:8000 --model ./tiny-llama --concurrencies 1,2,4 --requests 20\n\n
  dlscale serve-bench http://127.0.0.1:8000 --model ./tiny-llama --rates 1,16 --find-max --slo mlperf-llama2-70b\n\n
  dlscale serve-bench http://127.0.0.1:8000 --model ./tiny-llama --rates 2 --loadgen --slo mlperf-llama2-70b\n\n
  dlscale serve-bench http://127.0.0.1:8000 --model ./tiny-llama --rates 4,8 --concurrencies 16 --warmup-until-stable\n\n
  dlscale serve-bench https://api.example.com --model llama --api chat --rates 2 --dataset sharegpt.json"""


def serve_bench(
    url: Annotated[str, typer.Argument(help="The server's base URL, e.g. http://127.0.0.1:8000 (with or without /v1).", show_default=False)],
    model: Annotated[str, typer.Option("--model", "-m", help="The model name the server serves (GET /v1/models).", show_default=False)],
    api: Annotated[str, typer.Option("--api", help="completions (/v1/completions) | chat (/v1/chat/completions).")] = "completions",
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Stream the answers (server-sent events); TTFT, TPOT and ITL need it.")] = True,
    rates: Annotated[Optional[str], typer.Option("--rates", help="Arrival rates, requests/s, comma-separated (inf: all at once); with --find-max the lowest and highest to search.", show_default=False)] = None,
    concurrencies: Annotated[Optional[str], typer.Option("--concurrencies", help="Requests in flight, comma-separated (default 1; at most --requests); with --find-max the lowest and highest to search; with --rates one value: the cap in flight at every rate.", show_default=False)] = None,
    burstiness: Annotated[float, typer.Option("--burstiness", help="Gamma shape of the inter-arrival times: 1 Poisson, < 1 burstier.")] = 1.0,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests per load point (a bound).")] = 100,
    duration: Annotated[float, typer.Option("--duration", help="Seconds per load point (a bound: nothing sent after it).")] = 60.0,
    warmup: Annotated[int, typer.Option("--warmup", help="Requests sent first and not counted (at least these).")] = 2,
    warmup_duration: Annotated[float, typer.Option("--warmup-duration", help="Seconds of warm-up requests (at least this long).")] = 0.0,
    warmup_until_stable: Annotated[bool, typer.Option("--warmup-until-stable", help="Warm up in rounds of 8 requests until a round's median TPOT is within 1.2x of the round before (at most --duration).")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds one request may take, connection to last token.")] = 120.0,
    prompt_len: Annotated[str, typer.Option("--prompt-len", help="Prompt tokens: N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA.")] = "128",
    output_len: Annotated[str, typer.Option("--output-len", help="Output tokens (max_tokens; fixed where the server accepts ignore_eos/min_tokens), same forms.")] = "32",
    shared_prefix: Annotated[int, typer.Option("--shared-prefix", help="Tokens of a prefix shared by every prompt of a group.")] = 0,
    prefixes: Annotated[int, typer.Option("--prefixes", help="How many shared-prefix groups.")] = 1,
    dataset: Annotated[Optional[str], typer.Option("--dataset", help="A ShareGPT-format JSON file: prompts and output lengths from it.", show_default=False)] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="A local tokenizer.json (or a folder with one); default: --model when it is such a folder.", show_default=False)] = None,
    fixed_output: Annotated[bool, typer.Option("--fixed-output/--free-output", help="Ask for exactly --output-len tokens (ignore_eos, min_tokens) where the server accepts it.")] = True,
    slo: Annotated[Optional[str], typer.Option("--slo", help="p99 bounds: a preset (mlperf-llama2-70b, mlperf-llama2-70b-interactive, mlperf-llama3.1-8b, ...) or ttft=S,tpot=S.", show_default=False)] = None,
    slo_ttft: Annotated[Optional[float], typer.Option("--slo-ttft", help="p99 TTFT bound, seconds (overrides the preset's).", show_default=False)] = None,
    slo_tpot: Annotated[Optional[float], typer.Option("--slo-tpot", help="p99 TPOT bound, seconds (overrides the preset's).", show_default=False)] = None,
    find_max: Annotated[bool, typer.Option("--find-max", help="Search the highest load whose p99 TTFT and TPOT meet the SLO.")] = False,
    max_points: Annotated[int, typer.Option("--max-points", help="Load points the search may measure.")] = 8,
    loadgen: Annotated[bool, typer.Option("--loadgen", help="Let MLPerf LoadGen's server scenario drive the client at the one --rates value, with token latencies judged against --slo: MLPerf's TTFT/TPOT early-stopping verdicts and completed tokens/s.")] = False,
    calibrate: Annotated[bool, typer.Option("--calibrate/--no-calibrate", help="Measure the client's own overhead against an instant local server first.")] = True,
    api_key_env: Annotated[Optional[str], typer.Option("--api-key-env", help="Environment variable holding the API key (sent as a Bearer token; never stored). Default: OPENAI_API_KEY where it is set; a variable named here must be set.", show_default=False)] = None,
    server_devices: Annotated[int, typer.Option("--server-devices", help="Devices (GPUs) the server occupies: the cost is --price-per-hour times these.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prompts and arrivals.")] = 0,
    tag: TagOpt = None,
    db: DbOpt = None,
    price_per_hour: copt.PriceOpt = None,
    systems_file: copt.SystemsFileOpt = None,
    system: copt.SystemOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale import api as dl
    from dlscale.cli.train import failed_as_json
    from dlscale.serve.config import ServeConfig

    cfg = ServeConfig(url=url, model=model, api=api, stream=stream, rates=rates, concurrencies=concurrencies,
                      burstiness=burstiness, requests=requests, duration=duration, warmup=warmup,
                      warmup_duration=warmup_duration, warmup_until_stable=warmup_until_stable, timeout=timeout,
                      prompt_len=prompt_len, output_len=output_len, shared_prefix=shared_prefix, prefixes=prefixes,
                      dataset=dataset, tokenizer=tokenizer, fixed_output=fixed_output, slo=slo, slo_ttft=slo_ttft,
                      slo_tpot=slo_tpot, find_max=find_max, max_points=max_points, calibrate=calibrate, loadgen=loadgen,
                      api_key_env=api_key_env, server_devices=server_devices, seed=seed, tag=tag)
    price = copt.price(price_per_hour, systems_file, system)
    with failed_as_json(fmt, db):
        rec = dl.serve_bench(config=cfg, db=db, price=price)
    report(rec, fmt)


def report(rec, fmt: Format) -> None:
    emit(rec, fmt, lambda r: (points_table(r), answer_table(r)))


def points_table(rec):
    """One row per load point, in the order measured."""
    from rich.table import Table

    from dlscale.format import fmt_num, fmt_seconds

    m, c = rec.metrics, rec.config
    t = Table(title=f"dlscale serve-bench {rec.workload} at {c.get('url')}  [{rec.status}]  run {rec.run_id}",
              title_justify="left")
    load = "concurrency" if c.get("mode") != "rate" else f"rate (cap {c['max_concurrency']})" if c.get(
        "max_concurrency") else "rate"
    cols = (load, "done/sent", "req/s", "out tok/s", "tok/s/user", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
            "ITL p50", "e2e p50", "goodput", "SLO")
    for col in cols:
        t.add_column(col, justify="right")
    at = lambda k, i: (m.get(f"{k}_by_point") or [])[i] if i < len(m.get(f"{k}_by_point") or []) else None  # noqa: E731
    met = m.get("slo_met_by_point") or []
    marked = False
    for i, load in enumerate(m.get("loads_by_point") or []):
        done, failed = at("completed", i) or 0, at("failed", i) or 0
        verdict = "" if i >= len(met) or met[i] is None else ("met" if met[i] else "[red]missed[/red]")
        few = at("too_few_for", i) or []  # a percentile of too few requests: shown, marked
        cell = lambda k: fmt_seconds(at(k, i)) + ("*" if k.split("_")[1] in few else "")  # noqa: E731 - ttft_p99_s: p99
        marked = marked or bool(few)
        t.add_row(fmt_num(load) + (" (2 speeds)" if at("two_speed", i) else ""), f"{done}/{done + failed}",
                  fmt_num(at("request_throughput", i)), fmt_num(at("output_throughput", i)),
                  fmt_num(at("tokens_per_s_per_user", i)),
                  *(cell(k) for k in ("ttft_median_s", "ttft_p99_s", "tpot_median_s", "tpot_p99_s", "itl_median_s",
                                      "e2e_median_s")), fmt_num(at("goodput", i)), verdict)
    notes = (["* too few requests for this percentile (see the warning)"] if marked else []) + (
        [f"error: {rec.error}"] if rec.status != "ok" else [])
    if notes:
        t.caption = "; ".join(notes)
    return t


_ANSWER = ("mlperf_result", "mlperf_completed_tokens_per_s", "mlperf_ttft_p99_s", "mlperf_tpot_p99_s",
           "mlperf_ttft_early_stopping", "mlperf_tpot_early_stopping", "max_load_meeting_slo", "slo_binding", "slo_ttft_s", "slo_tpot_s", "load", "goodput", "goodput_fraction",
           "client_ttft_overhead_s", "client_ttft_overhead_loaded_s", "client_itl_overhead_s", "lag_p99_s", "lag_max_s",
           "energy_per_unit_j", "kwh_per_million_output_tokens", "cost_per_million_units", "price_per_hour")


def answer_table(rec):
    """The SLO answer and what stands beside the headline point: the client's overhead, the lag, energy, cost, errors."""
    from rich.table import Table

    from dlscale.format import format_metric

    m = rec.metrics
    t = Table(show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    reason = (rec.raw.get("answer") or {}).get("reason")
    for k in _ANSWER:
        if m.get(k) is not None:
            name = "cost per million output tokens" if k == "cost_per_million_units" else k.replace("_", " ")
            t.add_row(name, format_metric(k, m[k], rec.units.get(k)))
    if reason:
        t.add_row("search", reason)
    errors = {k.removeprefix("errors_"): v for k, v in m.items() if k.startswith("errors_")}
    if errors:
        t.add_row("errors (headline point)", ", ".join(f"{k}: {v}" for k, v in errors.items()))
    if rec.config.get("token_count_source"):
        t.add_row("token counts from", str(rec.config["token_count_source"]))
    return t
