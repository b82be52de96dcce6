"""Datasheet expectations: a device's rated figure x the fraction a healthy device typically reaches.

The rated figures all come from the GPU-facts table (``dlscale.gpus``, ``dlscale/facts/gpus.yaml``),
each with its source: dense FLOP/s per precision, memory bandwidth, NVLink generation and links, the
PCIe and NVLink rates. The typical fractions (``FRACTIONS``) each carry their source, or say that the
fraction is dlscale's own choice and why (no vendor publishes what a healthy device reaches in a
STREAM-like copy); a GEMM's is measured per architecture and board (the table's ``gemm_fractions``:
the best GEMM rate healthy parts reached, over their dense peak), and a part with no measured fraction
falls back to a conservative default that its expectation says it is; docs/METRICS.md ("Acceptance:
datasheet expectations") repeats them. A figure with no rated figure here (every CPU figure, inter-node links, training throughput) gets no
datasheet expectation. ``row_figure`` is the rated figure a row of the healthy table is held to
(``healthy.py`` refuses a row far from it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dlscale import gpus

Fraction = gpus.Sourced  # a fraction and its source: a publication, a derivation, or "dlscale's choice: why"


FRACTIONS: dict[str, Fraction] = {
    "gemm_tensor": Fraction(0.6, "conservative default, dlscale's choice where no fraction was measured for the "
                                 "architecture, board and precision (the GPU facts' gemm_fractions): below what large "
                                 "cuBLAS GEMMs reach on healthy V100/A100/H100 parts at their default power limits, so "
                                 "only a part that throttles, runs at a lower power cap or lower clocks falls under "
                                 "it; a part 25% slow passes it"),
    "gemm_fp32": Fraction(0.7, "conservative default, dlscale's choice where no fraction was measured: vector FP32 "
                               "GEMMs keep the FMA pipes busier than tensor GEMMs keep the tensor cores; 0.7 of the "
                               "FP32 peak leaves room for clock drops under load"),
    "memory_copy": Fraction(0.8, "dlscale's choice: a device-to-device copy (read + write, CUDA's bandwidthTest "
                                 "counting) cannot reach the HBM interface rate (refresh, bank and page conflicts, "
                                 "read/write turnaround); STREAM-like copies on HBM GPUs are published near 80-90% "
                                 "of it (e.g. BabelStream's results), so 0.8 is the lower end"),
    "pcie_pinned": Fraction(0.8, "derived from the PCIe protocol: a 256-byte max payload carries about 24 bytes of "
                                 "framing, sequence number, 3-4 DW header and LCRC per TLP (256/280 = 0.91), and "
                                 "flow-control/ACK packets and read requests take a few % more; dlscale expects "
                                 "0.8 of the link's rate from a pinned host copy"),
    "nvlink": Fraction(0.75, "dlscale's choice: NVLink (and NVSwitch) peer copies and all-reduce bus bandwidth come "
                             "within a quarter of the links' per-direction rate on healthy boards; nccl-tests defines "
                             "busbw to be compared with exactly that rate (nccl-tests doc/PERFORMANCE.md)"),
}


def gemm_fraction(arch: str, board: str, precision: str) -> Fraction | None:
    """The fraction of the dense peak a healthy part's best GEMM reaches: measured for its architecture,
    board and precision, else the conservative default, its source beginning CONSERVATIVE DEFAULT;
    None for an architecture with none."""
    if arch in gpus.table().no_gemm_fraction:
        return None
    got = gpus.gemm_fraction(arch, board, precision)
    if got is not None:
        return got
    base = FRACTIONS["gemm_fp32" if precision == "fp32" else "gemm_tensor"]
    what = f"{arch} {board}".strip() or "this part"
    return Fraction(base.value, f"CONSERVATIVE DEFAULT (no measured fraction for {what} {precision}): {base.source}")


_COLL = ("dlscale's choice, against one GPU's NVLink rate per direction (nccl-tests' busbw is defined to be "
         "compared with it, doc/PERFORMANCE.md), on the plateau of large messages: ")
COLLECTIVE_FRACTIONS: dict[str, Fraction] = {
    "all_reduce": Fraction(0.75, _COLL + "ring and NVLink SHARP all-reduce come within a quarter of the rate on "
                                         "healthy NVSwitch boards (NVLS can pass it)"),
    "reduce_scatter": Fraction(0.7, _COLL + "one pass over the ring instead of two, so less pipelining hides each "
                                            "step's latency; a healthy board comes within 30%"),
    "all_gather": Fraction(0.7, _COLL + "the same traffic as reduce_scatter without the reduction: within 30%"),
    "broadcast": Fraction(0.6, _COLL + "a chain from one root: the root's sends and the chain's latency cost more "
                                       "than a ring's, so 0.6"),
    "reduce": Fraction(0.6, _COLL + "a broadcast's chain run backwards with a reduction: as broadcast"),
    "all_to_all": Fraction(0.6, _COLL + "every rank sends to every other at once; the switches' all-to-all "
                                        "traffic and many small transfers per rank keep it lowest"),
}


@dataclass(frozen=True)
class Rated:
    """A datasheet expectation: rated value x fraction, and where both came from."""

    value: float
    rated: float
    fraction: Fraction
    source: str

    @property
    def text(self) -> str:
        return f"{self.fraction.value:g} x {self.rated:.4g} ({self.source}); fraction: {self.fraction.source}"


def gpu_facts(system: dict[str, Any], index: int) -> dict[str, Any]:
    """The inventory's NVML facts of CUDA device ``index`` (PCIe generation and width, name, ...)."""
    topo = ((system or {}).get("accelerators") or {}).get("topology") or {}
    return next((g for g in topo.get("gpus") or [] if g.get("index") == index), {})


