"""Link models for prediction: the alpha-beta cost of a ring all-reduce, per link level.

A ring all-reduce of ``S`` bytes over ``p`` ranks takes ``2(p-1)`` steps (reduce-scatter, then
all-gather); each step sends ``S/p`` bytes to the next rank, so

    T(S) = 2(p-1) * alpha + 2(p-1)/p * S / bandwidth

with ``alpha`` the latency of one step's message and ``bandwidth`` the bytes/s one rank sends in
one direction. Where a node's topology gives a ring of fewer GPUs fewer links (a DGX-1's hybrid
cube-mesh), ``ring_bandwidth`` holds the rate per ring size. A ``Link`` holds (alpha, bandwidth)
and where they came from: a datasheet row
(``DATASHEET``, ``link``), a tc-shaped emulated link (``link("1gbit")``), or a fit to the
all_reduce timings of a ``dlscale micro collectives`` record (``from_collectives``,
``find_measured``). docs/METRICS.md derives every figure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.errors import UsageError
from dlscale.nvlink import GENERATIONS

LEVELS = ("intra", "inter")
GB = 1e9

FIT_KEYS = ("run_id", "ranks", "points", "r2", "sizes")
ALL_REDUCE_HINT = "dlscale micro collectives --ops all_reduce --sizes 64K:64M"


@dataclass(frozen=True)
class Link:
    """One link level's alpha-beta parameters and their provenance."""

    name: str  # "pcie-gen4-x16", "nvlink4", "ib-ndr", "emulated 1gbit", "measured <run_id> (...)"
    alpha_s: float  # latency of one ring step's message, seconds
    bandwidth: float  # bytes/s one rank can send in one direction over this link
    source: str  # the datasheet/specification (document + year) or the run it was fitted from
    fit: dict[str, Any] | None = field(default=None, compare=False)  # fitted links: FIT_KEYS (+ times_s)
    ring_bandwidth: dict[int, float] | None = field(default=None, compare=False)  # ring's GPUs -> B/s (None: any)

    def __post_init__(self) -> None:
        if not self.name or not self.source:
            raise UsageError("a link needs a name and a source; give both (e.g. the datasheet it comes from)")
        if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
            raise UsageError(f"link {self.name!r}: alpha_s must be a finite number >= 0 seconds, got {self.alpha_s}")
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise UsageError(f"link {self.name!r}: bandwidth must be a finite number > 0 bytes/s, "
                             f"got {self.bandwidth}")
        for ranks, bw in (self.ring_bandwidth or {}).items():
            if not (isinstance(ranks, int) and ranks >= 2 and math.isfinite(bw) and bw > 0):
                raise UsageError(f"link {self.name!r}: ring_bandwidth maps 2 or more GPUs to a finite rate > 0 "
                                 f"bytes/s, got {ranks}: {bw}")

    def bandwidth_for(self, ranks: int) -> float:
        """Bytes/s one rank sends in a ring over ``ranks`` GPUs of one node on this link."""
        if not self.ring_bandwidth or ranks < 2:
            return self.bandwidth
        if ranks not in self.ring_bandwidth:
            known = ", ".join(str(k) for k in sorted(self.ring_bandwidth))
            raise UsageError(f"link {self.name}: its topology gives a ring rate for {known} GPUs per node, not "
                             f"{ranks}; give --intra as a rate or a measured link for {ranks} GPUs per node")
        return self.ring_bandwidth[ranks]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for a record's config."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Link":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"link fields {sorted(unknown)} are unknown; a link has name, alpha_s, bandwidth, "
                             "source, fit and ring_bandwidth")
        fit, rings = d.get("fit"), d.get("ring_bandwidth")
        return cls(name=d["name"], alpha_s=float(d["alpha_s"]), bandwidth=float(d["bandwidth"]),
                   source=d["source"], fit=dict(fit) if fit is not None else None,
                   ring_bandwidth={int(k): float(v) for k, v in rings.items()} if rings else None)


