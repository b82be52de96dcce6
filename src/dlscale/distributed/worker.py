"""One rank of a data-parallel short test (the ``train`` family of ``distributed.job``).

Every rank joins the process group, runs the shared short test (``train.shorttest``) with its
model wrapped in DistributedDataParallel, then times DDP's all-reduce on an instrumented window
(``comm.CommTimer``), and sends its step times and all-reduce marks to rank 0, which computes the
job's figures (``aggregate.global_figures``) and alone writes the store. Printing is the caller's.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from dlscale.distributed.env import DistEnv
from dlscale.errors import UsageError


def run_rank(spec: Any, env: DistEnv) -> Any:
    """Run this rank's part of the job; rank 0 returns the stored record, the others None."""
    import torch

    from dlscale.config import TrainConfig
    from dlscale.distributed.env import host_rank, init_process_group
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.store import Store
    from dlscale.system import collect_cached

    layout = spec.layout_config
    if layout.threads_per_rank:
        torch.set_num_threads(layout.threads_per_rank)
    cfg = TrainConfig(**spec.config)
    device = dev.select_device(cfg.device, host_rank(env))
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    store = Store.open(spec.db) if env.rank == 0 else None
    backend = init_process_group(env, layout.launch_backend, device.type, layout.timeout_s)
    config = {**resolved.to_dict(), **rank_layout_config(env, backend, layout)}
    check_same_job(env, config)
    system = collect_cached()
    rec = execute(kind="train", workload=resolved.model, config=config, store=store, tag=resolved.tag,
                  system=system, body=lambda _rec: data_parallel_short_test(resolved, device, env, system))
    return rec if env.rank == 0 else None


def rank_layout_config(env: DistEnv, backend: str, layout: Any) -> dict[str, Any]:
    """The layout part of the recorded config, as the ranks found it (world, nodes, launcher)."""
    import torch

    return layout.config(backend=backend, launcher=env.launcher, threads=torch.get_num_threads(),
                         world_size=env.world_size, nodes=env.nnodes, devices_per_node=env.local_world_size)


def check_same_job(env: DistEnv, config: dict[str, Any]) -> None:
    """Every rank must run the same world size (a launcher started with other counts is refused)."""
    import torch.distributed as dist

    seen: list[Any] = [None] * env.world_size
    dist.all_gather_object(seen, (env.world_size, json.dumps(config, sort_keys=True, default=str)))
    if len({s[0] for s in seen}) > 1:
        raise UsageError(f"mismatched world sizes across ranks: {sorted({s[0] for s in seen})}")


# Steps of the instrumented window after the measured one, where the all-reduce is timed.
COMM_TIMING_STEPS = 20


def data_parallel_short_test(cfg: Any, device: Any, env: DistEnv, system: dict[str, Any]) -> Any:
    """The short test under DDP on this rank; rank 0's outcome carries the job's figures.

    The process group is initialised. Every rank runs ``train.shorttest.run_short_test`` with its
    model wrapped in plain DDP and a barrier around the window, then up to ``COMM_TIMING_STEPS``
    more steps of a fresh DDP model whose all-reduce is timed by ``CommTimer``; all ranks' step
    times and all-reduce marks are gathered and rank 0 computes the figures.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dlscale.distributed.aggregate import UNITS, global_figures
    from dlscale.distributed.comm import CommTimer
    from dlscale.harness import device as dev
    from dlscale.harness.metrics import mfu
    from dlscale.harness.timing import timed_loop
    from dlscale.train.shorttest import build_setup, run_short_test

    def plain(model: Any) -> Any:
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    def sync() -> None:
        dev.synchronize(device)
        dist.barrier()

    # The measured window runs DDP untouched (its built-in C++ all-reduce): a Python comm hook costs
    # ~5% of throughput on CPU/gloo (docs/PERFORMANCE.md). Communication is then timed on a separate,
    # instrumented window of a fresh DDP model with dlscale's timing hook (docs/METRICS.md).
    out = run_short_test(cfg, device, system, wrap_model=plain, sync=sync, world_size=env.world_size)
    timer = CommTimer(device, env.world_size)

    def timed(model: Any) -> Any:
        ddp = plain(model)
        ddp.register_comm_hook(None, timer.hook)
        return ddp

    comm_steps = min(cfg.steps, COMM_TIMING_STEPS)
    setup = build_setup(cfg, device, seed=cfg.seed, wrap_model=timed)
    comm_step_times, _ = timed_loop(setup.step, min(cfg.warmup_steps, 2), comm_steps, device,
                                    on_step=timer.on_step, sync=sync)
    del setup
    out.config["comm_timing_steps"] = comm_steps
    mine = {"rank": env.rank, "node": env.node_rank, "host": socket.gethostname(),
            "step_times": out.raw["step_times_s"], "comm_s": timer.repeats_comm_s, "bytes": timer.repeats_bytes,
            "comm_step_times": [comm_step_times]}
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    if env.rank != 0:
        return out
    gathered.sort(key=lambda g: g["rank"])
    metrics, warnings, raw = global_figures(gathered, cfg.batch_size)
    out.warnings = [w for w in out.warnings if "vary by" not in w] + warnings
    out.metrics.update(metrics)
    out.metrics["achieved_flops"] = out.metrics["flops_per_sample"] * metrics["throughput"]
    out.metrics["mfu"] = mfu(out.metrics["achieved_flops"] / env.world_size, out.metrics["peak_flops"])
    out.metrics.update({"nodes": env.nnodes, "devices_per_node": env.local_world_size})
    out.units.update(UNITS)
    out.raw.update(raw)
    out.raw["rank_hosts"] = [g["host"] for g in gathered]
    return out
