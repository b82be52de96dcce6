"""Convolution: DeepBench's training convolutions, forward, backward-data and backward-weights.

Every pass does the same multiply-adds: 2*N*K*P*Q*C*R*S FLOPs, with P x Q the output size.
The backward passes call ``aten.convolution_backward`` with an output mask, so each times the
one kernel it names (the input gradient, or the weight gradient), as cuDNN's
BackwardData/BackwardFilter do.
"""

from __future__ import annotations

from typing import Any

from dlscale.harness.device import default_channels_last
from dlscale.micro.base import Case, MicroOptions, Plan, size_filter
from dlscale.micro.gemm import dtype_of, pass_summary
from dlscale.micro.shapes import load

name = "conv"
title = "2-D convolution (DeepBench training shapes): fwd, bwd_data, bwd_weights TFLOP/s"
columns = ("w", "h", "c", "n", "k", "s", "r", "pad_w", "pad_h", "stride_w", "stride_h", "pass", "precision")
SHAPE_COLUMNS = columns[:11]
PASSES = ("fwd", "bwd_data", "bwd_weights")


def output_size(h: int, w: int, r: int, s: int, pad_h: int, pad_w: int, stride_h: int, stride_w: int) -> tuple[int, int]:
    """P = (H + 2 pad_h - R) // stride_h + 1, Q likewise over W, S."""
    return (h + 2 * pad_h - r) // stride_h + 1, (w + 2 * pad_w - s) // stride_w + 1


def conv_flops(n: int, c: int, h: int, w: int, k: int, r: int, s: int, pad_h: int, pad_w: int,
               stride_h: int, stride_w: int) -> int:
    """2*N*K*P*Q*C*R*S: one multiply-add per output element per filter tap per input channel."""
    p, q = output_size(h, w, r, s, pad_h, pad_w, stride_h, stride_w)
    return 2 * n * k * p * q * c * r * s


def build_conv(sh: dict[str, int], which: str, precision: str, channels_last: bool, device: Any):
    import torch
    import torch.nn.functional as F

    dt = dtype_of(precision)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    stride, pad = (sh["stride_h"], sh["stride_w"]), (sh["pad_h"], sh["pad_w"])
    x = torch.randn(sh["n"], sh["c"], sh["h"], sh["w"], device=device).to(dt).contiguous(memory_format=fmt)
    wt = torch.randn(sh["k"], sh["c"], sh["r"], sh["s"], device=device).to(dt).contiguous(memory_format=fmt)
    if which == "fwd":
        return lambda: F.conv2d(x, wt, None, stride, pad)
    p, q = output_size(sh["h"], sh["w"], sh["r"], sh["s"], sh["pad_h"], sh["pad_w"], sh["stride_h"], sh["stride_w"])
    gy = torch.randn(sh["n"], sh["k"], p, q, device=device).to(dt).contiguous(memory_format=fmt)
    mask = [which == "bwd_data", which == "bwd_weights", False]
    backward = torch.ops.aten.convolution_backward
    return lambda: backward(gy, x, wt, None, stride, pad, (1, 1), False, (0, 0), 1, mask)


def plan(opts: MicroOptions, device: Any) -> Plan:
    out = Plan()
    for prec in opts.precisions:
        cl = opts.channels_last
        if cl is None:
            cl = default_channels_last(device.type, prec)
        for sh in load("conv", SHAPE_COLUMNS, opts.shapes):
            fl = conv_flops(sh["n"], sh["c"], sh["h"], sh["w"], sh["k"], sh["r"], sh["s"], sh["pad_h"],
                            sh["pad_w"], sh["stride_h"], sh["stride_w"])
            for which in PASSES:
                out.cases.append(Case(
                    labels={**sh, "pass": which, "precision": prec, "layout": "NHWC" if cl else "NCHW"},
                    build=lambda sh=sh, which=which, prec=prec, cl=cl: build_conv(sh, which, prec, cl, device),
                    flops=fl, precision=prec, capture=True))
    out.cases = size_filter(out.cases, opts, device, out.notes)
    return out


def summarize(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    return pass_summary(rows, PASSES)
