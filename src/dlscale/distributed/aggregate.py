"""From every rank's step times and all-reduce marks to the job's figures (derived in docs/METRICS.md).

Pure functions over plain lists, so the arithmetic is tested without processes.

Global throughput is the sum over ranks of the samples each processed, over the common measured
window. Every rank opens its window after the same barrier and runs the same number of steps;
the window is common once the slowest rank has closed it, so per repeat
``X = world_size * B * n / max_k W_k`` with ``W_k`` rank k's window (sum of its step times).
The step-time statistics (CI, percentiles, CV) are those of the rank that set the window.
"""

from __future__ import annotations

from typing import Any

from dlscale import stats
from dlscale.harness.metrics import summarize_steps

UNITS = {
    "rank_throughputs": "samples/s",
    "rank_throughput_min": "samples/s",
    "rank_throughput_max": "samples/s",
    "rank_imbalance": "fraction",
    "comm_fraction": "fraction",
    "comm_fraction_max": "fraction",
    "rank_comm_fractions": "fraction",
    "allreduce_seconds_per_step": "s",
    "allreduce_bytes_per_step": "bytes",
    "allreduce_busbw": "B/s",
    "world_size": "ranks",
    "nodes": "nodes",
    "devices_per_node": "devices",
}


def global_figures(per_rank: list[dict[str, Any]], batch_size: int) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """Metrics, warnings and raw series of a data-parallel run.

    ``per_rank[k]`` holds ``step_times`` (one list per repeat), and optionally ``comm_s`` (the
    all-reduce time of each timed step), ``comm_step_times`` (the step times of the window in
    which ``comm_s`` was timed, same shape as ``comm_s``; default ``step_times``) and ``bytes``
    (bytes all-reduced per step).
    ``batch_size`` is the sample units of one rank's batch (the workload's ``units_per_batch``).
    """
    if not per_rank:
        raise ValueError("no ranks reported")
    world = len(per_rank)
    nrep = len(per_rank[0]["step_times"])
    if any(len(r["step_times"]) != nrep for r in per_rank):
        raise ValueError("ranks report different numbers of repeats")
    slowest_series = []
    for i in range(nrep):
        windows = [sum(r["step_times"][i]) for r in per_rank]
        slowest_series.append(per_rank[max(range(world), key=lambda k: windows[k])]["step_times"][i])
    metrics, warnings = summarize_steps(batch_size * world, slowest_series)
    rank_thr = [stats.mean([stats.throughput(batch_size, rep) for rep in r["step_times"]]) for r in per_rank]
    metrics.update({
        "world_size": world,
        "rank_throughputs": rank_thr,
        "rank_throughput_min": min(rank_thr),
        "rank_throughput_max": max(rank_thr),
        "rank_imbalance": (max(rank_thr) - min(rank_thr)) / max(rank_thr),
    })
    raw: dict[str, Any] = {"step_times_s": slowest_series, "rank_step_times_s": [r["step_times"] for r in per_rank]}
    if all(r.get("comm_s") for r in per_rank):
        # comm_s was timed on its own instrumented window (comm_step_times) when present.
        base = [r.get("comm_step_times") or r["step_times"] for r in per_rank]
        fracs = [sum(map(sum, r["comm_s"])) / sum(map(sum, b)) for r, b in zip(per_rank, base)]
        steps = sum(len(rep) for rep in base[0])
        comm_per_step = stats.mean([sum(map(sum, r["comm_s"])) / steps for r in per_rank])
        nbytes = [b for rep in per_rank[0].get("bytes", []) for b in rep]
        per_step_bytes = stats.mean(nbytes) if nbytes else None
        metrics.update({
            "comm_fraction": stats.mean(fracs),
            "comm_fraction_max": max(fracs),
            "rank_comm_fractions": fracs,
            "allreduce_seconds_per_step": comm_per_step,
            "allreduce_bytes_per_step": per_step_bytes,
            "allreduce_busbw": allreduce_busbw(per_step_bytes, comm_per_step, world),
        })
        raw["rank_comm_s"] = [r["comm_s"] for r in per_rank]
        raw["rank_comm_step_times_s"] = base
    if world > 1 and metrics["rank_imbalance"] > 0.05:
        warnings.append(f"per-rank throughput differs by {metrics['rank_imbalance']:.1%} between the fastest and "
                        "slowest rank: the global figure is set by the slowest one")
    return metrics, warnings, raw


def allreduce_busbw(nbytes: float | None, seconds: float | None, world: int) -> float | None:
    """Bus bandwidth of a ring all-reduce: bytes x 2(n-1)/n over the time (nccl-tests' definition)."""
    if not nbytes or not seconds or world < 2:
        return None
    return nbytes * 2 * (world - 1) / world / seconds
