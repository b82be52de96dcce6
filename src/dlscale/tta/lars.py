"""LARS: layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017), as MLPerf's ResNet uses it.

For each parameter tensor ``w`` with gradient ``g``, weight decay ``wd``, trust coefficient
``eta`` and epsilon ``eps``:

    g' = g + wd * w
    trust = eta * |w| / (|g| + wd * |w| + eps)     (1 where |w| or |g| is 0)
    v = momentum * v + lr * trust * g'
    w = w - v

Biases and batch-norm parameters (tensors of one dimension) are excluded, as in the MLPerf
reference: plain momentum SGD with no weight decay and no trust ratio.
"""

from __future__ import annotations

from typing import Any


def make_lars(params: Any, lr: float, momentum: float = 0.9, weight_decay: float = 1e-4,
              eta: float = 0.001, eps: float = 0.0):
    """A LARS optimizer over ``params`` (an iterable of tensors or of param-group dicts)."""
    import torch

    class LARS(torch.optim.Optimizer):
        def __init__(self, params: Any):
            if lr <= 0 or momentum < 0 or weight_decay < 0 or eta <= 0 or eps < 0:
                raise ValueError("LARS needs lr > 0, momentum >= 0, weight_decay >= 0, eta > 0, eps >= 0")
            super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, eps=eps))

        @torch.no_grad()
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            for group in self.param_groups:
                for w in group["params"]:
                    if w.grad is None:
                        continue
                    g = w.grad
                    if w.ndim > 1:
                        wd = group["weight_decay"]
                        w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
                        trust = torch.where(
                            (w_norm > 0) & (g_norm > 0),
                            group["eta"] * w_norm / (g_norm + wd * w_norm + group["eps"]),
                            torch.ones_like(w_norm),
                        )
                        g = (g + wd * w) * trust
                    state = self.state[w]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = torch.zeros_like(w)
                    buf.mul_(group["momentum"]).add_(g, alpha=group["lr"])
                    w.sub_(buf)
            return loss

    return LARS(params)
