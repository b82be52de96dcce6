"""Phase-1 microbenchmarks: kernels against the device's peak, memory and interconnect bandwidth,
collectives. One harness (``harness``), one small module per microbenchmark, found by name here.

``collectives``, ``links`` and ``burnin`` are not kernel kinds: they run one process per rank under
torchrun (``dlscale.micro.coll_worker``, ``link_worker``, ``burn_worker``) and have their own options
(``dlscale.micro.collectives``, ``links``, ``burnin``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from dlscale.errors import UsageError

KERNEL_KINDS = ("gemm", "conv", "rnn", "memory", "p2p")
KINDS = (*KERNEL_KINDS, "collectives", "links", "burnin")


def get(kind: str) -> Any:
    """The module of a kernel/memory/p2p microbenchmark (it satisfies ``base.Microbench``)."""
    if kind not in KERNEL_KINDS:
        raise UsageError(f"unknown microbenchmark {kind!r}; choose one of {', '.join(KINDS)}, all")
    return import_module(f"dlscale.micro.{kind}")
