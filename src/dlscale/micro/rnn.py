"""Recurrent layers: DeepBench's training RNNs (vanilla, LSTM, GRU), one layer, input size = hidden.

A cell with g gate blocks (vanilla 1, GRU 3, LSTM 4) does, per timestep, an input GEMM
(B x H) x (H x gH) and a recurrent GEMM (B x H) x (H x gH): 4*g*B*H^2 FLOPs; a pass over T
timesteps is 4*g*H^2*B*T (docs/METRICS.md; element-wise gate math is not counted). Forward,
backward-data and backward-weights each perform that many.

- fwd: the layer's forward with autograd recording, as in training.
- bwd_data: the gradient with respect to the input sequence and initial state only (weights
  frozen), through time, from a forward recorded once (``retain_graph``).
- bwd_weights: PyTorch has no call that computes an RNN's weight gradient alone (autograd needs
  the data gradient through time first). dlscale times what a separate weights pass computes
  (cuDNN's BackwardWeights): the gate gradients of all T steps against the stacked layer inputs
  and previous hidden states, dW = dG^T [X, H_prev], one (gH x BT) x (BT x 2H) GEMM.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import UsageError
from dlscale.micro.base import Case, MicroOptions, Plan, size_filter
from dlscale.micro.gemm import dtype_of, pass_summary
from dlscale.micro.shapes import load

name = "rnn"
title = "recurrent layers (DeepBench training RNNs): fwd, bwd_data, bwd_weights TFLOP/s"
columns = ("hidden", "batch", "timesteps", "cell", "pass", "precision")
SHAPE_COLUMNS = ("hidden", "batch", "timesteps", "cell")
GATES = {"vanilla": 1, "gru": 3, "lstm": 4}
PASSES = ("fwd", "bwd_data", "bwd_weights")


def rnn_flops(cell: str, hidden: int, batch: int, timesteps: int) -> int:
    """4*g*H^2*B*T: input and recurrent GEMMs of g gate blocks per timestep (one pass)."""
    if cell not in GATES:
        raise UsageError(f"unknown RNN cell {cell!r}; use one of {', '.join(GATES)}")
    return 4 * GATES[cell] * hidden * hidden * batch * timesteps


def build_rnn(cell: str, hidden: int, batch: int, timesteps: int, which: str, precision: str, device: Any):
    import torch

    dt = dtype_of(precision)
    g = GATES[cell]
    if which == "bwd_weights":
        d_gates = torch.randn(timesteps * batch, g * hidden, device=device).to(dt)
        inputs = torch.randn(timesteps * batch, 2 * hidden, device=device).to(dt)
        d_w = torch.empty(g * hidden, 2 * hidden, device=device, dtype=dt)
        return lambda: torch.matmul(d_gates.t(), inputs, out=d_w)
    layer = {"vanilla": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[cell](hidden, hidden)
    layer = layer.to(device=device, dtype=dt)
    x = torch.randn(timesteps, batch, hidden, device=device).to(dt).requires_grad_(True)
    h0 = torch.zeros(1, batch, hidden, device=device, dtype=dt, requires_grad=True)
    state = (h0, torch.zeros_like(h0, requires_grad=True)) if cell == "lstm" else h0
    if which == "fwd":
        return lambda: layer(x, state)
    layer.requires_grad_(False)
    y, _ = layer(x, state)
    gy = torch.randn_like(y)
    wrt = [x, *(state if isinstance(state, tuple) else (state,))]
    return lambda: torch.autograd.grad(y, wrt, gy, retain_graph=True)


def plan(opts: MicroOptions, device: Any) -> Plan:
    out = Plan()
    for prec in opts.precisions:
        for sh in load("rnn", SHAPE_COLUMNS, opts.shapes):
            h, b, t, cell = sh["hidden"], sh["batch"], sh["timesteps"], str(sh["cell"]).lower()
            fl = rnn_flops(cell, h, b, t)
            for which in PASSES:
                out.cases.append(Case(
                    labels={"hidden": h, "batch": b, "timesteps": t, "cell": cell, "pass": which, "precision": prec},
                    build=lambda h=h, b=b, t=t, cell=cell, which=which, prec=prec:
                        build_rnn(cell, h, b, t, which, prec, device),
                    # bwd_data: autograd runs it on the stream of a forward recorded before, not the capture's
                    flops=fl, precision=prec, capture=which != "bwd_data"))
    out.cases = size_filter(out.cases, opts, device, out.notes, cpu_max_gflop=2.0)
    return out


def summarize(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    return pass_summary(rows, PASSES)
