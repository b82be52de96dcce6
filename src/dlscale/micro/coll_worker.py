"""One rank of ``dlscale micro collectives`` (the ``collectives`` family of ``distributed.job``):
sweep every collective over the sizes, time it, check it, and (rank 0) record the run.

Per (collective, size, mode), as nccl-tests: the first warm-up call is timed and its slowest
rank's time sets how many more warm-up calls and timed iterations fit in ``--budget`` seconds
(at most ``--warmup`` and ``--iters``; at least 1 iteration), so that 128 MiB over gloo on a
small machine does not take minutes; then a barrier, the timed iterations back to back, a device
synchronisation; the time is the mean over ranks of (elapsed / iterations). On CUDA devices the
iterations are windows of K back-to-back calls between CUDA events made before the loop, K
calibrated on the slowest rank so that a window lasts at least 1 ms (many calls per window for
small sizes, as nccl-tests' iteration count), every rank using the same K and window count; the
time is the median over windows of the mean over ranks of (window / K). Then the buffers are
refilled, the collective runs once more and every rank compares its result with the exact
expected values; #wrong is the sum over ranks. Started by ``dlscale micro collectives`` (or
``api.micro("collectives", layout=...)``), never directly.
"""

from __future__ import annotations

import time
from typing import Any

from dlscale.harness.window import MOST, Window
from dlscale.harness.gputime import MAX_WINDOWS
from dlscale.micro.collectives import COLLECTIVES, ELEMENT, MODES, Buffers, CollectiveOptions, count_for, parse_sizes

UNITS = {"avg_busbw": "GB/s", "max_busbw": "GB/s", "wrong": "elements", "world_size": "ranks", "rows": "rows",
         **{f"{stat}_busbw_{op}": "GB/s" for op in COLLECTIVES for stat in ("avg", "max")}}


class WrongResults(RuntimeError):
    pass


class BelowMinBusBw(RuntimeError):
    pass


def time_collective(b: Buffers, warmup: int, iters: int, budget: float, sync, reduce_max,
                    device: Any = None, window: Any = None) -> tuple[list[float], dict[str, Any]]:
    """(seconds per call on this rank, one per timed window; the cell's timing fields).

    CPUs: one window of the iterations, timed by the host clock (``{"iters": n}``). CUDA devices:
    ``cuda_windows``. Every decision is taken on values all-reduced over the ranks (the slowest
    rank's time), so every rank makes the same number of calls. ``window`` (harness.window.Window)
    with a target duration: as many iterations (CUDA: windows) as the first call's time (CUDA: the last
    calibration window) says the target needs, never fewer than the budget allows of ``iters``.
    """
    import torch.distributed as dist

    sync()
    t0 = time.perf_counter()
    b.call()
    sync()
    first = reduce_max(time.perf_counter() - t0)
    fit = int(budget / first) if first > 0 else iters
    for _ in range(max(0, min(warmup - 1, fit))):
        b.call()
    if getattr(device, "type", "cpu") == "cuda":
        return cuda_windows(b, iters, budget, sync, reduce_max, device, window=window)
    n_iters = max(1, min(iters, fit))
    if window is not None:
        n_iters = window.size(n_iters, first)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n_iters):
        b.call()
    sync()
    return [(time.perf_counter() - t0) / n_iters], {"iters": n_iters, **_sizing(window)}


def _sizing(window: Any) -> dict[str, Any]:
    return {"sizing": window.last} if window is not None and window.last else {}


def cuda_windows(b: Buffers, iters: int, budget: float, sync, reduce_max, device: Any,
                 api: Any = None, window: Any = None) -> tuple[list[float], dict[str, Any]]:
    """Up to ``iters`` windows of K calls each, between CUDA events made once before the loop.

    K comes from calibration windows timed on every rank and reduced to the slowest (``harness.gputime.
    calibrate``: the first K whose window reaches 1 ms); the windows that fit in ``budget`` at that
    length are timed back to back after a barrier (at least one).
    """
    import torch.distributed as dist

    from dlscale.harness import gputime

    api = api if api is not None else gputime.TorchCuda(device)
    marks = gputime.Marks(api, 2)  # the calibration's pair, then the first window's edges

    def calls_of(calls: int) -> None:
        for _ in range(calls):
            b.call()

    def calibration(calls: int) -> float:
        sync()
        dist.barrier()
        return reduce_max(marks.time(lambda: calls_of(calls)))

    calls, tried = gputime.calibrate(calibration, target_s=gputime.window_target(window, MAX_WINDOWS))
    per_window = tried[-1][1]
    windows = max(1, min(iters, int(budget / per_window) if per_window > 0 else iters))
    if window is not None:
        windows = window.size(windows, per_window)
    marks.grow(windows + 1)  # made before the timed windows
    sync()
    per_call = [t / calls for t in gputime.timed_windows(marks, lambda: calls_of(calls), windows,
                                                         begin=dist.barrier)]
    return per_call, {"iters": windows * calls, "calls_per_window": calls, "windows": windows,
                      "timing": "cuda-events", "calibration": tried, **_sizing(window)}


