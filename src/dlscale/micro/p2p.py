"""GPU-to-GPU bandwidth and latency matrices, as NVIDIA's p2pBandwidthLatencyTest prints them.

For every ordered pair (i, j) of GPUs: unidirectional bandwidth (a buffer copied i -> j),
bidirectional bandwidth (i -> j and j -> i at once on two streams, both buffers counted) and
latency (a 4-byte copy), with peer access enabled (a direct copy; PyTorch enables peer access
between the two devices where the hardware allows it) and disabled (the copy staged through
pinned host memory, which is what the driver does for a peer copy when peer access is off).
The diagonal is a copy within one device. Needs >= 2 GPUs.
"""

from __future__ import annotations

from typing import Any

from dlscale.micro.base import Case, MicroOptions, Plan

name = "p2p"
title = "GPU-GPU unidirectional/bidirectional bandwidth and latency matrices, peer access on and off"
columns = ("test", "peer_access", "src", "dst")
DEFAULT_BYTES = 40_000_000  # p2pBandwidthLatencyTest's buffer: 10M int32
LATENCY_BYTES = 4
TESTS = ("unidirectional", "bidirectional", "latency")


def unavailable() -> str | None:
    """Why p2p cannot run here, or None when it can."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        return f"dlscale micro p2p needs at least 2 GPUs; this machine has {n}: nothing to measure"
    return None


def build_copy(src: int, dst: int, nbytes: int, peer: bool, both_ways: bool):
    """The op to time on device ``src``'s current stream: its end event waits for every copy."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    b_back = torch.empty_like(b) if both_ways else None  # on dst: the j -> i source
    a_back = torch.empty_like(a) if both_ways else None  # on src: the j -> i target
    staging = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) if not peer else None
    staging_back = torch.empty_like(staging) if (both_ways and not peer) else None
    # The reverse copy runs on a second stream on each device: a cross-device copy_ is ordered
    # with the current streams of both devices, so on the main streams the two would serialise.
    side_src, side_dst = torch.cuda.Stream(device=f"cuda:{src}"), torch.cuda.Stream(device=f"cuda:{dst}")

    def one_way(frm, to, stage) -> None:
        if stage is None:
            to.copy_(frm, non_blocking=True)  # peer copy (P2P where the devices allow it)
            return
        frm_stream, to_stream = torch.cuda.current_stream(frm.device), torch.cuda.current_stream(to.device)
        stage.copy_(frm, non_blocking=True)  # device -> pinned host
        to_stream.wait_stream(frm_stream)
        to.copy_(stage, non_blocking=True)  # pinned host -> device, after the first half
        frm_stream.wait_stream(to_stream)

    def op() -> None:
        main = torch.cuda.current_stream(src)
        if not both_ways:
            one_way(a, b, staging)
            return
        side_src.wait_stream(main)  # both directions start after the start event
        side_dst.wait_stream(main)
        one_way(a, b, staging)
        with torch.cuda.stream(side_src), torch.cuda.stream(side_dst):
            one_way(b_back, a_back, staging_back)
        main.wait_stream(side_src)  # the end event on the main stream waits for both
        main.wait_stream(side_dst)

    return op


def plan(opts: MicroOptions, device: Any) -> Plan:
    import torch

    out = Plan()
    n = torch.cuda.device_count()
    size = (opts.mem_mib * 2**20) if opts.mem_mib else DEFAULT_BYTES
    for peer in (True, False):
        for test in TESTS:
            nbytes = LATENCY_BYTES if test == "latency" else size
            moved = nbytes * (2 if test == "bidirectional" else 1)
            for i in range(n):
                for j in range(n):
                    out.cases.append(Case(
                        labels={"test": test, "peer_access": "enabled" if peer else "disabled", "src": i, "dst": j},
                        build=lambda i=i, j=j, nb=nbytes, peer=peer, bi=test == "bidirectional":
                            build_copy(i, j, nb, peer, bi),
                        bytes=moved, device=torch.device("cuda", i)))
    return out


def matrix(rows: list[dict[str, Any]], test: str, peer: str, field: str) -> list[list[float | None]]:
    """The N x N matrix of ``field`` for one test and peer-access mode (row = src, column = dst)."""
    sel = [r for r in rows if r["test"] == test and r["peer_access"] == peer]
    n = 1 + max((max(r["src"], r["dst"]) for r in sel), default=-1)
    m: list[list[float | None]] = [[None] * n for _ in range(n)]
    for r in sel:
        m[r["src"]][r["dst"]] = r[field]
    return m


def summarize(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    for peer in ("enabled", "disabled"):
        for test, field in (("unidirectional", "gbps"), ("bidirectional", "gbps"), ("latency", "time_us")):
            off = [r[field] for r in rows if r["test"] == test and r["peer_access"] == peer and r["src"] != r["dst"]]
            key = {"unidirectional": "uni_gbps", "bidirectional": "bi_gbps", "latency": "latency_us"}[test]
            key = f"{key}_offdiag_mean_peer_{peer}"
            metrics[key] = sum(off) / len(off) if off else None
            units[key] = "GB/s" if field == "gbps" else "us"
    return metrics, units
