"""One rank of a data-parallel time-to-accuracy run (the ``tta`` family of ``distributed.job``).

Every rank joins the process group (gloo on CPU, nccl on CUDA), trains its shard with the model
in DistributedDataParallel, and evaluates its shard of the validation set (an all-reduce of correct
counts for classifiers, a gather of every rank's part for the other families); rank 0 alone writes
the MLPerf log, the checkpoints and the record.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import UsageError
from dlscale.format import fmt_count


def run_rank(spec: Any, env: Any) -> Any:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dlscale.distributed.env import host_rank, init_process_group
    from dlscale.distributed.worker import rank_layout_config
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.tta.config import TTAConfig
    from dlscale.tta.epochs import Ranks
    from dlscale.tta.repeats import add_reference, epoch_line, platform_name
    from dlscale.tta.classifier import run_tta
    from dlscale.store import Store
    from dlscale.system import collect_cached

    cfg, layout = TTAConfig(**spec.config), spec.layout_config
    if cfg.world_size != env.world_size:
        raise UsageError(f"mismatched world size: the launcher started {fmt_count(env.world_size, 'rank')}, "
                         f"the config says {cfg.world_size}")
    device = dev.select_device(cfg.device, host_rank(env))
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    store = Store.open(spec.db) if env.rank == 0 else None
    backend = init_process_group(env, layout.launch_backend, device.type, layout.timeout_s)
    config = {**resolved.to_dict(), **rank_layout_config(env, backend, layout)}
    ranks = Ranks(rank=env.rank, world=env.world_size, all_reduce=_all_reduce(device), all_gather=_all_gather,
                  barrier=dist.barrier, sync_buffers=_sync_buffers)

    def wrap(model: Any, task: Any = None) -> Any:
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                   find_unused_parameters=bool(getattr(task, "find_unused_parameters", False)))

    def body(rec: Any) -> Any:
        run = run_tta
        if resolved.family != "classification":
            from dlscale.tta.domain import run_domain as run
        out = run(resolved, device, ranks, wrap_model=wrap, platform=platform_name(device, env.world_size),
                  on_epoch=epoch_line if env.rank == 0 else None)
        if store is not None:
            add_reference(out, {**config, **out.config}, store)
        return out

    rec = execute(kind="tta", workload=resolved.model, config=config, body=body, store=store,
                  tag=resolved.tag, system=collect_cached(), price=spec.run_price)
    return rec if env.rank == 0 else None


def _all_reduce(device: Any) -> Any:
    import torch.distributed as dist

    def all_reduce(t: Any) -> None:
        moved = t.to(device)
        dist.all_reduce(moved)
        t.copy_(moved.to(t.device))

    return all_reduce


def _all_gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _sync_buffers(model: Any) -> None:
    import torch.distributed as dist

    for b in model.buffers():
        dist.broadcast(b, src=0)