def ring_allreduce_s(link: Link, nbytes: float, ranks: int) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``ranks`` ranks on ``link``; 0 for one rank."""
    if ranks < 1 or nbytes < 0:
        raise UsageError(f"ring all-reduce needs ranks >= 1 and bytes >= 0, got {ranks} ranks, {nbytes} bytes")
    if ranks == 1:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps * link.alpha_s + steps / ranks * nbytes / link.bandwidth_for(ranks)


# -- datasheet links --------------------------------------------------------------------------

def _pcie_x16(gts: float) -> float:
    """Bytes/s per direction of a x16 link at ``gts`` GT/s with 128b/130b encoding (Gen3 and later)."""
    return gts * 1e9 * 16 / 8 * 128 / 130


# What of a tc rate a TCP stream carries: the emulated nodes' veth has Linux's default MTU of 1500 bytes;
# each segment carries IPv4's 20-byte header (RFC 791), TCP's 20 (RFC 793) and the timestamps option Linux
# sends by default (net.ipv4.tcp_timestamps=1; RFC 7323: 10 bytes, padded to 12), so 1448 bytes of payload;
# tbf counts the frame with its 14-byte Ethernet header (what the qdisc sees on egress), 1514 bytes.
TCP_MSS, TCP_FRAME = 1500 - 20 - 20 - 12, 1500 + 14
TCP_PAYLOAD_SHARE = TCP_MSS / TCP_FRAME

_TYPICAL_P2P = ("alpha 5 us is a typical order of magnitude for GPU peer-to-peer message latency "
                "(a few us), not a datasheet value")
_TYPICAL_IB = "alpha 1 us is the typical MPI latency quoted in vendor material (~1 us), not a datasheet value"
_TYPICAL_TCP = "alpha 25 us is a typical order of magnitude for TCP over Ethernet (tens of us), not a datasheet value"


def _pcie(gen: int, gts: int, spec: str) -> Link:
    bw = _pcie_x16(gts)
    return Link(f"pcie-gen{gen}-x16", 5e-6, bw,
                f"{spec}: {gts} GT/s per lane x 16 lanes / 8 bit per byte x 128/130 (128b/130b encoding) "
                f"= {bw / GB:.2f} GB/s per direction; {_TYPICAL_P2P}")


def _nvlink(name: str, links: int, gpu: str, sheet: str, total: int, generation: int) -> Link:
    per_link = GENERATIONS[generation].gbps
    bw = links * per_link * GB
    return Link(name, 5e-6, bw,
                f"{sheet}: NVLink {total} GB/s per GPU (both directions) = {links} links x {per_link:g} GB/s "
                f"= {bw / GB:.0f} GB/s per direction, all of the {gpu}'s links (a ring over any GPUs of the node "
                f"reaches them through NVSwitch); {_TYPICAL_P2P}")


# NVLink connections between the eight V100s of a DGX-1 (hybrid cube-mesh), as `nvidia-smi topo -m` prints them
# there (NV1/NV2): each GPU has six, to four neighbours. Pairs not listed have none.
DGX1_NVLINKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
                (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}
DGX1_RINGS = (2, 3, 4, 8)  # GPUs per node whose first GPUs (0..g-1) have rings reaching every link bound below


def links_within(gpus: range, nvlinks: dict[tuple[int, int], int] = DGX1_NVLINKS) -> int:
    """The fewest NVLink connections any of ``gpus`` has to the others: a ring over them can send no faster."""
    return min(sum(n for pair, n in nvlinks.items() if g in pair and set(pair) <= set(gpus)) for g in gpus)


def _nvlink_cube_mesh() -> Link:
    rings = {g: links_within(range(g)) * GENERATIONS[2].gbps * GB for g in DGX1_RINGS}
    per = ", ".join(f"{g} GPUs {bw / GB:.0f} GB/s" for g, bw in rings.items())
    return Link("nvlink2", 5e-6, rings[8],
                "NVIDIA Tesla V100 GPU Accelerator datasheet (2018): 6 NVLinks x 25 GB/s per direction; NVIDIA DGX-1 "
                "with Tesla V100 system architecture (2017): a hybrid cube-mesh, 'three interwoven rings of single "
                "NVLink connections' over the eight GPUs, so a ring over GPUs 0..g-1 reaches only the links among "
                f"them: {per} per direction (the fewest links any of them has to the others x 25 GB/s; rings "
                f"reaching it exist for these g, not for 5-7); {_TYPICAL_P2P}", ring_bandwidth=rings)


def _ib(gen: str, gbit: int) -> Link:
    return Link(f"ib-{gen.lower()}", 1e-6, gbit * 1e9 / 8,
                f"InfiniBand Trade Association roadmap: 4x {gen} {gbit} Gb/s data rate / 8 "
                f"= {gbit / 8:g} GB/s per direction; {_TYPICAL_IB}")


def _eth(gbit: int, standard: str) -> Link:
    return Link(f"{gbit}gbe", 25e-6, gbit * 1e9 / 8,
                f"{standard}: {gbit} Gb/s MAC data rate / 8 = {gbit / 8:g} GB/s per direction "
                f"(before TCP/IP framing); {_TYPICAL_TCP}")


DATASHEET: dict[str, Link] = {lk.name: lk for lk in (
    _pcie(3, 8, "PCI-SIG PCI Express Base Specification Revision 3.0 (2010)"),
    _pcie(4, 16, "PCI-SIG PCI Express Base Specification Revision 4.0 (2017)"),
    _pcie(5, 32, "PCI-SIG PCI Express Base Specification Revision 5.0 (2019)"),
    _nvlink_cube_mesh(),
    _nvlink("nvlink2-nvswitch", 6, "V100", "NVIDIA DGX-2 datasheet (2018), 16 V100 through NVSwitch", 300, 2),
    _nvlink("nvlink3", 12, "A100", "NVIDIA A100 Tensor Core GPU datasheet (2021)", 600, 3),
    _nvlink("nvlink4", 18, "H100", "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM", 900, 4),
    _nvlink("nvlink5", 18, "B200", "NVIDIA HGX B200 specifications (2024), per GPU", 1800, 5),
    _ib("EDR", 100),
    _ib("HDR", 200),
    _ib("NDR", 400),
    _eth(10, "IEEE 802.3ae-2002 (10 Gb/s Ethernet)"),
    _eth(25, "IEEE 802.3by-2016 (25 Gb/s Ethernet)"),
    _eth(100, "IEEE 802.3ba-2010 (40 and 100 Gb/s Ethernet)"),
    _eth(400, "IEEE 802.3bs-2017 (200 and 400 Gb/s Ethernet)"),
)}

ALIASES = {"pcie3": "pcie-gen3-x16", "pcie4": "pcie-gen4-x16", "pcie5": "pcie-gen5-x16",
           "nvlink-v100": "nvlink2", "dgx1": "nvlink2", "dgx2": "nvlink2-nvswitch", "nvlink-a100": "nvlink3",
           "nvlink-h100": "nvlink4", "nvlink-b200": "nvlink5",
           "edr": "ib-edr", "hdr": "ib-hdr", "ndr": "ib-ndr",
           "eth-10g": "10gbe", "eth-25g": "25gbe", "eth-100g": "100gbe", "eth-400g": "400gbe"}


def link(name_or_rate: str) -> Link:
    """A datasheet link by name or alias (any case), or an emulated link from a tc rate ("1gbit")."""
    from dlscale.distributed.netns import parse_rate

    key = (name_or_rate or "").strip().lower()
    key = ALIASES.get(key, key)
    if key in DATASHEET:
        return DATASHEET[key]
    try:
        rate = parse_rate(key)
    except UsageError:
        raise UsageError(f"unknown link {name_or_rate!r}: give one of {', '.join(DATASHEET)} "
                         f"(or {', '.join(a for a in ALIASES if a not in DATASHEET)}) or a tc rate like 1gbit, "
                         "10gbit or 100mbit") from None
    payload = rate / 8 * TCP_PAYLOAD_SHARE
    return Link(f"emulated {key}", 0.0, payload,
                f"tc tbf rate {key} on the emulated nodes' link (--link-bandwidth {key}): {rate:,.0f} bit/s / 8 "
                f"x {TCP_PAYLOAD_SHARE:.4f} (TCP payload {TCP_MSS} of the {TCP_FRAME} bytes tbf counts per frame) "
                f"= {payload:,.0f} B/s; alpha 0 (no --link-latency)")


# -- fitting ----------------------------------------------------------------------------------

def _weighted_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(A, B, r2) of the least-squares line y = A + B x with weights 1/y^2 (relative residuals)."""
    ws = [1.0 / (y * y) for y in ys]
    sw = sum(ws)
    xm = sum(w * x for w, x in zip(ws, xs)) / sw
    ym = sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - xm) ** 2 for w, x in zip(ws, xs))
    sxy = sum(w * (x - xm) * (y - ym) for w, x, y in zip(ws, xs, ys))
    slope = sxy / sxx
    intercept = ym - slope * xm
    ss_res = sum(w * (y - intercept - slope * x) ** 2 for w, x, y in zip(ws, xs, ys))
    ss_tot = sum(w * (y - ym) ** 2 for w, y in zip(ws, ys))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return intercept, slope, r2


