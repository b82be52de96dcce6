"""Why a run is as fast as it is: phase timing, loader-only rate and profiling, after the window.

The measured window is left exactly as the short test times it; the only thing recorded inside
it is the data-wait of each step (two ``perf_counter`` calls around the loader's ``next``).
Afterwards a few *instrumented* steps run with the device synchronised between phases, so each
phase (data-wait, host-to-device copy, forward, backward, optimizer, exposed communication) gets
its own time; synchronising inside the measured window would have removed the CPU/GPU overlap
the window is there to measure (docs/METRICS.md, "Step breakdown").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dlscale.analysis import breakdown as bd

COMM_OP_MARKERS = ("nccl", "gloo", "allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter",
                   "broadcast", "c10d", "alltoall", "all_to_all")


def time_phases(setup: Any, steps: int, device: Any) -> dict[str, list[float]]:
    """Per-phase seconds over ``steps`` instrumented steps (device synchronised after each phase).

    Under DDP (a model with ``no_sync``) each step also repeats forward+backward without the
    gradient all-reduce; ``comm`` is backward-with-sync minus backward-without: the communication
    time the backward pass did not hide.
    """
    from dlscale.harness.device import synchronize

    def now() -> float:
        synchronize(device)
        return time.perf_counter()

    out: dict[str, list[float]] = {p: [] for p in bd.PHASES}
    no_sync = getattr(setup.model, "no_sync", None)
    for _ in range(steps):
        t0 = now()
        xh, yh = setup.fetch()
        t1 = now()
        x, y = setup.to_device(xh, yh)
        t2 = now()
        setup.optimizer.zero_grad(set_to_none=True)
        loss = setup.forward_loss(x, y)
        t3 = now()
        setup.backward(loss)
        t4 = now()
        setup.optimizer_step()
        t5 = now()
        comm = 0.0
        if no_sync is not None:
            setup.optimizer.zero_grad(set_to_none=True)
            with no_sync():
                loss = setup.forward_loss(x, y)
                t6 = now()
                setup.backward(loss)
                t7 = now()
            setup.optimizer.zero_grad(set_to_none=True)
            comm = max(0.0, (t4 - t3) - (t7 - t6))
        for p, v in zip(bd.PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, comm)):
            out[p].append(v)
    return out


def loader_only_rate(feed: Any, batches: int) -> float:
    """Samples/s the loader delivers with no training: drain what the workers had buffered, then time."""
    loader = feed.loader
    for _ in range(loader.workers * loader.loader.prefetch_factor if loader.workers else 0):
        feed.fetch()
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        x, _y = feed.fetch()
        n += len(x)
    return n / (time.perf_counter() - t0)


def decode_rate_per_core(dataset: Any, images: int) -> float:
    """Decode+augment images per CPU-second of one thread (``time.thread_time``), in this process."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dataset[0]  # first-call costs (transform set-up) are not per-image work
        n = min(images, len(dataset))
        c0 = time.thread_time()
        for i in range(n):
            dataset[i]
        return n / max(time.thread_time() - c0, 1e-9)
    finally:
        torch.set_num_threads(threads)