def nvlinks(system: dict[str, Any], i: int, j: int) -> int:
    """NVLinks between CUDA devices i and j from the inventory's GPU-GPU matrix ("NV18" -> 18), else 0."""
    matrix = (((system or {}).get("accelerators") or {}).get("topology") or {}).get("gpu_gpu") or []
    try:
        m = re.fullmatch(r"NV(\d+)", str(matrix[i][j]))
    except IndexError:
        return 0
    return int(m.group(1)) if m else 0


def _link_facts(system: dict[str, Any], i: int) -> dict[str, Any]:
    """A GPU's NVLink facts from the inventory; for a record from before they were taken, what its
    model's datasheet says (nvlink.nominal)."""
    from dlscale import nvlink

    facts = gpu_facts(system, i)
    if facts.get("nvlink"):
        return facts["nvlink"]
    model = nvlink.nominal(facts.get("name"), facts.get("pci_device_id"))
    if model is None:
        return {}
    return {"generation": model[0], "nominal": model[1], "gbps_per_link": gpus.table().nvlink[model[0]].value}


def nvlink_pair(system: dict[str, Any], i: int, j: int) -> tuple[float, str] | None:
    """The NVLink rate (GB/s per direction) GPUs i and j should reach and where it comes from: the links
    the pair should have (nvlink.expected_links: the models' nominal count through NVSwitches, else the
    pair's own) x the slower GPU's per-link rate of its generation; None without NVLink between them or
    with no known generation."""
    from dlscale import nvlink

    seen = nvlinks(system, i, j)
    if not seen:
        return None
    fi, fj = _link_facts(system, i), _link_facts(system, j)
    rates = [f.get("gbps_per_link") for f in (fi, fj)]
    if not all(rates):
        return None
    links, rate = nvlink.expected_links(fi, fj, seen), min(rates)
    gen = fi["generation"] if rate == rates[0] else fj["generation"]
    down = f" ({seen} active: a link down does not lower it)" if links > seen else ""
    return links * rate, (f"{links} NVLinks{down} x {rate:g} GB/s per link and direction "
                          f"(NVLink {gen}: {gpus.table().nvlink[gen].source})")


def expectation(fig: Any, system: dict[str, Any]) -> Rated | None:
    """The datasheet expectation of a figure (``figure.Figure``), or None where no rated figure applies."""
    ctx = fig.context
    on_device = fig.subject is not None and fig.subject.kind == "device"
    if fig.check == "gemm" and on_device:
        return _gemm(fig, ctx["precision"], system)
    if fig.check == "memory" and on_device:
        return _memory(fig, ctx["op"], ctx["device"], system)
    if fig.check == "p2p":
        pair = nvlink_pair(system, ctx["src"], ctx["dst"]) if ctx.get("path") == "p2p" else None
        if pair is not None:
            frac = FRACTIONS["nvlink"]
            return Rated(pair[0] * frac.value, pair[0], frac, f"GPU {ctx['src']}->{ctx['dst']}: {pair[1]}")
    if fig.check == "collectives" and fig.context.get("world_size"):
        return _busbw(fig, system)
    return None


def _gemm(fig: Any, precision: str, system: dict[str, Any]) -> Rated | None:
    from dlscale.peaks import gpu_peak

    idx = int(fig.context["device"].split(":")[1])
    pci = gpu_facts(system, idx).get("pci_device_id")
    peak, row = gpu_peak(fig.model or "", precision, pci), gpus.find(fig.model, pci)
    frac = gemm_fraction(row.arch, row.board, precision) if row is not None else None
    if peak is None or frac is None:
        return None
    rated = peak.flops / 1e12
    return Rated(rated * frac.value, rated, frac, f"dense {precision} peak {rated:g} TFLOP/s: {peak.source}")


