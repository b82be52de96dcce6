"""``dlscale tune MODEL`` end to end: what to search on this device, the trials, the ``tune`` record.

``plan`` decides the starting configuration (what ``dlscale train MODEL`` runs by default, with
the shape options given), the candidates of each knob the device supports, and what is not
searched here, with why ("not searched: ..."). Each trial is a real short test run
as ``dlscale train`` in its own process, exactly as a sweep point (``sweep.driver.run_point``): its
peak memory (process peak RSS on CPU) is its own, its intra-op threads are set by
``--threads-per-rank``, an out-of-memory kill does not take the search down, and its record
carries the trial's key (``raw.sweep_point``), so ``--resume`` finds it. The search, the best
configuration's YAML and the ablation table go into one record of kind ``tune`` that lists its
trials' run ids. No torch at import time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.memsize import parse_memory, total_memory
from dlscale.record import RunRecord
from dlscale.system import usable_cpus
from dlscale.tune.check import Outcome, close
from dlscale.tune.search import KNOBS, Search, TrialRunner

SHAPE_KEYS = ("image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "data", "optimizer")
TRIAL_ONLY = ("steps", "warmup_steps", "breakdown_steps", "monitor_interval", "tag", "device")
BOOL_WORDS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}
ALWAYS_NOT_SEARCHED = (
    "DDP bucket size, gradient_as_bucket_view, static_graph: tune trials run one process (no --nproc-per-node "
    "yet) and DDP wraps the model only with several ranks; set them with `dlscale train --nproc-per-node N "
    "--ddp-bucket-mb MB --ddp-grad-as-bucket-view --ddp-static-graph` or in a sweep",
    "CPU affinity / NUMA binding per rank: needs an affinity field in Layout",
)
BOOL_KNOBS = ("channels_last", "compile", "pin_memory")
TEXT_KNOBS = ("precision", "compile_mode", "optimizer_impl")


def parse_fix(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``--fix knob=value`` (repeatable) as typed values; an unknown knob or bad value is a UsageError."""
    out: dict[str, Any] = {}
    for item in items:
        knob, sep, text = item.partition("=")
        knob = knob.strip().replace("-", "_")
        if not sep or knob not in KNOBS:
            raise UsageError(f"--fix {item!r}: give KNOB=VALUE with KNOB one of {', '.join(KNOBS)}")
        text = text.strip()
        if knob in BOOL_KNOBS:
            if text.lower() not in BOOL_WORDS:
                raise UsageError(f"--fix {item!r}: {knob} takes true or false")
            out[knob] = BOOL_WORDS[text.lower()]
        elif knob in TEXT_KNOBS:
            out[knob] = text
        elif text.isdigit() and int(text) > 0:
            out[knob] = int(text)
        else:
            raise UsageError(f"--fix {item!r}: {knob} takes a whole number > 0")
    return out


