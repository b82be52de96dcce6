"""Per-rank A/B of dlscale's data-parallel short test against a hand-written DDP loop, alternating in one job.

Started by benchmarks/ddp_overhead.py under torchrun (2 ranks, gloo). Each round runs, in the same
two processes and in alternating order, A: ``dlscale.distributed.worker.data_parallel_short_test``
(exactly what every rank of `dlscale train --nproc-per-node 2` runs: the shared short test, DDP with
dlscale's all-reduce timing hook, the monitor, the gather on rank 0) and B: the loop below, written
as one would by hand (default DDP hook, same model, batch, optimizer, memory format, steps).
Rank 0 prints one JSON line per round.
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale import workloads
from dlscale.config import TrainConfig
from dlscale.distributed.env import detect, init_process_group
from dlscale.distributed.worker import data_parallel_short_test
from dlscale.system import collect_cached


def hand_written(model_name: str, img: int, batch: int, warmup: int, steps: int) -> float:
    world = dist.get_world_size()
    w = workloads.get(model_name)
    torch.manual_seed(0)
    model = DDP(w.build().to(memory_format=torch.channels_last))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, img, img).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, w.num_classes, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    window = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(window, op=dist.ReduceOp.MAX)
    return world * batch * steps / window.item()


def main() -> None:
    model, img, batch, warmup, steps, rounds = sys.argv[1], *map(int, sys.argv[2:7])
    env = detect()
    init_process_group(env, "gloo", "cpu", timeout_s=600)
    cfg = TrainConfig(model=model, image_size=img, batch_size=batch, warmup_steps=warmup, steps=steps, device="cpu",
                      breakdown_steps=0).resolve("cpu")
    system = collect_cached()
    for r in range(rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        got = {}
        for which in order:
            dist.barrier()
            if which == "a":
                got["a"] = data_parallel_short_test(cfg, torch.device("cpu"), env, system).metrics["throughput"]
            else:
                got["b"] = hand_written(model, img, batch, warmup, steps)
        if env.rank == 0:
            print(json.dumps({"round": r + 1, "dlscale": got["a"], "hand_written": got["b"]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
