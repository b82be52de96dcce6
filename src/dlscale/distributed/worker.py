"""The per-rank entry of a data-parallel short test: ``python -m dlscale.distributed.worker --spec JSON``.

Every rank joins the process group, runs the shared short test (``train.shorttest``) with its
model wrapped in DistributedDataParallel and DDP's all-reduce timed by ``comm.CommTimer``, then
sends its step times and all-reduce marks to rank 0, which computes the job's figures
(``aggregate.global_figures``) and alone writes the store and prints. A failing rank writes its
cause into the job directory (``faults``) so the launcher can name it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.distributed import faults
from dlscale.distributed.env import DistEnv
from dlscale.errors import RunFailure, UsageError

MODULE = "dlscale.distributed.worker"


@dataclass
class WorkerSpec:
    """What every rank runs; passed to the ranks as one JSON argument."""

    config: dict[str, Any]  # TrainConfig fields (unresolved)
    db: str | None = None
    backend: str | None = None  # None: nccl on CUDA, gloo on CPU
    timeout_s: float = 300.0  # rendezvous and collective timeout
    job_dir: str | None = None  # where ranks report failures and rank 0 the run id
    report: bool = False  # rank 0 prints the summary (external launchers; dlscale's launcher prints itself)
    fmt: str = "human"
    threads_per_rank: int | None = None
    expected_world_size: int | None = None
    link: dict[str, Any] = field(default_factory=dict)  # emulated-link settings, recorded as given

    def to_args(self) -> list[str]:
        return ["--spec", json.dumps(asdict(self))]

    @classmethod
    def from_args(cls, argv: list[str]) -> "WorkerSpec":
        p = argparse.ArgumentParser(prog=MODULE)
        p.add_argument("--spec", required=True)
        return cls(**json.loads(p.parse_args(argv).spec))


def run_rank(spec: WorkerSpec, env: DistEnv) -> Any:
    """Run this rank's part of the job; rank 0 returns the stored record, the others None."""
    import torch
    import torch.distributed as dist

    from dlscale.config import TrainConfig
    from dlscale.distributed.env import init_process_group
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.store import Store
    from dlscale.system import collect_cached

    if spec.expected_world_size is not None and spec.expected_world_size != env.world_size:
        raise UsageError(f"mismatched world size: the launcher ({env.launcher}) started {env.world_size} ranks "
                         f"but --nproc-per-node x --nnodes is {spec.expected_world_size}")
    if spec.threads_per_rank:
        torch.set_num_threads(spec.threads_per_rank)
    cfg = TrainConfig(**spec.config)
    device = dev.select_device(cfg.device, env.local_rank)
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    store = Store.open(spec.db) if env.rank == 0 else None
    backend = init_process_group(env, spec.backend, device.type, spec.timeout_s)
    config = {**resolved.to_dict(), **layout_config(env, backend, spec)}
    seen: list[Any] = [None] * env.world_size
    dist.all_gather_object(seen, (env.world_size, json.dumps(config, sort_keys=True, default=str)))
    if len({s[0] for s in seen}) > 1:
        raise UsageError(f"mismatched world sizes across ranks: {sorted({s[0] for s in seen})}")
    system = collect_cached()
    rec = execute(kind="train", workload=resolved.model, config=config, store=store, tag=resolved.tag,
                  system=system, body=lambda _rec: data_parallel_short_test(resolved, device, env, system))
    return rec if env.rank == 0 else None


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


def layout_config(env: DistEnv, backend: str, spec: WorkerSpec) -> dict[str, Any]:
    """The distributed part of the recorded config: layout, backend, launcher, link."""
    link = spec.link or {}
    return {
        "world_size": env.world_size, "nodes": env.nnodes, "devices_per_node": env.local_world_size,
        "backend": backend, "launcher": env.launcher, "emulated_nodes": bool(link.get("emulated")),
        "link_bandwidth": link.get("link_bandwidth"), "link_latency": link.get("link_latency"),
        "threads_per_rank": spec.threads_per_rank or _threads(), "dist_timeout_s": spec.timeout_s,
    }


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def run(spec: WorkerSpec, env: DistEnv) -> int:
    """Run a rank and turn the outcome into an exit code; failures are reported to the job directory."""
    try:
        rec = run_rank(spec, env)
    except Exception as e:  # noqa: BLE001 - every rank's failure is reported (UsageError, RunFailure, others)
        from dlscale.harness.runner import describe_failure

        cause = describe_failure(e.__cause__) if isinstance(e, RunFailure) and e.__cause__ else str(e)
        faults.write_failure(spec.job_dir, env.rank, env.node_rank, " ".join(cause.split()),
                             usage=isinstance(e, UsageError))
        if isinstance(e, RunFailure) and env.rank == 0 and e.run_id:
            faults.write_run_id(spec.job_dir, e.run_id)
        if env.rank == 0 or spec.job_dir is None:
            print(f"error: rank {env.rank}: {' '.join(str(e).split())}", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(e.exit_code if isinstance(e, (UsageError, RunFailure)) else 1)  # no process-group teardown to hang in
    import torch.distributed as dist

    if env.rank == 0 and rec is not None:
        faults.write_run_id(spec.job_dir, rec.run_id)
        if spec.report:
            from dlscale.cli.common import Format
            from dlscale.cli.train import report

            report(rec, Format(spec.fmt))
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    from dlscale.distributed.env import detect

    spec = WorkerSpec.from_args(sys.argv[1:] if argv is None else argv)
    try:
        env = detect()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if env is None:
        print(f"error: {MODULE} is started by a launcher (torchrun, srun, mpirun); use `dlscale train --nproc-per-node N`",
              file=sys.stderr)
        return 2
    return run(spec, env)


if __name__ == "__main__":
    sys.exit(main())