def device_knobs(device_type: str, images: bool, data: bool) -> tuple[dict[str, list[Any]], list[str]]:
    """The candidate values of each knob this device and model can take, and what is left out (with why).
    Compile modes: "default" is the compile knob's True; CUDA graphs (reduce-overhead) only on CUDA."""
    import torch

    cands: dict[str, list[Any]] = {"batch_size": [], "compile": [False, True], "optimizer_impl": ["foreach", "fused"]}
    cands["compile_mode"] = ["max-autotune"] + (["reduce-overhead"] if device_type == "cuda" else [])
    left = list(ALWAYS_NOT_SEARCHED)
    if device_type == "cuda":
        major, _ = torch.cuda.get_device_capability()
        cands["precision"] = ["fp32"] + (["tf32"] if major >= 8 else []) + \
            (["bf16"] if torch.cuda.is_bf16_supported() else []) + ["fp16"]
    else:
        from dlscale.system import cpu_info

        isa = cpu_info().get("isa") or {}
        bf16 = bool(isa.get("avx512_bf16") or isa.get("amx_bf16"))
        cands["precision"] = ["fp32", "bf16"] if bf16 else ["fp32"]
        if not bf16:
            left.append("precision bf16: this CPU has neither AVX512-BF16 nor AMX (bf16 would be emulated)")
        left.append("compile mode reduce-overhead: CUDA graphs need a CUDA device")
        n = usable_cpus()
        cands["threads_per_rank"] = sorted({n, max(1, n // 2), torch.get_num_threads()})
    if images:
        cands["channels_last"] = [True, False]
    else:
        left.append("memory format: only image models have one")
    if data:
        n = usable_cpus()
        cands["workers"] = sorted({0, max(1, n // 2), n})
        cands["prefetch_factor"] = [4]  # torch's default is 2 batches per worker
        if device_type == "cuda":
            cands["pin_memory"] = [False]  # on by default with CUDA
        else:
            left.append("pinned memory: only with a CUDA device (a CPU run copies no batch to a GPU)")
    else:
        left.append("data-loader workers, pinned memory, prefetch: only with --data (synthetic batches stay on the device)")
    return cands, left


def plan(model: str, options: dict[str, Any], fixed: dict[str, Any], device_type: str, trial: dict[str, Any]
         ) -> tuple[dict[str, Any], dict[str, list[Any]], list[str]]:
    """The starting trial options, each knob's candidates, and what is not searched."""
    import torch

    from dlscale import workloads
    from dlscale.harness.device import default_channels_last

    w = workloads.get(model)
    cands, left = device_knobs(device_type, w.images_in, options.get("data") is not None)
    if "precision" in fixed and fixed["precision"] not in cands["precision"]:
        raise UsageError(f"--fix precision={fixed['precision']}: this device runs {', '.join(cands['precision'])}")
    start: dict[str, Any] = {"model": model, "batch_size": options.get("batch_size") or 32,
                             **{k: options[k] for k in SHAPE_KEYS if options.get(k) is not None},
                             "precision": "fp32", "compile": False}
    if w.images_in:
        start["channels_last"] = default_channels_last(device_type, "fp32")
    if device_type == "cpu":
        start["threads_per_rank"] = torch.get_num_threads()
    for k in fixed:
        if k not in cands and k != "batch_size":
            raise UsageError(f"--fix {k}: not a knob of this model and device; searched: {', '.join(cands)}")
    if fixed.get("compile") is False:
        if "compile_mode" in fixed:
            raise UsageError("--fix compile=false contradicts --fix compile_mode (a mode turns compile on); drop one")
        cands.pop("compile_mode")
        left.append("compile mode: --fix compile=false")
    start.update(fixed)
    if "compile_mode" in fixed:
        start["compile"] = fixed["compile"] = True  # the mode compiles: the compile knob is decided too
    from dlscale.config import TrainConfig

    TrainConfig(**{k: v for k, v in start.items() if k != "threads_per_rank"})  # bad model options fail here
    return {**start, **trial}, cands, left


def subprocess_runner(store: Any, name: str, max_memory: int | None = None) -> TrialRunner:
    """Each trial as ``dlscale train`` in its own process, recorded like a sweep point (key in raw.sweep_point).
    With ``max_memory``, a trial whose resident memory passes it is killed at once (``MemoryWatch``)."""
    from dlscale.sweep.fields import to_argv
    from dlscale.sweep.driver import run_point
    from dlscale.sweep.spec import Point

    counter = iter(range(10**9))

    def run(options: dict[str, Any], key: str, timeout_s: float) -> RunRecord:
        point = Point(next(counter), "train", options, timeout_s, key, tuple(to_argv("train", options)))
        with MemoryWatch(max_memory):
            res = run_point(point, store, name)
        return store.get(res.run_id)

    return run


class MemoryWatch:
    """While open, SIGKILL every process of a trial whose tree passes ``limit`` bytes (checked every
    ``every_s``): a trial is a child of this process with everything below it (its torchrun and
    ranks, its data-loader workers), weighed as the sum of their proportional set sizes
    (``procs.proportional_bytes``, read only once the cheap sum of resident sets passes the limit),
    so a batch too large for the machine is stopped before the kernel's OOM killer picks a process
    of its own. The trial then fails as killed by SIGKILL (out of memory)."""

    def __init__(self, limit: int | None, every_s: float = 0.2) -> None:
        import threading

        self.limit, self.every_s, self.stop, self.thread = limit, every_s, threading.Event(), None
        self.killed: list[int] = []

    def __enter__(self) -> "MemoryWatch":
        import threading

        if self.limit and Path("/proc").is_dir():
            self.thread = threading.Thread(target=self._watch, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def _watch(self) -> None:
        from dlscale import procs

        me = os.getpid()
        while not self.stop.wait(self.every_s):
            for child in procs.children(me):
                members = procs.tree(child)  # the resident sum first: cheap, and never below the PSS sum
                if procs.resident_bytes(members) > self.limit and procs.proportional_bytes(members) > self.limit:
                    procs.kill(members)
                    self.killed.append(child)


def finished_trials(store: Any, tag: str) -> dict[str, RunRecord]:
    """Trial key -> the newest record of it under ``tag``: finished runs and out-of-memory failures
    (other failures, e.g. a timeout, run again)."""
    from dlscale.tune.search import is_oom

    done: dict[str, RunRecord] = {}
    for rec in store.query(kind="train", tag=tag, newest_first=False):
        key = rec.raw.get("sweep_point") or ""
        if key.startswith("tune-") and (rec.status == "ok" or is_oom(rec.error)):
            done[key] = rec
    return done


def best_config(settings: dict[str, Any]) -> dict[str, Any]:
    """The best trial's options as a config file (``dlscale train --config``): the trial-only ones left out."""
    return {k: v for k, v in settings.items() if k not in TRIAL_ONLY and v is not None}


def search_body(search: Search, output: str | None, model: str, not_searched: list[str]) -> Callable[[Any], Any]:
    """The ``tune`` record's body: run the search, write the YAML, return the figures."""
    from dlscale.format import fmt_gain
    from dlscale.harness.runner import Outcome as RunOutcome
    from dlscale.tune import configfile

    def body(_rec: Any) -> RunOutcome:
        out: Outcome = close(search, *search.select())  # every knob in order, then the closing check
        out.not_searched = list(not_searched) + [f"{s.knob}: budget spent" for s in out.steps
                                                 if s.note == "budget spent"]
        best = best_config(out.best.settings)
        path = Path(output or f"tune-{model}.yaml")  # checked before the search (tune: check_output)
        configfile.dump(best, path, header=f"dlscale tune {model}: {fmt_gain(out.gain, out.gain_ci)} over the "
                                           f"default configuration, side by side\nuse: dlscale train {model} --config {path}")
        unit = search.unit
        metrics = {"throughput_start": out.throughput_start, "throughput_best": out.throughput_best,
                   "throughput_best_ci95": list(out.best_ci) if out.best_ci else None, "gain": out.gain,
                   "gain_ci95": list(out.gain_ci) if out.gain_ci else None, "gain_pairs": len(out.pairs),
                   "trials_run": sum(1 for t in out.trials if not t.reused),
                   "trials_reused": sum(1 for t in out.trials if t.reused), "budget_spent": out.budget_spent}
        units = {"throughput_start": unit, "throughput_best": unit, "throughput_best_ci95": unit, "gain": "ratio",
                 "gain_ci95": "ratio", "gain_pairs": "pairs", "trials_run": "trials", "trials_reused": "trials"}
        raw = {"ablation": [s.to_dict() for s in out.steps], "trials": [t.to_dict() for t in out.trials],
               "side_by_side": out.pairs, "trial_run_ids": [t.run_id for t in out.trials if t.run_id],
               "best_config": best, "config_file": str(path.resolve()), "not_searched": out.not_searched}
        return RunOutcome(metrics=metrics, units=units, raw=raw, warnings=gain_warnings(out.gain, out.gain_ci))

    return body


def gain_warnings(gain: float | None, ci: tuple[float, float] | None) -> list[str]:
    """What the closing side-by-side leaves in doubt: no gain measured, or an interval that reaches 1 or below."""
    from dlscale.format import fmt_gain

    if gain is None:
        return ["the closing side-by-side of the start and the best could not run (see raw.trials); no gain measured"]
    if ci is None or ci[0] > 1.0:
        return []
    if ci[1] < 1.0:
        return [f"side by side the best ran slower than the start ({fmt_gain(gain, ci)}): keep the default "
                "configuration, and tune again on a quieter machine"]
    return [f"side by side the best and the start are not told apart ({fmt_gain(gain, ci)} reaches 1): the machine's "
            "noise is larger than the gain; tune again on a quieter machine or with more --steps"]


def tune(model: str, *, db: str | None = None, budget_s: float | None = None, resume: bool = False,
         fix: dict[str, Any] | None = None, max_memory: str | None = None, steps: int = 10, warmup_steps: int = 3,
         max_batch: int = 1024, output: str | None = None, force: bool = False, tag: str | None = None,
         device: str = "auto", runner: TrialRunner | None = None, clock: Callable[[], float] | None = None, **options: Any) -> RunRecord:
    """Search the knobs of ``model``'s short test; the ``tune`` record (raw: ablation, trials, best config)."""
    from dlscale.harness.runner import execute
    from dlscale.store import Store
    from dlscale.system import collect_cached

    from dlscale import limits

    limits.number("--budget", budget_s)  # a NaN or infinite budget never runs out
    if budget_s is not None and budget_s <= 0:
        raise UsageError(f"--budget must be > 0 seconds, got {budget_s}")
    limits.limit("--max-batch", max_batch)
    if steps < 2:
        raise UsageError(f"--steps must be >= 2 (a trial needs a confidence interval), got {steps}")
    device_type = _device_type(device)
    fix = dict(fix or {})  # plan() adds what a fixed knob implies (a compile mode fixes compile)
    system = collect_cached()
    limit = parse_memory(max_memory or ("80%" if device_type == "cpu" else None), total_memory())
    tag = tag or f"tune-{model}"
    trial = {"steps": steps, "warmup_steps": warmup_steps, "breakdown_steps": 0, "monitor_interval": 0.0,
             "device": device_type, "tag": tag}
    start, cands, left = plan(model, options, fix, device_type, trial)
    from dlscale.paths import check_output

    output = str(check_output(output or f"tune-{model}.yaml", "--output", db=db, force=force))  # before any trial
    config = {"model": model, "start": {k: v for k, v in start.items() if k != "tag"}, "fix": fix,
              "budget_s": budget_s, "max_memory_bytes": limit, "max_batch": max_batch, "resume": resume,
              "candidates": cands}
    with Store.open(db) as store:
        search = Search(start, cands, runner or subprocess_runner(store, f"tune:{model}", limit), clock or time.monotonic,
                        budget_s, limit, max_batch, done=finished_trials(store, tag) if resume else {},
                        fixed=fix, unit=_unit(model))
        return execute(kind="tune", workload=model, config=config, tag=tag, store=store, system=system,
                       body=search_body(search, output, model, left))


def _device_type(device: str) -> str:
    from dlscale.harness.device import select_device

    return select_device(device).type


def _unit(model: str) -> str:
    from dlscale import workloads

    return f"{workloads.get(model).sample_unit}/s"
