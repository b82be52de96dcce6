"""FLOPs per sample, counted (not estimated) with torch.utils.flop_counter on the meta device.

The count runs the model's forward (and backward) on meta tensors of the run's exact shape:
no memory, no arithmetic, just the operator shapes. FlopCounterMode counts matmul-like and
convolution operators at 2 FLOPs per multiply-accumulate; element-wise ops are not counted.
Convolution backward is counted by ``conv_backward_flops`` (torch 2.14's own formula leaves the
groups out of the weight gradient, counting a depthwise convolution's backward ``groups`` times).
"""

from __future__ import annotations

from typing import Any


def conv_backward_flops(grad_out_shape: list[int], x_shape: list[int], w_shape: list[int], *_args: Any,
                        transposed: bool = False, output_mask: tuple[bool, ...] = (True, True), **_kw: Any) -> int:
    """FLOPs of ``aten.convolution_backward``: each gradient asked for costs what the forward did.

    grad_input is a transposed convolution of grad_out with the same weight, and grad_weight a
    convolution of the input with grad_out, each with the forward's multiply-accumulates:
    batch x (output positions; input positions if transposed) x weight elements, where the weight
    (Cout x Cin/groups x k...) already divides by the groups. torch 2.14's own formula leaves the
    groups out of grad_weight, counting a depthwise convolution's backward ``groups`` times over.
    """
    from math import prod

    spatial = x_shape[2:] if transposed else grad_out_shape[2:]
    macs = x_shape[0] * prod(spatial) * prod(w_shape)
    return 2 * macs * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _conv_backward_formula(grad_out_shape: list[int], x_shape: list[int], w_shape: list[int], _bias: Any,
                           _stride: Any, _padding: Any, _dilation: Any, transposed: bool, _output_padding: Any,
                           _groups: int, output_mask: Any, out_shape: Any = None, **_kw: Any) -> int:
    """``conv_backward_flops`` in the argument order FlopCounterMode calls formulas with."""
    return conv_backward_flops(grad_out_shape, x_shape, w_shape, transposed=transposed, output_mask=output_mask)


def counter(**kw: Any) -> Any:
    """A ``FlopCounterMode`` whose convolution backward counts grouped convolutions right."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_formula},
                           **kw)


def count_flops(build_model, make_input, forward_loss, batch_size: int) -> dict[str, float]:
    """Forward and forward+backward FLOPs per sample for a model built by ``build_model()``.

    ``forward_loss(model, x, y)`` runs the forward pass and returns the loss; the forward count
    is the same call under ``no_grad`` (so a loss the model computes itself is in both counts).
    """
    import torch
    with torch.device("meta"):
        model = build_model()
    model.train()
    x, y = make_input(batch_size, "meta")
    with counter() as fwd, torch.no_grad():
        forward_loss(model, x, y)
    with counter() as train:
        forward_loss(model, x, y).backward()
    return {
        "forward": fwd.get_total_flops() / batch_size,
        "train": train.get_total_flops() / batch_size,
    }

