"""One rank of ``dlscale micro collectives``: run under torchrun, sweep every collective over the
sizes, time it, check it, and (rank 0) record the run and write its id for the parent.

Per (collective, size, mode), as nccl-tests: the first warm-up call is timed and its slowest
rank's time sets how many more warm-up calls and timed iterations fit in ``--budget`` seconds
(at most ``--warmup`` and ``--iters``; at least 1 iteration), so that 128 MiB over gloo on a
small machine does not take minutes; then a barrier, the timed iterations back to back, a device
synchronisation; the time is the mean over ranks of (elapsed / iterations). Then the buffers are
refilled, the collective runs once more and every rank compares its result with the exact
expected values; #wrong is the sum over ranks. Usage:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m dlscale.micro.coll_worker --db DB
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from dlscale.micro.collectives import COLLECTIVES, ELEMENT, MODES, Buffers, count_for, parse_sizes

UNITS = {"avg_busbw": "GB/s", "max_busbw": "GB/s", "wrong": "elements", "world_size": "ranks", "rows": "rows"}


class WrongResults(RuntimeError):
    pass


class BelowMinBusBw(RuntimeError):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dlscale.micro.coll_worker")
    p.add_argument("--ops", default=",".join(COLLECTIVES))
    p.add_argument("--sizes", default="8:128M")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--budget", type=float, default=0.5, help="seconds per (collective, size, mode)")
    p.add_argument("--min-busbw", type=float, default=None, help="GB/s: fail when the average busbw is lower")
    p.add_argument("--plant-wrong", default=None, help="corrupt one element of this collective's result (a test)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--db", default=None)
    p.add_argument("--tag", default=None)
    p.add_argument("--result", default=None, help="rank 0 writes {run_id, status} here")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--launch", default="{}", help="JSON: how the job was launched (recorded in the config)")
    return p.parse_args(argv)


def time_collective(b: Buffers, warmup: int, iters: int, budget: float, sync, reduce_max) -> tuple[float, int]:
    """(seconds per call on this rank, iterations timed)."""
    import torch.distributed as dist

    sync()
    t0 = time.perf_counter()
    b.call()
    sync()
    first = reduce_max(time.perf_counter() - t0)
    fit = int(budget / first) if first > 0 else iters
    for _ in range(max(0, min(warmup - 1, fit))):
        b.call()
    n_iters = max(1, min(iters, fit))
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n_iters):
        b.call()
    sync()
    return (time.perf_counter() - t0) / n_iters, n_iters


def sweep(args: argparse.Namespace, rank: int, n: int, device: Any, record: Any | None = None) -> dict[str, Any]:
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

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    rows: list[dict[str, Any]] = []
    if record is not None:
        record.raw["rows"] = rows  # kept on the record if the sweep fails part-way
    elem = ELEMENT["float"]
    for name in ops:
        coll = COLLECTIVES[name]
        for size in parse_sizes(args.sizes):
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
                t, iters = time_collective(b, args.warmup, args.iters, args.budget, sync, reduce_max)
                b.reset()
                b.call()
                sync()
                if args.plant_wrong == name and rank == (0 if coll.rooted else n - 1):
                    b.result().view(-1)[0] += 1  # a planted wrong element: the check must catch it
                t_sum, wrong = reduce([t, float(b.wrong())], dist.ReduceOp.SUM)
                t_mean = t_sum / n
                algbw = row["size"] / t_mean / 1e9
                row[mode] = {"time_us": t_mean * 1e6, "algbw": algbw, "busbw": coll.busbw(algbw, n),
                             "wrong": int(wrong), "iters": iters}
                del b
            rows.append(row)
    return summarize(rows, n)


def summarize(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """nccl-tests' footer: the average busbw over every measured (size, mode); total #wrong."""
    cells = [row[m] for row in rows for m in MODES if row.get(m)]
    busbws = [c["busbw"] for c in cells]
    return {
        "avg_busbw": sum(busbws) / len(busbws) if busbws else None,
        "max_busbw": max(busbws) if busbws else None,
        "wrong": sum(c["wrong"] for c in cells),
        "world_size": n,
        "rows": len(rows),
    }


def body(args: argparse.Namespace, rank: int, n: int, device: Any, backend: str):
    from dlscale.harness.runner import Outcome

    def run(rec) -> Outcome:
        metrics = sweep(args, rank, n, device, rec)
        rec.metrics.update(metrics)
        rec.units.update(UNITS)
        rows = rec.raw["rows"]
        if metrics["wrong"]:
            bad = sorted({r["op"] for r in rows for m in MODES if r.get(m) and r[m]["wrong"]})
            raise WrongResults(f"{metrics['wrong']} wrong element(s) in {', '.join(bad)}: the collective "
                               "returned values that differ from the exact expected result")
        if args.min_busbw is not None and (metrics["avg_busbw"] or 0) < args.min_busbw:
            raise BelowMinBusBw(f"average busbw {metrics['avg_busbw']:.3f} GB/s is below --min-busbw "
                                f"{args.min_busbw:g} GB/s")
        return Outcome(metrics=metrics, units=UNITS, raw={"rows": rows},
                       config={"backend": backend, "world_size": n, "device": device.type})

    return run


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    from dlscale.distributed import env as dist_env
    from dlscale.errors import DlscaleError

    args = parse_args(argv)
    env = dist_env.detect()
    if env is None:
        print("error: dlscale.micro.coll_worker runs under torchrun (RANK/WORLD_SIZE are not set); "
              "use `dlscale micro collectives`", file=sys.stderr)
        return 2
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    backend = dist_env.init_process_group(env, device_type="cuda" if use_cuda else "cpu", timeout_s=args.timeout)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    rank, n = env.rank, env.world_size
    try:
        if rank != 0:
            sweep(args, rank, n, device)
            return 0
        return _rank0(args, n, device, backend)
    except DlscaleError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        dist.destroy_process_group()


def _rank0(args: argparse.Namespace, n: int, device: Any, backend: str) -> int:
    from dlscale.errors import RunFailure
    from dlscale.harness.runner import execute
    from dlscale.store import Store

    config = {"ops": args.ops, "sizes": args.sizes, "warmup": args.warmup, "iters": args.iters,
              "budget_s": args.budget, "min_busbw": args.min_busbw, "type": "float", "backend": backend,
              "world_size": n, "device": device.type, "launch": json.loads(args.launch)}
    if args.plant_wrong:
        config["plant_wrong"] = args.plant_wrong
    store = Store.open(args.db) if args.db else None
    try:
        rec = execute(kind="micro", workload="collectives", config=config, tag=args.tag, store=store,
                      body=body(args, 0, n, device, backend))
        run_id, status = rec.run_id, rec.status
    except RunFailure as e:
        run_id, status = e.run_id, "failed"
    finally:
        if store is not None:
            store.close()
    if args.result:  # the parent reads the outcome from here (and exits 1 on a failed run)
        with open(args.result, "w") as f:
            json.dump({"run_id": run_id, "status": status}, f)
        return 0
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
