"""The per-rank entry of a data-parallel time-to-accuracy run: ``python -m dlscale.longtest.worker``.

``dlscale tta --nproc-per-node N`` starts this module on every rank through
``dlscale.distributed.launch.run_torchrun``. Every rank joins the process group (gloo on CPU,
nccl on CUDA), trains its shard with the model in DistributedDataParallel, and takes part in
the evaluation's all-reduce of correct counts; rank 0 alone writes the MLPerf log, the
checkpoints and the record, and leaves the run id in the job directory for the launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from dlscale.errors import RunFailure, UsageError

MODULE = "dlscale.longtest.worker"


def worker_args(config: dict[str, Any], db: str, job_dir: str) -> list[str]:
    return ["--spec", json.dumps({"config": config, "db": db, "job_dir": job_dir})]


def run_rank(spec: dict[str, Any], env: Any) -> Any:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dlscale.distributed.env import init_process_group
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.longtest.config import TTAConfig
    from dlscale.longtest.tta import Ranks, run_tta
    from dlscale.store import Store
    from dlscale.system import collect_cached

    cfg = TTAConfig(**spec["config"])
    if cfg.world_size != env.world_size:
        raise UsageError(f"mismatched world size: the launcher started {env.world_size} ranks, "
                         f"the config says {cfg.world_size}")
    device = dev.select_device(cfg.device, env.local_rank)
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    store = Store.open(spec["db"]) if env.rank == 0 else None
    backend = init_process_group(env, None, device.type)
    system = collect_cached()

    def all_reduce(t: Any) -> None:
        moved = t.to(device)
        dist.all_reduce(moved)
        t.copy_(moved.to(t.device))

    def sync_buffers(model: Any) -> None:
        for b in model.buffers():
            dist.broadcast(b, src=0)

    ranks = Ranks(rank=env.rank, world=env.world_size, all_reduce=all_reduce, barrier=dist.barrier,
                  sync_buffers=sync_buffers)

    def wrap(model: Any) -> Any:
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    def body(rec: Any) -> Any:
        from dlscale.cli.tta import add_reference, device_name, epoch_line

        out = run_tta(resolved, device, ranks, wrap_model=wrap, platform=device_name(device, env.world_size),
                      on_epoch=epoch_line if env.rank == 0 else None)
        out.config.update({"backend": backend, "launcher": env.launcher, "devices_per_node": env.local_world_size})
        if store is not None:
            add_reference(out, {**resolved.to_dict(), **out.config}, store)
        return out

    rec = execute(kind="tta", workload=resolved.model, config=resolved.to_dict(), body=body, store=store,
                  tag=resolved.tag, system=system)
    return rec if env.rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    from dlscale.distributed import faults
    from dlscale.distributed.env import detect

    p = argparse.ArgumentParser(prog=MODULE)
    p.add_argument("--spec", required=True)
    spec = json.loads(p.parse_args(sys.argv[1:] if argv is None else argv).spec)
    env = detect()
    if env is None:
        print(f"error: {MODULE} is started by a launcher; use `dlscale tta --nproc-per-node N`", file=sys.stderr)
        return 2
    try:
        rec = run_rank(spec, env)
    except (UsageError, RunFailure, Exception) as e:  # noqa: BLE001 - every rank's failure is reported
        faults.write_failure(spec["job_dir"], env.rank, env.node_rank, " ".join(str(e).split()))
        if isinstance(e, RunFailure) and e.run_id and env.rank == 0:
            faults.write_run_id(spec["job_dir"], e.run_id)
        print(f"error: rank {env.rank}: {' '.join(str(e).split())}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(e.exit_code if isinstance(e, (UsageError, RunFailure)) else 1)  # no teardown to hang in
    import torch.distributed as dist

    if rec is not None:
        faults.write_run_id(spec["job_dir"], rec.run_id)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
