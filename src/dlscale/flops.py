"""FLOPs per sample, counted (not estimated) with torch.utils.flop_counter on the meta device.

The count runs the model's forward (and backward) on meta tensors of the run's exact shape:
no memory, no arithmetic, just the operator shapes. FlopCounterMode counts matmul-like and
convolution operators at 2 FLOPs per multiply-accumulate; element-wise ops are not counted.
"""

from __future__ import annotations

from typing import Any


def count_flops(build_model, make_input, loss_fn, batch_size: int) -> dict[str, float]:
    """Forward and forward+backward FLOPs per sample for a model built by ``build_model()``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_model()
    model.train()
    x, y = make_input(batch_size, "meta")
    with FlopCounterMode(display=False) as fwd:
        model(x)
    with FlopCounterMode(display=False) as train:
        loss_fn(model(x), y).backward()
    return {
        "forward": fwd.get_total_flops() / batch_size,
        "train": train.get_total_flops() / batch_size,
    }


def workload_flops(workload: Any, image_size: int, batch_size: int = 2) -> dict[str, float]:
    """FLOPs per sample of a registered workload at an image size (batch-size independent)."""
    return count_flops(
        workload.build,
        lambda b, dev: workload.make_batch(b, image_size, dev),
        workload.loss,
        batch_size,
    )
