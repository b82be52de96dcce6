"""The batch-size sweep of ``dlscale infer``, the largest-batch search, and the run's figures.

At each batch size one batch of synthetic samples is gathered on the device once from a sample
store held as LoadGen's is (``infer.feed``; with ``--samples-on host`` on a GPU every forward's
batch is copied in from pinned host memory instead, overlapped with the previous forward), as the
training short test keeps its batch; ``warmup`` uncounted forwards run, then ``iters`` forwards
are timed one by one by the harness's step clock (``infer.probe.time_batch`` over
``harness.timing.timed_loop``: CUDA events on a GPU, ``perf_counter`` on the CPU; onnxruntime
returns host arrays, so its forwards are timed on the host clock). Per batch size: latency per
batch p50/p90/p99/max, throughput in the family's
unit per second with its 95% CI and the step-time CV, all from ``harness.metrics.summarize_steps``
(formulas in docs/METRICS.md). The headline ``throughput`` is the best batch size's.

``find_max_batch`` doubles the batch until a forward runs out of memory or its peak memory passes
the cap (CPU: peak process RSS, ``--max-memory`` or 80% of the memory available at the start;
CUDA: the device's out-of-memory error, or peak allocated bytes past ``--max-memory``; a share such
as ``70%`` is of the machine's memory on the CPU and of the GPU's on CUDA), then
bisects between the last batch that fit and the first that did not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlscale.harness.runner import Outcome
from dlscale.harness.window import Window
from dlscale.infer.probe import time_batch
from dlscale.log import info

BATCH_LIMIT = 1 << 16  # the search stops here even if memory is left (a tiny model at 32 px fits ~10^5)

LIST_UNITS = {"latency_p50_by_batch": "s", "latency_p90_by_batch": "s", "latency_p99_by_batch": "s",
              "latency_max_by_batch": "s", "latency_mean_by_batch": "s", "cv_by_batch": "fraction",
              "batch_sizes": "samples/batch", "units_by_batch": "{unit}/batch",
              "energy_j": "J", "energy_per_unit_j": "J/{unit}", "units_per_joule": "{unit}/J", "avg_power_w": "W",
              "energy_per_unit_j_by_batch": "J/{unit}", "units_per_joule_by_batch": "{unit}/J",
              "avg_power_w_by_batch": "W",
              "throughput_by_batch": "{unit}/s", "throughput_ci95_by_batch": "{unit}/s",
              "throughput": "{unit}/s", "best_batch_size": "samples/batch", "max_batch_size": "samples/batch",
              "max_batch_peak_memory": "bytes", "max_memory_cap": "bytes"}


ENERGY_BY_BATCH = ("energy_per_unit_j", "units_per_joule", "avg_power_w")


def batch_figures(units: int, times: list[float]) -> tuple[dict[str, Any], list[str]]:
    """One batch size's figures from its timed forwards (seconds each): throughput, CI, CV, latency percentiles."""
    from dlscale.harness.metrics import summarize_steps

    m, warnings = summarize_steps(units, [times])
    warnings = [w.replace("--warmup-steps", "--warmup").replace("--steps", "--iters") for w in warnings]
    return {"throughput": m["throughput"], "throughput_ci95": m["throughput_ci95"], "cv": m["cv"],
            "latency_p50": m["step_time_p50"], "latency_p90": m["step_time_p90"], "latency_p99": m["step_time_p99"],
            "latency_max": m["step_time_max"], "latency_mean": m["step_time_mean"]}, warnings


