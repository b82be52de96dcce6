"""Peak FLOP/s: the datasheet peak of a known GPU, a measured and an ISA peak for CPUs, one resolver.

MFU divides achieved FLOP/s by a peak. A wrong peak makes every MFU lie, so a GPU's peak is the dense
figure of its row in the GPU-facts table (``dlscale.gpus``, ``dlscale/facts/gpus.yaml``): the row of its
exact device name (only case and runs of spaces are normalised), else of its PCI device id, with the
row's source. "H200" is not "H200 NVL" nor "GH200": there is no substring matching, and an unknown
device gets no peak (null) and a reason rather than somebody else's peak.

``resolve_peak`` is the one place a run gets its peak: a datasheet row on GPUs, and on CPUs either
the measured rate of a large GEMM (the short test's MFU) or the cores x GHz x FLOP/cycle estimate
(the microbenchmarks' % of peak). docs/METRICS.md derives each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dlscale import gpus
from dlscale.format import fmt_count

TFLOPS = 1e12


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s
    kind: str  # "datasheet" | "measured-gemm" | "isa-estimate"
    source: str


def gpu_peak(device_name: str, precision: str, pci_id: int | None = None) -> Peak | None:
    """The datasheet dense peak for a GPU and precision, or None when the table does not have it."""
    row = gpus.find(device_name, pci_id)
    tf = row.tflops.get(precision) if row else None
    if row is None or tf is None:
        return None
    by = "" if gpus.find(device_name) is row else f" (matched by PCI device id 0x{pci_id:04x})"
    return Peak(tf * TFLOPS, "datasheet", f"{row.label}{by}: {row.source('tflops')}")


def gpu_peak_reason(device_name: str, precision: str, pci_id: int | None = None) -> str:
    """Why ``gpu_peak`` gave None."""
    row = gpus.find(device_name, pci_id)
    if row is None:
        return f"no datasheet peak for {device_name!r} in dlscale's table: MFU and % of peak left empty"
    return f"the datasheet row {row.label!r} has no {precision} peak: MFU and % of peak left empty"


# FLOPs per cycle per core of the widest FMA path for fp32, assuming two FMA units
# (one FMA = 2 FLOPs): AVX-512: 2 * 16 * 2 = 64; AVX2/FMA: 2 * 8 * 2 = 32.
def cpu_isa_peak(isa: dict[str, bool], cores: int | None, ghz: float | None) -> Peak | None:
    """An fp32 estimate from ISA and nominal clock: cores * GHz * FLOPs/cycle (two FMA units)."""
    if not cores or not ghz:
        return None
    if isa.get("avx512f"):
        per_cycle, what = 64, "AVX-512, 2 FMA units"
    elif isa.get("avx2") and isa.get("fma"):
        per_cycle, what = 32, "AVX2, 2 FMA units"
    else:
        return None
    return Peak(cores * ghz * 1e9 * per_cycle, "isa-estimate",
                f"{fmt_count(cores, 'core')} x {ghz} GHz x {per_cycle} FLOP/cycle ({what}, fp32)")


_MEASURED: dict[tuple[str, int, int, float], Peak] = {}
PROBE_SIZES = (256, 512, 1024, 2048)  # the probe's square GEMM grows through these up to ``n``
PROBE_BUDGET_S = 2.0  # ... while the next size's reps would fit in this many seconds


def measured_cpu_gemm_peak(precision: str, n: int = 2048, reps: int = 5, budget_s: float = PROBE_BUDGET_S) -> Peak:
    """Best rate of a square matmul in this precision on this CPU (cached per process).

    The size grows from 256 to ``n`` while the next size (8x the work) would still fit ``reps + 1``
    matmuls in ``budget_s``: a fast CPU measures at ``n``, and a precision the CPU only emulates
    (bf16 on an AVX2 CPU runs near 1 GFLOP/s, so one 2048^3 matmul takes about 20 s) stops early
    instead of holding the run for minutes. The first matmul at each size is its warm-up.
    """
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    key = (str(dtype), n, torch.get_num_threads(), budget_s)
    if key in _MEASURED:
        return _MEASURED[key]
    g = torch.Generator().manual_seed(0)
    sizes = [s for s in PROBE_SIZES if s < n] + [n]
    for size in sizes:
        a = torch.randn(size, size, generator=g).to(dtype)
        b = torch.randn(size, size, generator=g).to(dtype)
        t0 = time.perf_counter()
        torch.matmul(a, b)  # warm-up, and the time that decides whether to grow
        one = time.perf_counter() - t0
        if 8 * one * (reps + 1) > budget_s:
            break
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    stopped = f" (largest size within the probe's {budget_s:g} s budget)" if size < n else ""
    peak = Peak(2 * size**3 / best, "measured-gemm",
                f"best of {reps} {size}x{size}x{size} {precision} torch.matmul on this CPU{stopped}, "
                f"{torch.get_num_threads()} threads")
    _MEASURED[key] = peak
    return peak


def cpu_clock(system: dict[str, Any], override: float | None) -> tuple[float | None, str]:
    """The CPU clock (GHz) for the ISA peak and where it came from, or None and why not."""
    cpu = system.get("cpu", {})
    if override:
        return override, f"--cpu-ghz {override:g}"
    if cpu.get("nominal_ghz"):
        return cpu["nominal_ghz"], "the CPU model name"
    mhz = _proc_cpuinfo_mhz()
    seen = f"; /proc/cpuinfo reports {mhz:g} MHz (under a hypervisor often the TSC rate, not the core clock)" if mhz else ""
    return None, (f"the CPU model name {cpu.get('model')!r} carries no clock, so the ISA peak is unknown{seen}; "
                  "pass --cpu-ghz to compute it")


def _proc_cpuinfo_mhz() -> float | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        return None
    return None


@dataclass(frozen=True)
class ResolvedPeak:
    """The peak a run divides by, what kind it is, and where it came from (or why there is none)."""

    flops: float | None  # FLOP/s; None: no honest peak
    kind: str | None  # "datasheet" | "measured-gemm" | "isa-estimate"; None with flops
    source: str  # the source of the peak, or the reason there is none
    isa_estimate: Peak | None = field(default=None)  # CPUs, fp32: cores x GHz x FLOP/cycle, beside it

    @property
    def peak(self) -> Peak | None:
        return Peak(self.flops, self.kind or "", self.source) if self.flops is not None else None

    @property
    def isa_flops(self) -> float | None:
        return self.isa_estimate.flops if self.isa_estimate else None


def resolve_peak(device: Any, precision: str, system: dict[str, Any], *, cpu_ghz: float | None = None,
                 measure: bool = True) -> ResolvedPeak:
    """The device's dense peak for ``precision``.

    GPUs: the datasheet row of the device's exact name (or PCI device id from the inventory).
    CPUs: with ``measure`` the best rate of a large GEMM in this precision (the short test's MFU),
    otherwise the fp32 ISA estimate (the microbenchmarks' % of peak); the ISA estimate rides
    beside either where the clock is known (``cpu_ghz`` overrides the model name's).
    """
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        name, pci_id = torch.cuda.get_device_name(device), _pci_id(system, getattr(device, "index", None) or 0)
        p = gpu_peak(name, precision, pci_id)
        if p is None:
            return ResolvedPeak(None, None, gpu_peak_reason(name, precision, pci_id))
        return ResolvedPeak(p.flops, p.kind, p.source)
    isa, isa_why = _isa(precision, system, cpu_ghz)
    if measure:
        m = measured_cpu_gemm_peak(precision)
        return ResolvedPeak(m.flops, m.kind, m.source, isa)
    if isa is None:
        return ResolvedPeak(None, None, isa_why)
    return ResolvedPeak(isa.flops, isa.kind, isa_why, isa)


def _isa(precision: str, system: dict[str, Any], cpu_ghz: float | None) -> tuple[Peak | None, str]:
    """The fp32 ISA estimate and its source, or None and why not."""
    if precision != "fp32":
        return None, f"no CPU ISA peak for {precision} (only fp32 is derived): % of peak left empty"
    ghz, why = cpu_clock(system, cpu_ghz)
    cpu = system.get("cpu", {})
    p = cpu_isa_peak(cpu.get("isa", {}), cpu.get("physical_cores"), ghz)
    if p is None:
        return None, why if ghz is None else "no AVX-512/AVX2+FMA in this CPU's ISA flags: ISA peak unknown"
    return p, f"{p.source}; clock from {why}"


def _pci_id(system: dict[str, Any], index: int) -> int | None:
    """The PCI device id of CUDA device ``index`` from the inventory's NVML facts, where present."""
    topo = ((system or {}).get("accelerators") or {}).get("topology") or {}
    for g in topo.get("gpus") or []:
        if g.get("index") == index:
            return g.get("pci_device_id")
    return None