def _memory(fig: Any, op: str, device: str, system: dict[str, Any]) -> Rated | None:
    if op == "d2d":
        mem = gpus.memory(fig.model)
        if mem is None:
            return None
        frac = FRACTIONS["memory_copy"]
        return Rated(mem.value * frac.value, mem.value, frac, f"device memory {mem.value:g} GB/s: {mem.source}")
    facts = gpu_facts(system, int(device.split(":")[1]))
    rate = gpus.pcie_gbps(facts.get("pcie_gen_max"), facts.get("pcie_width_max"))
    if rate is None:
        return None
    frac = FRACTIONS["pcie_pinned"]
    return Rated(rate * frac.value, rate, frac,
                 f"PCIe Gen{facts['pcie_gen_max']} x{facts['pcie_width_max']} (NVML's maximum link) = {rate:.2f} GB/s "
                 f"per direction ({gpus.table().pcie[facts['pcie_gen_max']].source}: GT/s x lanes / 8 x encoding)")


def _busbw(fig: Any, system: dict[str, Any]) -> Rated | None:
    """Within a node: a collective's plateau busbw against the slowest GPU pair's NVLink rate (every pair
    NVLinked) x the fraction of that rate the collective attains (``COLLECTIVE_FRACTIONS``)."""
    n = int(fig.context["world_size"])
    frac = COLLECTIVE_FRACTIONS.get(fig.context.get("op") or "")
    if n < 2 or frac is None or (fig.context.get("nodes") or 1) > 1:
        return None
    pairs = [nvlink_pair(system, i, j) for i in range(n) for j in range(n) if i != j]
    if not pairs or any(p is None for p in pairs):
        return None
    rated, source = min(pairs, key=lambda p: p[0])  # type: ignore[arg-type, return-value]
    return Rated(rated * frac.value, rated, frac, f"the slowest GPU pair of the {n}: {source}")


# -- the rated figure a healthy-table row is held to -------------------------------------------------------
def row_figure(row: Any) -> tuple[float, str] | None:
    """What a row of the healthy table (``healthy.Row``) can be held to, and where it comes from: the
    dense peak of a GEMM, the memory bandwidth of a device copy, the PCIe link of a pinned copy (its
    ``when``), the NVLinks of a peer copy, the busbw a node's NVLinks allow a collective; None where
    no table here knows the model or the link (nothing to hold the row to)."""
    from dlscale.peaks import gpu_peak

    names = list(row.names) + [""] * len(row.pci_ids)
    pcis = [None] * len(row.names) + list(row.pci_ids)
    part = next((p for p in (gpus.find(n, i) for n, i in zip(names, pcis)) if p is not None), None)
    if row.check == "gemm" and row.figure.endswith(" best rate") and part is not None:
        peak = gpu_peak(part.names[0], row.figure.split()[0])
        return (peak.flops / 1e12, f"dense peak, {peak.source}") if peak else None
    if row.check == "memory" and row.figure == "d2d":
        mem = next((m for m in (gpus.memory(n) for n in row.names) if m is not None), None)
        return (mem.value, f"device memory: {mem.source}") if mem else None
    if row.check == "memory" and row.figure in ("h2d_pinned", "d2h_pinned"):
        m = re.fullmatch(r"Gen(\d) x(\d+)", str(row.when.get("pcie") or ""))
        rate = gpus.pcie_gbps(int(m.group(1)), int(m.group(2))) if m else None
        return (rate, f"PCIe {row.when['pcie']} per direction") if rate else None
    if part is None or part.nvlink is None or row.check not in ("p2p", "collectives"):
        return None
    gen, nominal = part.nvlink
    per_link = gpus.table().nvlink[gen].value
    links = int(row.when.get("nvlinks") or nominal)
    rate = links * per_link
    where = f"{links} NVLink {gen} links x {per_link:g} GB/s per direction"
    n = int(row.when.get("world_size") or 0)
    if row.check == "collectives" and row.figure == "all_reduce busbw" and gen >= 4 and links == nominal and n > 2:
        nvls = rate * 2 * (n - 1) / (n + 1)  # NVLink SHARP: each rank sends S + S/n and receives S/n + S
        return max(rate, nvls), f"{where} x 2(n-1)/(n+1) for NVLink SHARP's all-reduce over {n} GPUs"
    return rate, where
