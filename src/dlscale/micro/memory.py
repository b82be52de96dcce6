"""Memory bandwidth: main memory (STREAM's copy, scale, add, triad) and, with a GPU, the transfers
host->device and device->host (pinned and pageable) and device->device.

STREAM counts the bytes a kernel must read and write: copy c=a and scale b=q*c move 2 arrays,
add c=a+b and triad a=b+q*c move 3 (docs/METRICS.md). Each array is float64 and, by STREAM's
rule, at least 4x the last-level cache, so the figure is memory's and not a cache's. GPU copies
count the buffer once for H2D/D2H and twice for D2D (read and write, as CUDA's bandwidthTest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.micro.base import Case, MicroOptions, Plan, run_devices
from dlscale.micro.node import at_once_sums

name = "memory"
title = "memory bandwidth: STREAM copy/scale/add/triad; H2D, D2H (pinned, pageable), D2D on GPUs"
columns = ("op", "where", "array_mib")
STREAM_ARRAYS = {"copy": 2, "scale": 2, "add": 3, "triad": 3}  # arrays read + written per element
GPU_MIB = 256
# every_device: the copies each GPU makes in its own memory run on all GPUs at once (the node's load);
# the host transfers run one GPU at a time, each over its own link, as their healthy figures are measured
AT_ONCE = {"d2d": ("memory", "d2d")}
SCALAR = 3.0


def stream_bytes(op: str, n: int, itemsize: int = 8) -> int:
    """Bytes STREAM counts for one call of ``op`` over n elements."""
    return STREAM_ARRAYS[op] * n * itemsize


def last_level_cache_bytes() -> int | None:
    """The largest cache's size from sysfs (e.g. '105 MiB' -> bytes), or None."""
    best = None
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMGB").strip()
        if digits.isdigit():
            best = max(best or 0, int(digits) * mult)
    return best


def default_array_mib() -> int:
    """STREAM's rule: each array at least 4x the last-level cache (64 MiB if unknown), power of 2."""
    llc = last_level_cache_bytes() or 16 * 2**20
    need = max(64, -(-4 * llc // 2**20))
    return 1 << (need - 1).bit_length()


def build_stream(op: str, n: int):
    import torch

    a = torch.full((n,), 1.0, dtype=torch.float64)
    b = torch.full((n,), 2.0, dtype=torch.float64)
    c = torch.zeros(n, dtype=torch.float64)
    return {
        "copy": lambda: c.copy_(a),
        "scale": lambda: torch.mul(c, SCALAR, out=b),
        "add": lambda: torch.add(a, b, out=c),
        "triad": lambda: torch.add(b, c, alpha=SCALAR, out=a),
    }[op]


def build_transfer(kind: str, nbytes: int, device: Any):
    import torch

    if kind == "d2d":
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src, non_blocking=True)
    pinned = kind.endswith("pinned")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if kind.startswith("h2d"):
        return lambda: dev.copy_(host, non_blocking=pinned)
    return lambda: host.copy_(dev, non_blocking=pinned)


def plan(opts: MicroOptions, device: Any) -> Plan:
    from dlscale.harness.device import select_device

    out = Plan()
    mib = opts.mem_mib or default_array_mib()
    n = mib * 2**20 // 8
    cpu = select_device("cpu")
    for op in STREAM_ARRAYS:
        out.cases.append(Case(labels={"op": op, "where": "host memory", "array_mib": mib},
                              build=lambda op=op: build_stream(op, n), bytes=stream_bytes(op, n), device=cpu))
    if device.type == "cuda":
        nbytes = (opts.mem_mib or GPU_MIB) * 2**20
        for where in run_devices(opts, device):  # every_device: every GPU's transfers
            for kind, nb in (("h2d_pinned", nbytes), ("h2d_pageable", nbytes), ("d2h_pinned", nbytes),
                             ("d2h_pageable", nbytes), ("d2d", 2 * nbytes)):
                out.cases.append(Case(labels={"op": kind, "where": str(where), "array_mib": nbytes // 2**20},
                                      build=lambda kind=kind, where=where: build_transfer(kind, nbytes, where),
                                      bytes=nb, device=where, group=AT_ONCE.get(kind) if opts.every_device else None))
    return out


def summarize(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each op's GB/s (the first device's where several were measured) and, with several devices,
    each device's figure of each transfer op, aligned with ``devices``."""
    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    for r in rows:
        key = f"{r['op']}_gbps"
        if key not in metrics:
            metrics[key] = r["gbps"]
            metrics[f"{r['op']}_gbps_best"] = r["gbps_best"]
            units[key] = units[f"{r['op']}_gbps_best"] = "GB/s"
    devices = list(dict.fromkeys(r["where"] for r in rows if r["where"] != "host memory"))
    if len(devices) > 1:
        metrics["devices"] = devices
        units["devices"] = "devices"
        for op in dict.fromkeys(r["op"] for r in rows if r["where"] != "host memory"):
            by = {r["where"]: r["gbps"] for r in rows if r["op"] == op}
            metrics[f"{op}_gbps_by_device"] = [by.get(d) for d in devices]
            units[f"{op}_gbps_by_device"] = "GB/s"
    for (op,), total in at_once_sums(rows, ("op",), "gbps").items():  # every GPU at once: the node's sum
        metrics[f"{op}_gbps_node"] = total
        units[f"{op}_gbps_node"] = "GB/s"
    return metrics, units