def fit_alpha_beta(sizes_bytes: list[int], times_s: list[float], ranks: int) -> tuple[float, float, float]:
    """(alpha_s, bandwidth B/s, r2) of a ring all-reduce from its times at several sizes.

    Fits ``t = A + B * S`` by weighted least squares (closed form), weights ``1/t^2`` so each point
    counts by its relative residual: timing noise grows with the time, and unweighted least squares
    over 64 KiB..64 MiB would let the largest sizes set the intercept. Then
    ``alpha = A / (2(p-1))`` and ``bandwidth = 2(p-1)/p / B``; ``r2`` is the weighted R^2 of the line.
    A negative intercept (latency below the noise) is clamped: alpha is then 0.
    """
    if len(sizes_bytes) != len(times_s):
        raise UsageError(f"{len(sizes_bytes)} sizes but {len(times_s)} times: give one time per size")
    if ranks < 2:
        raise UsageError(f"an all-reduce over {ranks} rank(s) moves nothing: fit timings from 2 or more ranks")
    if len(set(sizes_bytes)) < 2:
        raise UsageError("fitting alpha and bandwidth needs timings at 2 or more distinct sizes; "
                         f"run `{ALL_REDUCE_HINT}`")
    if any(not (math.isfinite(t) and t > 0) for t in times_s) or any(s < 0 for s in sizes_bytes):
        raise UsageError("all-reduce times must be finite and > 0 and sizes >= 0; check the measured rows")
    intercept, slope, r2 = _weighted_line([float(s) for s in sizes_bytes], [float(t) for t in times_s])
    if slope <= 0:
        raise UsageError("times do not grow with size: cannot fit a bandwidth; measure larger sizes "
                         "(e.g. --sizes 1M:256M)")
    steps = 2 * (ranks - 1)
    return max(intercept, 0.0) / steps, steps / ranks / slope, r2