def batch_energy(session: Any, batch_size: int, iters: int, meter: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """One batch size's energy figures (harness.energy_meter.figures) over its ``iters`` timed forwards."""
    from dlscale.harness import energy_meter as energy

    metrics, _, raw = energy.figures(meter.reading(), session.units(batch_size) * iters, session.sample_unit)
    return metrics, raw


def sweep(session: Any, cfg: Any, on_batch: Callable[[int, dict[str, Any]], None] | None = None
          ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(metrics, raw, warnings) of the batch-size sweep; a batch that runs out of memory ends it."""
    from dlscale.harness.energy_meter import EnergyMeter
    from dlscale.harness.runner import describe_failure

    rows: list[tuple[int, dict[str, Any]]] = []
    raw: dict[str, Any] = {"batch_times": {}, "energy_by_batch": {}}
    warnings: list[str] = []
    window = Window(cfg.min_duration_s)  # --min-duration: each batch size's forwards from a probe
    for b in cfg.batch_sizes:
        try:
            with EnergyMeter(session.device if session.runtime == "torch" else None) as meter:
                times = time_batch(session, b, cfg.warmup, cfg.iters, meter, window)
        except Exception as e:  # noqa: BLE001 - only out-of-memory ends the sweep early
            if not is_oom(e) or not rows:
                raise
            warnings.append(f"batch {b} ran out of memory ({describe_failure(e)[:120]}); the sweep stops at "
                            f"batch {rows[-1][0]}: use --find-max-batch to find the largest that fits")
            break
        fig, warns = batch_figures(session.units(b), times)
        e_metrics, e_raw = batch_energy(session, b, len(times), meter)
        fig.update(energy=e_metrics)
        warnings += [f"batch {b}: {w}" for w in warns]
        raw["batch_times"][str(b)] = times
        raw["energy_by_batch"][str(b)] = e_raw
        rows.append((b, fig))
        if on_batch:
            on_batch(b, fig)
    metrics = by_batch(rows, session)
    if window.sizings:
        raw["window_by_batch"] = {str(b): w for (b, _), w in zip(rows, window.sizings)}
    best = str(metrics["best_batch_size"])
    raw.update(raw["energy_by_batch"][best])  # the headline energy is the best batch size's, as its throughput
    return metrics, raw, warnings


def by_batch(rows: list[tuple[int, dict[str, Any]]], session: Any) -> dict[str, Any]:
    """The per-batch lists aligned with ``batch_sizes``, and the headline at the best batch size."""
    col = lambda k: [fig[k] for _, fig in rows]  # noqa: E731
    best = max(range(len(rows)), key=lambda i: rows[i][1]["throughput"])
    return {"batch_sizes": [b for b, _ in rows], "units_by_batch": [session.units(b) for b, _ in rows],
            "throughput_by_batch": col("throughput"), "throughput_ci95_by_batch": col("throughput_ci95"),
            "cv_by_batch": col("cv"), "latency_p50_by_batch": col("latency_p50"),
            "latency_p90_by_batch": col("latency_p90"), "latency_p99_by_batch": col("latency_p99"),
            "latency_max_by_batch": col("latency_max"), "latency_mean_by_batch": col("latency_mean"),
            **{f"{k}_by_batch": [fig.get("energy", {}).get(k) for _, fig in rows] for k in ENERGY_BY_BATCH
               if any(fig.get("energy", {}).get(k) is not None for _, fig in rows)},
            **rows[best][1].get("energy", {}),
            "throughput": rows[best][1]["throughput"], "best_batch_size": rows[best][0]}


# -- the largest batch that fits -------------------------------------------------------------------
def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of any device or allocator."""
    msg = str(exc).lower()
    return (type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError)
            or "out of memory" in msg or "can't allocate memory" in msg or "failed to allocate" in msg)


def find_max_batch(fits: Callable[[int], bool], start: int = 1, limit: int = BATCH_LIMIT) -> tuple[int, list[int]]:
    """(largest batch for which ``fits`` holds, batches tried): double from ``start``, then bisect.

    ``fits(b)`` is True when a forward at batch ``b`` ran within memory. 0 when even ``start`` does
    not fit; ``limit`` when the doubling reaches it without a failure.
    """
    tried: list[int] = []

    def ok(b: int) -> bool:
        tried.append(b)
        return fits(b)

    if not ok(start):
        return 0, tried
    lo, hi = start, None
    while hi is None:
        b = min(lo * 2, limit)
        if b == lo:
            return lo, tried
        if ok(b):
            lo = b
        else:
            hi = b
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried


def peak_rss_reset() -> None:
    """Start a new peak-RSS window (Linux: writing 5 to /proc/self/clear_refs resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss() -> int:
    """The process's peak resident set (bytes) since the last reset (VmHWM), else its current RSS."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def default_memory_cap() -> int:
    """CPU: the RSS now plus 80% of MemAvailable (``memsize.available_memory``; leaving the OOM killer out
    of the search)."""
    from dlscale.memsize import available_memory

    avail = available_memory() or 0
    peak_rss_reset()
    return peak_rss() + int(0.8 * avail)


def memory_probe(session: Any, cap: int | None, log: list[dict[str, Any]],
                 measure: Callable[[], int] | None = None, reset: Callable[[], None] | None = None
                 ) -> Callable[[int], bool]:
    """``fits(b)`` for find_max_batch: one forward at batch b; False on out-of-memory or a peak past ``cap``."""
    import gc

    cuda = session.runtime == "torch" and getattr(session.device, "type", "cpu") == "cuda"
    collect = measure is None or reset is None  # a real probe frees the last batch's garbage first
    if measure is None or reset is None:
        if cuda:
            import torch

            measure, reset = (lambda: torch.cuda.max_memory_allocated(session.device),
                              lambda: torch.cuda.reset_peak_memory_stats(session.device))
        else:
            measure, reset = peak_rss, peak_rss_reset

    def fits(b: int) -> bool:
        if collect:
            gc.collect()
        reset()
        try:
            session.run([session.sample(i % 64) for i in range(b)])
        except Exception as e:  # noqa: BLE001 - out of memory is the answer; anything else is a failure
            if not is_oom(e):
                raise
            log.append({"batch": b, "fits": False, "reason": "out of memory"})
            return False
        finally:
            if cuda:
                import torch

                torch.cuda.empty_cache()
        peak = measure()
        ok = cap is None or peak <= cap
        log.append({"batch": b, "fits": ok, "peak_bytes": peak, **({} if ok else {"reason": "past the memory cap"})})
        return ok

    return fits


def search_max_batch(session: Any, cfg: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(metrics, raw, warnings) of the largest-batch search for this session."""
    cuda = session.runtime == "torch" and getattr(session.device, "type", "cpu") == "cuda"
    cap = memory_cap(cfg.max_memory, session.device if cuda else None)
    if cap is None and not cuda:
        cap = default_memory_cap()
    log: list[dict[str, Any]] = []
    info(f"searching the largest batch that fits (cap: {_bytes(cap) if cap else 'the device memory'})")
    best, _ = find_max_batch(memory_probe(session, cap, log))
    warnings = []
    if best == 0:
        warnings.append("not even batch 1 fits within the memory cap; raise --max-memory")
    elif best >= BATCH_LIMIT:
        warnings.append(f"the search stopped at batch {BATCH_LIMIT} with memory left; the largest batch is larger")
    peak = next((p.get("peak_bytes") for p in reversed(log) if p["batch"] == best and p["fits"]), None)
    return ({"max_batch_size": best, "max_batch_peak_memory": peak, "max_memory_cap": cap},
            {"max_batch_probes": log}, warnings)


def memory_cap(spec: int | str | None, cuda_device: Any = None) -> int | None:
    """``--max-memory`` in bytes: a share is of the GPU's memory on CUDA, else of the machine's."""
    from dlscale.memsize import parse_memory, total_memory

    if not isinstance(spec, str):
        return spec
    if cuda_device is None:
        return parse_memory(spec, total_memory())
    import torch

    return parse_memory(spec, torch.cuda.get_device_properties(cuda_device).total_memory)


def _bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


# -- the whole run ---------------------------------------------------------------------------------
def run_inference(cfg: Any, device: Any, on_batch: Callable[[int, dict[str, Any]], None] | None = None) -> Outcome:
    """The run under its precision's TF32 and cuDNN flags (``harness.device.run_flags``: set for the run,
    recorded as they were at its end in the config's ``backend_flags``, restored after it)."""
    from dlscale.harness.device import backend_flags, run_flags

    with run_flags(cfg.precision, device, cfg.cudnn_benchmark):
        out = _run_inference(cfg, device, on_batch)
        out.config["backend_flags"] = backend_flags()
    return out


def _run_inference(cfg: Any, device: Any, on_batch: Callable[[int, dict[str, Any]], None] | None) -> Outcome:
    """Open the session, search the largest batch if asked, sweep the batch sizes, and add the
    LoadGen scenario and the LLM prefill/decode figures when asked for."""
    from dlscale.infer.session import open_session

    if cfg.prompt_len is not None:  # llm prefill + decode: its figures are the record's (no plain forward sweep)
        from dlscale.harness.device import device_name

        out = Outcome(config={"runtime_version": _torch_version(), "sample_unit": "tokens", "family": "llm",
                              "scenario": None, "device_name": device_name(device)})
        _merge(out, *run_llm(cfg, device))
        return out
    session = open_session(cfg, device)
    desc = session.describe()
    out = Outcome(config={"runtime_version": desc.get("runtime_version"), "device_name": desc.get("device_name"),
                          "sample_unit": session.sample_unit, "family": desc["family"], "scenario": cfg.scenario,
                          "session": desc})
    if cfg.find_max_batch:
        _merge(out, *search_max_batch(session, cfg))
    _merge(out, *sweep(session, cfg, on_batch))
    if cfg.scenario is not None:
        _merge(out, *run_scenario(session, cfg, out.metrics.get("batch_sizes") or list(cfg.batch_sizes)))
    unit = session.sample_unit
    for k, u in LIST_UNITS.items():
        if k in out.metrics:
            out.units.setdefault(k, u.format(unit=unit))
    return out


def _torch_version() -> str:
    import torch

    return f"torch {torch.__version__}"


def _merge(out: Outcome, metrics: dict[str, Any], raw: dict[str, Any], warnings: list[str],
           units: dict[str, str] | None = None) -> None:
    out.metrics.update(metrics)
    out.raw.update(raw)
    out.warnings.extend(warnings)
    out.units.update(units or {})


def run_scenario(session: Any, cfg: Any, ran: list[int]) -> tuple[dict[str, Any], dict[str, Any], list[str],
                                                                   dict[str, str]]:
    """One MLPerf LoadGen scenario over this session (dlscale.infer.loadgen), in batches of up to the
    largest batch size the sweep ran (``ran``): one that ran out of memory there is not retried."""
    from dlscale.infer.loadgen import run_scenario as loadgen_run
    from dlscale.infer.loadgen_settings import ScenarioSettings

    settings = ScenarioSettings(scenario=cfg.scenario, max_batch=max(ran),
                                latency_bound_s=cfg.latency_bound, target_qps=cfg.target_qps,
                                find_peak=cfg.find_peak, mlperf_durations=cfg.mlperf_durations,
                                duration_s=cfg.duration, batch_timeout_s=cfg.batch_timeout, runs=cfg.scenario_runs)
    warnings = []
    if max(ran) < max(cfg.batch_sizes):
        warnings.append(f"LoadGen {cfg.scenario}: batches of up to {max(ran)}, the largest batch size that ran "
                        f"(not {max(cfg.batch_sizes)})")
    info(f"LoadGen {cfg.scenario} scenario (batches of up to {settings.max_batch})")
    res = loadgen_run(session, settings)
    metrics = {**res.metrics, "valid": res.valid}
    metrics.setdefault("scenario", cfg.scenario)
    return metrics, {"loadgen_summary": res.summary, "loadgen_detail": res.detail}, warnings + list(res.warnings), \
        dict(res.units)


def run_llm(cfg: Any, device: Any) -> tuple[dict[str, Any], dict[str, Any], list[str], dict[str, str]]:
    """Prefill and decode with a KV cache at each batch size (dlscale.infer.llm)."""
    from dlscale.infer.llm import run_llm_inference

    info(f"LLM prefill/decode: prompt {cfg.prompt_len}, output {cfg.output_len} tokens, decode {cfg.decode}")
    metrics, units, raw, warnings = run_llm_inference(
        cfg.model, batch_sizes=list(cfg.batch_sizes), prompt_len=cfg.prompt_len, output_len=cfg.output_len,
        precision=cfg.precision, device=device, model_config=cfg.model_config, warmup=cfg.warmup,
        iters=cfg.iters, seed=cfg.seed, decode=cfg.decode or "eager", cudnn_benchmark=cfg.cudnn_benchmark)
    return metrics, raw, warnings, units