def sweep(opts: CollectiveOptions, rank: int, n: int, device: Any, record: Any | None = None) -> dict[str, Any]:
    """Every (collective, size): a row with out-of-place and in-place figures and #wrong."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def reduce(values: list[float], op) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def reduce_max(x: float) -> float:
        return reduce([x], dist.ReduceOp.MAX)[0]

    rows: list[dict[str, Any]] = []
    if record is not None:
        record.raw["rows"] = rows  # kept on the record if the sweep fails part-way
    elem = ELEMENT["float"]
    for name in opts.op_list:
        coll = COLLECTIVES[name]
        for size in parse_sizes(opts.sizes):
            count = count_for(coll, size, n, elem)
            if count == 0 or (coll.sharded and count < n):
                continue
            row: dict[str, Any] = {"op": name, "size": count * elem, "count": count, "type": "float",
                                   "redop": coll.redop, "root": 0 if coll.rooted else -1}
            for mode in MODES:
                if mode not in coll.modes:
                    row[mode] = None
                    continue
                b = Buffers(coll, count, mode, rank, n, device)
                window = Window(opts.min_duration_s, most=MAX_WINDOWS if device.type == "cuda" else MOST) \
                    if opts.min_duration_s is not None else None
                times, timing = time_collective(b, opts.warmup, opts.iters, opts.budget, sync, reduce_max, device,
                                                window)
                b.reset()
                b.call()
                sync()
                if opts.plant_wrong == name and rank == (0 if coll.rooted else n - 1):
                    b.result().view(-1)[0] += 1  # a planted wrong element: the check must catch it
                *t_sums, wrong = reduce([*times, float(b.wrong())], dist.ReduceOp.SUM)
                row[mode] = cell(row["size"], [t / n for t in t_sums], int(wrong), timing, coll, n)
                del b
            rows.append(row)
    return summarize(rows, n)


def cell(size: int, times: list[float], wrong: int, timing: dict[str, Any], coll: Any, n: int) -> dict[str, Any]:
    """One (size, mode) cell from the rank-mean seconds per call of each window: its median
    (the one window's time on CPUs), algbw and busbw; GPU cells keep the windows' samples."""
    from dlscale import stats

    t = times[0] if len(times) == 1 else stats.percentile(times, 50)
    algbw = size / t / 1e9
    out = {"time_us": t * 1e6, "algbw": algbw, "busbw": coll.busbw(algbw, n), "wrong": wrong, **timing}
    if "windows" in timing:
        out["samples_us"] = [x * 1e6 for x in times]
    return out


def summarize(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """nccl-tests' footer, per collective: the average and largest busbw over its measured cells.

    ``avg_busbw_<op>`` is the mean over that collective's measured (size, mode) cells and
    ``max_busbw_<op>`` the largest; ``avg_busbw``/``max_busbw`` are kept only when a single
    collective ran (None otherwise: busbw of different collectives does not average to a figure
    of anything). ``wrong`` is the total #wrong.
    """
    by_op: dict[str, list[float]] = {}
    for row in rows:
        by_op.setdefault(row["op"], []).extend(row[m]["busbw"] for m in MODES if row.get(m))
    per_op: dict[str, Any] = {}
    for op, busbws in by_op.items():
        per_op[f"avg_busbw_{op}"] = sum(busbws) / len(busbws) if busbws else None
        per_op[f"max_busbw_{op}"] = max(busbws) if busbws else None
    only = next(iter(by_op)) if len(by_op) == 1 else None
    cells = [row[m] for row in rows for m in MODES if row.get(m)]
    return {
        "avg_busbw": per_op[f"avg_busbw_{only}"] if only else None,
        "max_busbw": per_op[f"max_busbw_{only}"] if only else None,
        **per_op,
        "wrong": sum(c["wrong"] for c in cells),
        "world_size": n,
        "rows": len(rows),
    }


def below_min_busbw(metrics: dict[str, Any], ops: list[str], min_busbw: float) -> list[str]:
    """One phrase per collective of ``ops`` whose average busbw is below ``min_busbw`` (GB/s)."""
    if not ops:
        return [f"no collective was measured, so none reaches --min-busbw {min_busbw:g} GB/s"]
    out = []
    for op in ops:
        avg = metrics.get(f"avg_busbw_{op}")
        if avg is None or avg < min_busbw:
            shown = "N/A" if avg is None else f"{avg:.3f}"
            out.append(f"{op} average busbw {shown} GB/s is below --min-busbw {min_busbw:g} GB/s")
    return out


def body(opts: CollectiveOptions, rank: int, n: int, device: Any, backend: str):
    from dlscale.harness.runner import Outcome

    def run(rec) -> Outcome:
        metrics = sweep(opts, rank, n, device, rec)
        units = {k: u for k, u in UNITS.items() if k in metrics}
        rec.metrics.update(metrics)
        rec.units.update(units)
        rows = rec.raw["rows"]
        if metrics["wrong"]:
            bad = sorted({r["op"] for r in rows for m in MODES if r.get(m) and r[m]["wrong"]})
            raise WrongResults(f"{metrics['wrong']} wrong element(s) in {', '.join(bad)}: the collective "
                               "returned values that differ from the exact expected result")
        if opts.min_busbw is not None:  # gated per collective, as nccl-tests gates each test binary
            below = below_min_busbw(metrics, list(dict.fromkeys(r["op"] for r in rows)), opts.min_busbw)
            if below:
                raise BelowMinBusBw("; ".join(below))
        return Outcome(metrics=metrics, units=units, raw={"rows": rows},
                       config={"backend": backend, "world_size": n, "device": device.type})

    return run


def link_figures(metrics: dict[str, Any], link_bandwidth: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The emulated link's rate (GB/s) and each collective's average busbw as a fraction of it.

    busbw is defined to be comparable with the bandwidth of one link (nccl-tests), so on nodes
    joined by one shaped link the fraction says how much of that link a collective used. Where
    nodes have links of their own rates, ``link_bandwidth`` is the slowest (a ring runs at it).
    """
    if not link_bandwidth:
        return {}, {}
    from dlscale.distributed.netns import parse_rate

    rate = parse_rate(link_bandwidth) / 8 / 1e9
    out: dict[str, Any] = {"link_rate": rate}
    units = {"link_rate": "GB/s"}
    for key, value in metrics.items():
        if key.startswith("avg_busbw_") and value is not None:
            out[f"link_utilisation_{key.removeprefix('avg_busbw_')}"] = value / rate
            units[f"link_utilisation_{key.removeprefix('avg_busbw_')}"] = "fraction"
    return out, units


def join(env: Any, layout: Any, device_choice: str) -> tuple[str, Any]:
    """Join the job's process group on this rank's device (``--device`` auto, cpu or cuda); the
    backend and the device. Shared by the kinds that run as ranks (collectives, links)."""
    import torch

    from dlscale.distributed import env as dist_env

    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if device_choice == "cuda" and not torch.cuda.is_available():
        from dlscale.errors import UsageError

        raise UsageError("--device cuda: no CUDA device is visible here; use --device cpu or auto")
    backend = dist_env.init_process_group(env, layout.launch_backend, "cuda" if use_cuda else "cpu", layout.timeout_s)
    return backend, torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")


def record(spec: Any, workload: str, config: dict[str, Any], tag: str | None, run: Any) -> Any:
    """Rank 0: run ``run`` through the harness and store it as a ``micro`` record of ``workload``."""
    from dlscale.harness.runner import execute
    from dlscale.store import Store

    store = Store.open(spec.db) if spec.db else None
    try:
        return execute(kind="micro", workload=workload, config=config, tag=tag, store=store,
                       price=spec.run_price, body=run)
    finally:
        if store is not None:
            store.close()


def run_rank(spec: Any, env: Any) -> Any:
    """This rank's sweep; rank 0 records the run and returns the record (the others None)."""
    from dlscale.distributed.worker import rank_layout_config
    from dlscale.micro.collectives import CollectiveOptions

    opts, layout = CollectiveOptions(**spec.config), spec.layout_config
    backend, device = join(env, layout, opts.device)
    if env.rank != 0:
        sweep(opts, env.rank, env.world_size, device)
        return None
    config = {"ops": ",".join(opts.op_list), "sizes": opts.sizes, "warmup": opts.warmup, "iters": opts.iters,
              "min_duration_s": opts.min_duration_s, "budget_s": opts.budget, "min_busbw": opts.min_busbw,
              "type": "float", "device": device.type,
              **rank_layout_config(env, backend, layout)}
    if opts.plant_wrong:
        config["plant_wrong"] = opts.plant_wrong
    run = body(opts, 0, env.world_size, device, backend)

    def run_and_link(rec: Any) -> Any:
        out = run(rec)
        extra, units = link_figures(out.metrics, layout.slowest_link())
        out.metrics.update(extra)
        out.units.update(units)
        return out

    return record(spec, "collectives", config, opts.tag, run_and_link)