def all_reduce_points(rec: Any) -> tuple[list[int], list[float]]:
    """(sizes in bytes, seconds) of a collectives record's all_reduce rows: in-place cells, else out-of-place."""
    sizes: list[int] = []
    times: list[float] = []
    for row in (rec.raw or {}).get("rows") or []:
        if row.get("op") != "all_reduce":
            continue
        cell = row.get("in-place") or row.get("out-of-place")
        if cell and cell.get("time_us") is not None:
            sizes.append(int(row["size"]))
            times.append(float(cell["time_us"]) * 1e-6)
    return sizes, times


def level_of(rec: Any) -> str:
    """"inter" when a collectives record spans several nodes (real or emulated), else "intra"."""
    cfg = rec.config or {}
    return "inter" if (cfg.get("nodes") or 1) > 1 or bool(cfg.get("emulated_nodes")) else "intra"


def _measured_what(cfg: dict[str, Any]) -> str:
    """"2 ranks over emulated 1gbit", "8 ranks, 2 nodes", "2 ranks, 1 node", with the backend."""
    p, nodes = cfg.get("world_size"), cfg.get("nodes") or 1
    if cfg.get("emulated_nodes"):
        what = f"{p} ranks over emulated {cfg.get('link_bandwidth') or 'unshaped link'}"
        if cfg.get("link_latency"):
            what += f" + {cfg['link_latency']}"
    else:
        what = f"{p} ranks, {nodes} node{'s' if nodes != 1 else ''}"
    return f"{what}, {cfg['backend']}" if cfg.get("backend") else what


def from_collectives(rec: Any) -> Link:
    """The link a ``micro collectives`` record measured: alpha and bandwidth fitted to its all_reduce rows."""
    if rec.kind != "micro" or rec.workload != "collectives":
        raise UsageError(f"run {rec.run_id} is {rec.kind} {rec.workload}, not micro collectives; "
                         f"fit links from `{ALL_REDUCE_HINT}`")
    sizes, times = all_reduce_points(rec)
    if not sizes:
        raise UsageError(f"run {rec.run_id} has no all_reduce timings; run `{ALL_REDUCE_HINT}` "
                         "over the layout to measure")
    ranks = int((rec.config or {}).get("world_size") or 0)
    try:
        alpha, bandwidth, r2 = fit_alpha_beta(sizes, times, ranks)
    except UsageError as e:
        raise UsageError(f"run {rec.run_id}: {e}") from None
    cfg = rec.config or {}
    fit = {"run_id": rec.run_id, "ranks": ranks, "points": len(sizes), "r2": r2, "sizes": sizes, "times_s": times,
           "emulated_link": cfg.get("link_bandwidth") if cfg.get("emulated_nodes") else None}
    return Link(f"measured {rec.run_id} ({_measured_what(rec.config)})", alpha, bandwidth,
                f"run {rec.run_id} (dlscale micro collectives: weighted least squares over its "
                f"{len(sizes)} all_reduce sizes, R^2 {r2:.4f})", fit)


def find_measured(store: Any, level: str, link_bandwidth: str | None = None) -> Link | None:
    """The newest ok collectives record of ``level`` (and that emulated rate, when given), fitted; else None.

    Records without all_reduce rows (another collective only), of one rank, or of emulated nodes
    set apart (one node's own link rate or CPU quota) are passed over.
    """
    from dlscale.distributed.netns import parse_rate

    if level not in LEVELS:
        raise UsageError(f"link level {level!r}: give one of {', '.join(LEVELS)}")
    want = parse_rate(link_bandwidth) if link_bandwidth else None
    for rec in store.query(kind="micro", workload="collectives", status="ok"):
        cfg = rec.config or {}
        if level_of(rec) != level or int(cfg.get("world_size") or 0) < 2 or not all_reduce_points(rec)[0]:
            continue
        if cfg.get("node_link_bandwidth") or cfg.get("node_cpu_quota"):  # nodes set apart: not one link
            continue
        if want is not None and not (cfg.get("link_bandwidth") and parse_rate(cfg["link_bandwidth"]) == want):
            continue
        return from_collectives(rec)
    return None
