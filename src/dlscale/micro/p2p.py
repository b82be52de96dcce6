"""GPU-to-GPU bandwidth and latency matrices, as NVIDIA's p2pBandwidthLatencyTest prints them.

For every ordered pair (i, j) of GPUs: unidirectional bandwidth (a buffer copied i -> j),
bidirectional bandwidth (i -> j and j -> i at once on two streams, both buffers counted) and
latency (a 4-byte copy), in two modes: ``peer_access`` "enabled" (a direct device-to-device copy,
with peer access switched on for the pair first) and "disabled" (the copy staged through pinned
host memory by dlscale). The diagonal is a copy within one device. Needs >= 2 GPUs.

Peer access is not assumed: ``torch.cuda.can_device_access_peer(i, j)`` is asked for every pair
(the ``peer_access`` matrix of the record, 1 on the diagonal as p2pBandwidthLatencyTest prints
it), and every row says which ``path`` its copy took: "p2p" (peer access on and available: the
copy goes over NVLink or PCIe peer-to-peer), "host-staged" (the disabled mode, or a pair without
peer access: the driver then stages the "direct" copy through host memory itself, so it is not
called P2P) or "local" (the diagonal).
"""

from __future__ import annotations

from typing import Any

from dlscale.micro.base import Case, MicroOptions, Plan

name = "p2p"
title = "GPU-GPU unidirectional/bidirectional bandwidth and latency matrices, peer access on and off"
columns = ("test", "peer_access", "src", "dst", "path")
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


def peer_access(n: int) -> list[list[bool]]:
    """``torch.cuda.can_device_access_peer(i, j)`` for every ordered pair (row i = src, column j = dst).

    The diagonal is True: a device always reaches its own memory (p2pBandwidthLatencyTest prints 1).
    """
    import torch

    return [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]


def copy_path(src: int, dst: int, mode: str, test: str, peer: list[list[bool]]) -> str:
    """What a copy in ``mode`` ("enabled"/"disabled") between ``src`` and ``dst`` goes over.

    "local" within one device; "p2p" where peer access is on and the pair has it (both ways for a
    bidirectional copy); otherwise "host-staged".
    """
    if src == dst:
        return "local"
    direct = peer[src][dst] and (test != "bidirectional" or peer[dst][src])
    return "p2p" if mode == "enabled" and direct else "host-staged"


def enable_peer(src: int, dst: int) -> None:
    """Switch peer access on between two devices, both ways, before anything is timed.

    PyTorch turns peer access on (cudaDeviceEnablePeerAccess) the first time it copies between two
    devices that allow it; a one-element copy each way does that here, outside the timed calls.
    """
    import torch

    a = torch.zeros(1, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.zeros(1, dtype=torch.uint8, device=f"cuda:{dst}")
    b.copy_(a)
    a.copy_(b)
    torch.cuda.synchronize(src)
    torch.cuda.synchronize(dst)


def build_copy(src: int, dst: int, nbytes: int, peer: bool, both_ways: bool, p2p: bool = False):
    """The op to time on device ``src``'s current stream: its end event waits for every copy.

    ``peer``: a direct device-to-device copy (P2P=Enabled; the driver stages it through host
    memory where the pair has no peer access); else dlscale stages it through pinned host memory.
    ``p2p``: the pair has peer access; it is switched on before the op is returned.
    """
    import torch

    if p2p:
        enable_peer(src, dst)
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
            to.copy_(frm, non_blocking=True)  # direct copy: P2P where the pair has peer access
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
    """Every (mode, test, src, dst) case, labelled with the path its copy takes (no copy is made here)."""
    import torch

    out = Plan()
    n = torch.cuda.device_count()
    peer = peer_access(n)
    size = (opts.mem_mib * 2**20) if opts.mem_mib else DEFAULT_BYTES
    for mode in ("enabled", "disabled"):
        for test in TESTS:
            nbytes = LATENCY_BYTES if test == "latency" else size
            moved = nbytes * (2 if test == "bidirectional" else 1)
            for i in range(n):
                for j in range(n):
                    path = copy_path(i, j, mode, test, peer)
                    out.cases.append(Case(
                        labels={"test": test, "peer_access": mode, "src": i, "dst": j, "path": path},
                        build=lambda i=i, j=j, nb=nbytes, d=mode == "enabled", bi=test == "bidirectional",
                        p2p=path == "p2p": build_copy(i, j, nb, d, bi, p2p),
                        bytes=moved, device=torch.device("cuda", i)))
    staged = [(i, j) for i in range(n) for j in range(n) if not peer[i][j]]
    if staged:
        out.notes.append(f"no peer access between {len(staged)} of {n * (n - 1)} ordered GPU pairs "
                         f"({', '.join(f'{i}->{j}' for i, j in staged)}): their P2P=Enabled copies are "
                         "staged through host memory by the driver and are labelled host-staged, not p2p")
    return out


def matrix(rows: list[dict[str, Any]], test: str, peer: str, field: str) -> list[list[Any]]:
    """The N x N matrix of ``field`` for one test and peer-access mode (row = src, column = dst)."""
    sel = [r for r in rows if r["test"] == test and r["peer_access"] == peer]
    n = 1 + max((max(r["src"], r["dst"]) for r in sel), default=-1)
    m: list[list[Any]] = [[None] * n for _ in range(n)]
    for r in sel:
        m[r["src"]][r["dst"]] = r.get(field)
    return m


def peer_access_from_rows(rows: list[dict[str, Any]]) -> list[list[bool | None]]:
    """The peer-access matrix the run found, read back from its unidirectional P2P=Enabled rows'
    paths (None where a row has no path: a record made before paths were labelled)."""
    paths = matrix(rows, "unidirectional", "enabled", "path")
    return [[None if p is None else p in ("p2p", "local") for p in row] for row in paths]


def summarize(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """Off-diagonal means per test and mode, and the peer-access matrix.

    The "peer_enabled" means cover only the pairs whose copy went over P2P (None where no pair
    has peer access); the "peer_disabled" means every off-diagonal pair, staged through host.
    """
    peer = peer_access_from_rows(rows)
    metrics: dict[str, Any] = {"peer_access": peer,
                               "p2p_pairs": sum(1 for i, r in enumerate(peer) for j, x in enumerate(r)
                                                if i != j and x)}
    units: dict[str, str] = {"peer_access": "bool", "p2p_pairs": "ordered pairs"}
    for mode, path in (("enabled", "p2p"), ("disabled", "host-staged")):
        for test, field in (("unidirectional", "gbps"), ("bidirectional", "gbps"), ("latency", "time_us")):
            off = [r[field] for r in rows if r["test"] == test and r["peer_access"] == mode
                   and r["src"] != r["dst"] and r.get("path", path) == path]
            key = {"unidirectional": "uni_gbps", "bidirectional": "bi_gbps", "latency": "latency_us"}[test]
            key = f"{key}_offdiag_mean_peer_{mode}"
            metrics[key] = sum(off) / len(off) if off else None
            units[key] = "GB/s" if field == "gbps" else "us"
    return metrics, units
