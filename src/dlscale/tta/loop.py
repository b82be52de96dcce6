"""One training epoch and one evaluation pass: the loop body of a time-to-accuracy run.

Neither synchronises the device per step: the training loss is summed on the device and read
once at the end of the epoch; evaluation counts correct top-1/top-5 predictions on the device.
A distributed caller passes ``all_reduce`` (a sum over ranks) so every rank ends with the
counts over the whole validation set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class EpochResult:
    steps: int
    samples: int  # on this rank
    loss_mean: float  # mean training loss over this rank's steps


@dataclass
class EvalResult:
    top1: float  # fractions over the whole validation set (all ranks)
    top5: float
    loss: float  # mean cross-entropy (nats), without label smoothing
    samples: int


def train_epoch(model: Any, opt: Any, batches: Iterable[tuple[Any, Any]], device: Any, lr_at: Callable[[int], float],
                first_step: int, label_smoothing: float, amp_dtype: Any, channels_last: bool) -> EpochResult:
    """Train over ``batches``; the LR of global step ``first_step + i`` is ``lr_at(first_step + i)``."""
    import torch
    import torch.nn.functional as F

    from dlscale.harness.runner import NonFiniteLoss

    model.train()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    loss_sum = torch.zeros((), device=device)
    steps = samples = 0
    for x, y in batches:
        x = x.to(device, non_blocking=True).contiguous(memory_format=fmt)
        y = y.to(device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(first_step + steps)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            out = model(x)
        loss = F.cross_entropy(out.float(), y, label_smoothing=label_smoothing)
        loss.backward()
        opt.step()
        loss_sum += loss.detach()
        steps += 1
        samples += len(y)
    if steps == 0:
        raise RuntimeError("the training split gave no batch: fewer images than one batch per rank")
    mean = (loss_sum / steps).item()
    if mean != mean or mean in (float("inf"), float("-inf")):
        raise NonFiniteLoss(f"training loss became {mean} in the epoch starting at step {first_step}")
    return EpochResult(steps=steps, samples=samples, loss_mean=mean)


def evaluate(model: Any, batches: Iterable[tuple[Any, Any]], device: Any, limit: int, amp_dtype: Any,
             channels_last: bool, all_reduce: Callable[[Any], None] | None = None) -> EvalResult:
    """Top-1/top-5 accuracy and loss over this rank's first ``limit`` samples, summed over ranks.

    ``limit`` drops the samples a sharding sampler repeats to even out the shards, so each
    validation image counts exactly once.
    """
    import torch
    import torch.nn.functional as F

    model.eval()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # top-1 correct, top-5 correct, loss sum, n
    seen = 0
    with torch.no_grad():
        for x, y in batches:
            take = min(len(y), limit - seen)
            if take <= 0:
                break
            x = x[:take].to(device, non_blocking=True).contiguous(memory_format=fmt)
            y = y[:take].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                out = model(x)
            out = out.float()
            k = min(5, out.shape[1])
            topk = out.topk(k, dim=1).indices
            hit = topk.eq(y.unsqueeze(1))
            sums += torch.stack([
                hit[:, 0].sum().double(), hit.any(dim=1).sum().double(),
                F.cross_entropy(out, y, reduction="sum").double(),
                torch.tensor(float(take), dtype=torch.float64, device=device),
            ])
            seen += take
    if all_reduce is not None:
        all_reduce(sums)
    c1, c5, loss_sum, n = sums.tolist()
    if n == 0:
        raise RuntimeError("the validation split is empty")
    return EvalResult(top1=c1 / n, top5=c5 / n, loss=loss_sum / n, samples=int(n))
