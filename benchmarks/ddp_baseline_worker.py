"""A hand-written torchrun + DDP training loop: the baseline dlscale's data-parallel short test is compared with.

Run by benchmarks/ddp_overhead.py as `torchrun --nproc-per-node 2 benchmarks/ddp_baseline_worker.py MODEL IMG BATCH WARMUP STEPS`.
Synthetic device-resident batch, SGD with momentum, channels_last (dlscale's CPU default), default DDP hook.
Rank 0 prints one JSON line: global throughput over the slowest rank's window.
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale import workloads


def main() -> None:
    model_name, img, batch, warmup, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo")
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
    if dist.get_rank() == 0:
        print(json.dumps({"throughput": world * batch * steps / window.item()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
