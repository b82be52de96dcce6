"""Per-rank A/B of dlscale's data-parallel short test against a plain DDP loop, alternating in one job.

Started by `benchmarks/overhead.py ddp` (arms/ddp.py) under torchrun as ``python -m arms.ddp_worker`` (1 or 2 ranks, gloo). Each round runs, in the same
processes and in an order rotated round by round:

- ``dlscale``: ``dlscale.distributed.worker.data_parallel_short_test``, exactly what every rank of
  `dlscale train --nproc-per-node N` runs (the shared short test under DDP with dlscale's DDP defaults:
  gradients as bucket views, no per-step buffer broadcast; the monitor; the comm-timing window after the
  measured one; the gather on rank 0);
- ``plain``: benchmarks/gpu_peers.py's training loop (the one plain peer every benchmark shares: torchvision's
  model, SGD, channels_last, the same batch and steps) under DDP with the same two options as dlscale's;
- ``plain-torch``: the same plain loop with torch's DDP defaults (buffers re-broadcast at every forward,
  gradients copied into and out of the buckets), what those defaults cost;
- ``alone`` (one rank only): the plain loop with no DDP at all, so ``plain / alone`` is the plain loop's own
  data-parallel efficiency at one rank.

Rank 0 prints one JSON line per round: each variant's images/s over all ranks in the slowest rank's window.
"""

import argparse
import json
import sys

import torch
import torch.distributed as dist

import gpu_peers
from dlscale.config import TrainConfig
from dlscale.distributed.env import detect, init_process_group
from dlscale.distributed.worker import data_parallel_short_test
from dlscale.system import collect_cached


def plain(model: str, img: int, batch: int, warmup: int, steps: int, **how) -> float:
    a = argparse.Namespace(model=model, batch=batch, image_size=img, precision="fp32", channels_last=True,
                           warmup=warmup, steps=steps, **how)
    return gpu_peers.train(a, torch.device("cpu"))["images_per_s"]


def main() -> None:
    model, img, batch, warmup, steps, rounds = sys.argv[1], *map(int, sys.argv[2:7])
    env = detect()
    init_process_group(env, "gloo", "cpu", timeout_s=600)
    cfg = TrainConfig(model=model, image_size=img, batch_size=batch, warmup_steps=warmup, steps=steps, device="cpu",
                      breakdown_steps=0).resolve("cpu")
    system = collect_cached()
    shape = (model, img, batch, warmup, steps)
    variants = {
        "dlscale": lambda: data_parallel_short_test(cfg, torch.device("cpu"), env, system).metrics["throughput"],
        "plain": lambda: plain(*shape, broadcast_buffers=cfg.ddp_broadcast_buffers,
                               bucket_view=cfg.ddp_grad_as_bucket_view),
        "plain-torch": lambda: plain(*shape, broadcast_buffers=True, bucket_view=False),
    }
    if env.world_size == 1:
        variants["alone"] = lambda: plain(*shape, broadcast_buffers=True, bucket_view=False, alone=True)
    names = list(variants)
    for r in range(rounds):
        got = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            dist.barrier()
            got[name] = variants[name]()
        if env.rank == 0:
            print(json.dumps({"round": r + 1, "ranks": env.world_size, **got}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
