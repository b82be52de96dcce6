"""One rank of a data-parallel short test (the ``train`` family of ``distributed.job``).

Every rank joins the process group, runs the shared short test (``train.shorttest``) with its
model wrapped in DistributedDataParallel, then times DDP's all-reduce on an instrumented window
(``comm.CommTimer``), and sends its step times, all-reduce marks and device identity to rank 0,
which computes the job's figures (``aggregate.global_figures``) and alone writes the store.
``--parallel fsdp`` shards the model instead; ``--parallel none`` has every rank train its own
model alone, all at once (each device's own throughput, ``dlscale accept``'s check on every
device). Printing is the caller's.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from dlscale.distributed.env import DistEnv
from dlscale.errors import UsageError
from dlscale.harness.device import device_name


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
    system = collect_cached()
    ref = reference(store, resolved, system, device, env.world_size) if store is not None else None
    backend = init_process_group(env, layout.launch_backend, device.type, layout.timeout_s)
    config = {**resolved.to_dict(), **rank_layout_config(env, backend, layout)}
    check_same_job(env, config)

    def body(_rec: Any) -> Any:
        out = data_parallel_short_test(resolved, device, env, system)
        if ref is not None:
            from dlscale.distributed import dpref

            dpref.apply(out, {**config, **out.config}, ref)
        return out

    rec = execute(kind="train", workload=resolved.model, config=config, store=store, tag=resolved.tag,
                  system=system, price=spec.run_price, body=body)
    return rec if env.rank == 0 else None


def reference(store: Any, cfg: Any, system: dict[str, Any], device: Any, world: int) -> Any:
    """Rank 0's reference for the data-parallel efficiency (``dpref.resolve``); None where the ranks train
    alone (``--parallel none``: nothing to hold them to)."""
    if cfg.parallel == "none":
        return None
    import torch

    from dlscale.distributed import dpref

    return dpref.resolve(store, cfg, system.get("hostname"), device_name(device), world, torch.get_num_threads())


def rank_layout_config(env: DistEnv, backend: str, layout: Any) -> dict[str, Any]:
    """The layout part of the recorded config, as the ranks found it (world, nodes, launcher), with how
    the ranks were bound to CPUs and each rank's CPUs (placement.py), and each rank's interface and
    address, and who chose them (peers.py)."""
    import torch

    from dlscale.distributed.env import RANK_CPUS, binding
    from dlscale.distributed.peers import JOINED

    return {**layout.config(backend=backend, launcher=env.launcher, threads=torch.get_num_threads(),
                            world_size=env.world_size, nodes=env.nnodes, devices_per_node=env.local_world_size),
            "cpu_binding": binding(), "rank_cpus": list(RANK_CPUS) or None,
            "rank_network": [dict(e) for e in JOINED] or None}


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

    from dlscale.distributed.comm import CommTimer
    from dlscale.harness import device as dev
    from dlscale.harness.timing import timed_loop
    from dlscale.train.shorttest import build_setup, run_short_test

    ran: dict[str, Any] = {}

    def plain(model: Any) -> Any:
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **ddp_options(cfg))
        ran.update(ddp_as_run(ddp))
        return ddp

    def sync() -> None:
        dev.synchronize(device)
        dist.barrier()

    if cfg.parallel == "fsdp":
        return _fsdp_short_test(cfg, device, env, system, sync)
    if cfg.parallel == "none":
        return _alone_short_test(cfg, device, env, system, sync)
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
    out.config.update({"comm_timing_steps": comm_steps, "parallel": "ddp", "ddp": dict(ran)})
    mine = {**_mine(env, device, out), "comm_s": timer.repeats_comm_s, "bytes": timer.repeats_bytes,
            "comm_step_times": [comm_step_times]}
    return _rank0_figures(cfg, env, out, mine)


def _mine(env: DistEnv, device: Any, out: Any) -> dict[str, Any]:
    """What every rank sends rank 0: its place, its device and its step times."""
    return {"rank": env.rank, "node": env.node_rank, "host": socket.gethostname(),
            "device": device_identity(env, device), "step_times": out.raw["step_times_s"]}


def device_identity(env: DistEnv, device: Any) -> dict[str, Any]:
    """Which device this rank ran on, as the record names it: its rank, node, host and local rank, the
    device (``cuda:3``, ``cpu``) and its model, and where the driver says so its UUID and PCI bus id
    (CPUs: the cores the rank may run on). Peers (same ``device_name``) are compared by these."""
    import os

    ident: dict[str, Any] = {"rank": env.rank, "node": env.node_rank, "local_rank": env.local_rank,
                             "host": socket.gethostname(), "device": str(device), "device_name": device_name(device)}
    if device.type == "cuda":
        import torch

        p = torch.cuda.get_device_properties(device)
        if getattr(p, "uuid", None) is not None:
            ident["uuid"] = str(p.uuid)
        if getattr(p, "pci_bus_id", None) is not None:
            ident["pci_bus_id"] = f"{getattr(p, 'pci_domain_id', 0):08X}:{p.pci_bus_id:02X}:{getattr(p, 'pci_device_id', 0):02X}.0"
    elif hasattr(os, "sched_getaffinity"):
        ident["cpus"] = sorted(os.sched_getaffinity(0))
    return ident


def ddp_options(cfg: Any) -> dict[str, Any]:
    """DDP's keyword arguments from the resolved config's DDP fields (torch's bucket size where none is given).
    Buffers not re-broadcast every step: ``forward_sync_buffers=False`` where torch has it (2.13: they are
    still synced when DDP wraps the model), else ``broadcast_buffers=False``."""
    from dlscale import compat

    opts: dict[str, Any] = {"gradient_as_bucket_view": bool(cfg.ddp_grad_as_bucket_view),
                            "static_graph": cfg.ddp_static_graph}
    if cfg.ddp_bucket_mb is not None:
        opts["bucket_cap_mb"] = cfg.ddp_bucket_mb
    sync = "forward_sync_buffers" if compat.available("ddp_forward_sync_buffers") else "broadcast_buffers"
    opts[sync] = bool(cfg.ddp_broadcast_buffers)
    return opts


def ddp_as_run(ddp: Any) -> dict[str, Any]:
    """What DDP ran with, read back from the wrapped model (the record's ``ddp``): bucket size in MiB,
    gradients as bucket views, buffers synced at every forward, static graph."""
    sync = getattr(ddp, "forward_sync_buffers", None)
    return {"bucket_mb": ddp.bucket_bytes_cap / 2.0 ** 20, "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
            "sync_buffers_every_forward": bool(getattr(ddp, "broadcast_buffers", False) if sync is None else sync),
            "static_graph": bool(ddp.static_graph)}


def _rank0_figures(cfg: Any, env: DistEnv, out: Any, mine: dict[str, Any]) -> Any:
    """Gather every rank's series on rank 0 and turn them into the job's figures there."""
    import torch.distributed as dist

    from dlscale import workloads
    from dlscale.distributed.aggregate import UNITS, global_figures
    from dlscale.harness import energy_meter as energy
    from dlscale.harness.metrics import mfu
    from dlscale.train.shorttest import in_sample_unit

    mine["peak_memory"] = out.metrics["peak_memory_bytes"]
    mine["energy"] = out.raw.pop("energy_reading")
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    if env.rank != 0:
        return out
    gathered.sort(key=lambda g: g["rank"])
    metrics, warnings, raw = global_figures(gathered, workloads.get(cfg.model).units_per_batch(cfg))
    out.warnings = [w for w in out.warnings if "vary by" not in w] + warnings
    out.metrics.update(metrics)
    fl = out.metrics["flops_per_sample"]
    out.metrics["achieved_flops"] = fl * metrics["throughput"] if fl is not None else None
    achieved = out.metrics["achieved_flops"]
    out.metrics["mfu"] = mfu(achieved / env.world_size, out.metrics["peak_flops"]) if achieved is not None else None
    out.metrics.update({"nodes": env.nnodes, "devices_per_node": env.local_world_size,
                        "rank_peak_memory_bytes": [g["peak_memory"] for g in gathered]})
    out.units.update(in_sample_unit({**UNITS, "rank_peak_memory_bytes": "bytes"}, workloads.get(cfg.model).sample_unit))
    out.raw.update(raw)
    out.raw["rank_hosts"] = [g["host"] for g in gathered]
    out.raw["rank_devices"] = [g["device"] for g in gathered]
    units_done = metrics["samples_per_step"] * metrics["measured_steps"]
    e_metrics, e_units, e_raw = energy.figures(energy.combine(job_readings(gathered)), units_done,
                                               workloads.get(cfg.model).sample_unit)
    out.metrics.update(e_metrics)
    out.units.update(e_units)
    out.raw.update(e_raw)
    return out


def job_readings(gathered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks' energy readings that measure different devices: every rank's own GPU; a host's CPU
    packages once (the lowest rank on that host: the ranks of a host all read the same counters)."""
    seen: set[str] = set()
    keep = []
    for g in gathered:
        r = g["energy"]
        cpu = not r.get("reason") and "gpu" not in r["domains"]
        if cpu and g["host"] in seen:
            continue
        seen.add(g["host"])
        keep.append(r)
    return keep


def _fsdp_short_test(cfg: Any, device: Any, env: DistEnv, system: dict[str, Any], sync: Any) -> Any:
    """The short test with the model fully sharded (FSDP2's ``fully_shard``): each repeated block
    is its own shard group, then the root; parameters are gathered per block in forward and
    backward and gradients reduce-scattered. Communication is not timed separately here (DDP's
    comm hook has no FSDP counterpart), so the record has no all-reduce figures.
    """
    from torch.distributed.fsdp import fully_shard

    from dlscale import workloads
    from dlscale.train.shorttest import run_short_test

    w = workloads.get(cfg.model)
    units: list[str] = []

    def shard(model: Any) -> Any:
        blocks = w.block_types(model)
        units[:] = [b.__name__ for b in blocks]
        for m in model.modules():
            if blocks and isinstance(m, blocks):
                fully_shard(m)
        fully_shard(model)
        return model

    out = run_short_test(cfg, device, system, wrap_model=shard, sync=sync, world_size=env.world_size)
    out.config.update({"parallel": "fsdp", "fsdp_shard_unit": ", ".join(units) or "whole model"})
    return _rank0_figures(cfg, env, out, _mine(env, device, out))


def _alone_short_test(cfg: Any, device: Any, env: DistEnv, system: dict[str, Any], sync: Any) -> Any:
    """Every rank trains its own model alone (no DDP, no gradient exchange), all at once: the windows
    open after one barrier and close at another, so the ranks share the machine as in a data-parallel
    run, and each rank's throughput is its own device's. Rank 0 records them with each device's identity."""
    from dlscale.train.shorttest import run_short_test

    out = run_short_test(cfg, device, system, sync=sync, world_size=env.world_size)
    out.config.update({"parallel": "none"})
    return _rank0_figures(cfg, env, out, _mine(env, device, out))