def profile_steps(step: Any, steps: int, device: Any, out_dir: str, label: str, top: int = 15) -> dict[str, Any]:
    """torch.profiler over ``steps`` training steps: a Chrome trace file and the top ops by self time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = str(Path(out_dir) / f"{label}-{stamp}.trace.json")
    prof.export_chrome_trace(path)
    rows = top_ops(prof.key_averages(), device.type == "cuda")
    return {"trace": path, "top_ops": rows[:top], "comm_share": comm_share(rows)}


def top_ops(averages: Any, on_device: bool) -> list[dict[str, Any]]:
    """Ops sorted by self time (device time on CUDA, CPU time otherwise), with their share."""
    def self_us(e: Any) -> float:
        if on_device:
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))
        return float(e.self_cpu_time_total)

    rows = [{"op": e.key, "calls": int(e.count), "self_s": self_us(e) / 1e6} for e in averages]
    total = sum(r["self_s"] for r in rows)
    rows.sort(key=lambda r: r["self_s"], reverse=True)
    for r in rows:
        r["share"] = r["self_s"] / total if total > 0 else 0.0
    return rows


def comm_share(rows: list[dict[str, Any]]) -> float:
    """Share of self time in collective-communication ops (names with nccl, gloo, all_reduce, ...)."""
    return sum(r["share"] for r in rows if any(m in r["op"].lower() for m in COMM_OP_MARKERS))


def explain(cfg: Any, setup: Any, device: Any, feed: Any, waits: list[float], window_seconds: float,
            world_size: int = 1) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], list[str]]:
    """The breakdown, rates and verdict of a finished window: (metrics, units, raw, warnings).

    Rates are per rank (one rank's batch over one rank's phase times), so the loader and the
    compute rate compare like with like on any number of ranks.
    """
    import statistics

    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    raw: dict[str, Any] = {}
    warnings: list[str] = []
    n = min(cfg.breakdown_steps, cfg.steps)
    phases: dict[str, float] = {}
    if n > 0:
        series = time_phases(setup, n, device)
        raw["phase_seconds"] = series
        phases = {p: statistics.mean(v) for p, v in series.items()}
        shares = bd.phase_shares(phases)
        for p in bd.PHASES:
            metrics[f"phase_{p}"], units[f"phase_{p}"] = phases[p], "s"
            metrics[f"phase_{p}_share"], units[f"phase_{p}_share"] = shares[p], "fraction"
        metrics["breakdown_steps"], units["breakdown_steps"] = n, "steps"
    wait_share = bd.window_wait_share(waits, window_seconds) if feed is not None else 0.0
    metrics["data_wait_share"], units["data_wait_share"] = wait_share, "fraction"
    from dlscale import workloads

    crate = bd.compute_rate(workloads.get(cfg.model).units_per_batch(cfg), phases) if phases else None
    metrics["compute_rate"], units["compute_rate"] = crate, "samples/s"
    lrate = None
    if feed is not None:
        lrate = loader_only_rate(feed, max(2, n))
        per_core = decode_rate_per_core(feed.loader.loader.dataset, 32)
        metrics.update({
            "loader_rate": lrate, "loader_workers": feed.loader.workers,
            "decode_rate_per_core": per_core,
            "input_cores_needed": bd.cores_needed(crate, per_core),
            "images_skipped": feed.loader.skipped,
        })
        units.update({"loader_rate": "samples/s", "loader_workers": "processes", "decode_rate_per_core": "images/s/core",
                      "input_cores_needed": "cores", "images_skipped": "images"})
        if feed.loader.skipped:
            raw["skipped_paths"] = list(feed.loader.skipped_paths)
            warnings.append(f"{feed.loader.skipped} unreadable image(s) skipped, first {feed.loader.skipped_paths[0]} "
                            "(--strict fails the run instead)")
    comm = bd.phase_shares(phases)["comm"] if phases and world_size > 1 else None
    v = bd.verdict(data_wait_share=wait_share, comm_share=comm, loader_rate=lrate, compute_rate=crate)
    metrics["verdict"], metrics["verdict_reason"] = v["verdict"], v["reason"]
    if cfg.profile:
        label = cfg.model if world_size == 1 else f"{cfg.model}-rank{process_rank()}"  # one trace per rank
        prof = profile_steps(setup.step, cfg.profile_steps, device, cfg.profile, label)
        metrics["profile_trace"] = prof["trace"]
        metrics["profile_comm_share"], units["profile_comm_share"] = prof["comm_share"], "fraction"
        raw["profile_top_ops"] = prof["top_ops"]
    return metrics, units, raw, warnings


def process_rank() -> int:
    """This process's rank in its process group (0 where there is none)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
