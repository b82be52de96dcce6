"""Peak FLOP/s: datasheet peaks of known accelerators, a measured and an ISA peak for CPUs, one resolver.

MFU divides achieved FLOP/s by a peak. A wrong peak makes every MFU lie, so each row of the table
names the exact device names it covers (as ``torch.cuda.get_device_name`` and NVML report them;
only case and runs of spaces are normalised), the PCI device ids where they are known, and its
source document. "H200" is not "H200 NVL" nor "GH200": there is no substring matching, and an
unknown device gets no peak (null) and a reason rather than somebody else's peak.

``resolve_peak`` is the one place a run gets its peak: a datasheet row on GPUs, and on CPUs either
the measured rate of a large GEMM (the short test's MFU) or the cores x GHz x FLOP/cycle estimate
(the microbenchmarks' % of peak). docs/METRICS.md derives each. ``MEMORY`` holds each GPU's datasheet
memory bandwidth (the acceptance's memory expectation, and the decode limit of ``dlscale.infer.limit``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dlscale.format import fmt_count

TFLOPS = 1e12


@dataclass(frozen=True)
class PeakRow:
    label: str
    names: tuple[str, ...]  # exact device names, as the driver reports them
    tflops: dict[str, float]  # precision -> dense TFLOP/s (no structured sparsity)
    source: str
    pci_ids: tuple[int, ...] = ()  # PCI device ids (vendor 0x10de / 0x1002), only where known
    # (NVLink generation, links) of a part whose datasheet gives its NVLink rate, all links wired on the
    # board (SXM): the datasheet's GB/s both directions / (2 x the generation's per-link rate, nvlink.py)
    nvlink: tuple[int, int] | None = None
    # the architecture and the board (SXM / PCIe / superchip / OAM): a large GEMM's sustained share of the
    # peak depends on both (the board's power limit), and accept/datasheet.py's GEMM fractions are keyed on them
    arch: str = ""
    board: str = ""


def _h(fp32: float, sparse_tf32: float, sparse_16: float, sparse_fp8: float) -> dict[str, float]:
    """Hopper/Blackwell-style rows: the datasheets print tensor rates with sparsity; dense is half."""
    return {"fp32": fp32, "tf32": sparse_tf32 / 2, "bf16": sparse_16 / 2, "fp16": sparse_16 / 2,
            "fp8": sparse_fp8 / 2}


_NV_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_NV_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024)"
_NV_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021, 40GB/80GB)"
_NV_V100 = "NVIDIA Tesla V100 GPU Accelerator datasheet (2018)"
_DENSE = "; tensor rates dense = half the with-sparsity figures"

# fp32 is the non-tensor (vector) FP32 rate for every vendor: dlscale turns TF32 off for
# --precision fp32. tf32/bf16/fp16/fp8 are dense tensor-core (matrix-core) rates.
GPU_PEAKS: tuple[PeakRow, ...] = (
    PeakRow("NVIDIA H100 SXM5", ("NVIDIA H100 80GB HBM3",), _h(67.0, 989.0, 1979.0, 3958.0),
            f"{_NV_H100} (2023), H100 SXM column{_DENSE}", (0x2330,), nvlink=(4, 18), arch="Hopper", board="SXM"),
    PeakRow("NVIDIA H100 PCIe", ("NVIDIA H100 PCIe",), _h(51.0, 756.0, 1513.0, 3026.0),
            f"{_NV_H100} (2022), H100 PCIe column{_DENSE}", (0x2331,), arch="Hopper", board="PCIe"),
    PeakRow("NVIDIA H100 NVL", ("NVIDIA H100 NVL",), _h(60.0, 835.0, 1671.0, 3341.0),
            f"{_NV_H100} (2023), H100 NVL column, per GPU{_DENSE}", arch="Hopper", board="PCIe"),
    PeakRow("NVIDIA H200 SXM", ("NVIDIA H200",), _h(67.0, 989.0, 1979.0, 3958.0),
            f"{_NV_H200}, H200 SXM column{_DENSE}", (0x2335,), nvlink=(4, 18), arch="Hopper", board="SXM"),
    PeakRow("NVIDIA H200 NVL", ("NVIDIA H200 NVL",), _h(60.0, 835.0, 1671.0, 3341.0),
            f"{_NV_H200}, H200 NVL column{_DENSE}", arch="Hopper", board="PCIe"),
    PeakRow("NVIDIA GH200", ("NVIDIA GH200 480GB",), _h(67.0, 989.0, 1979.0, 3958.0),
            f"NVIDIA GH200 Grace Hopper Superchip datasheet (2023), GPU figures{_DENSE}", arch="Hopper",
            board="superchip"),
    PeakRow("NVIDIA B200", ("NVIDIA B200",), _h(75.0, 2250.0, 4500.0, 9000.0),
            f"NVIDIA HGX B200 specifications (2024): the 8-GPU figures / 8{_DENSE}", nvlink=(5, 18),
            arch="Blackwell", board="SXM"),
    PeakRow("NVIDIA A100 SXM4", ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"),
            {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            f"{_NV_A100}, A100 SXM column (dense figures as printed)", (0x20B2, 0x20B0), nvlink=(3, 12),
            arch="Ampere", board="SXM"),
    PeakRow("NVIDIA A100 PCIe", ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"),
            {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            f"{_NV_A100}, A100 PCIe column (dense figures as printed)", (0x20F1, 0x20B5), arch="Ampere",
            board="PCIe"),
    PeakRow("NVIDIA L40S", ("NVIDIA L40S",), {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
            "NVIDIA L40S GPU datasheet (2023), dense figures as printed", arch="Ada Lovelace", board="PCIe"),
    PeakRow("NVIDIA V100 SXM2", ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"), {"fp32": 15.7, "fp16": 125.0},
            f"{_NV_V100}, SXM2 column (fp16 = Tensor Performance)", (0x1DB1,), nvlink=(2, 6), arch="Volta",
            board="SXM"),
    PeakRow("NVIDIA V100 PCIe", ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"), {"fp32": 14.0, "fp16": 112.0},
            f"{_NV_V100}, PCIe column (fp16 = Tensor Performance)", (0x1DB4,), arch="Volta", board="PCIe"),
    PeakRow("NVIDIA P100 PCIe", ("Tesla P100-PCIE-16GB", "Tesla P100-PCIE-12GB"), {"fp32": 9.3, "fp16": 18.7},
            "NVIDIA Tesla P100 datasheet (2016), PCIe column", arch="Pascal", board="PCIe"),
    PeakRow("NVIDIA P100 SXM2", ("Tesla P100-SXM2-16GB",), {"fp32": 10.6, "fp16": 21.2},
            "NVIDIA Tesla P100 datasheet (2016), NVLink (SXM2) column", nvlink=(1, 4), arch="Pascal", board="SXM"),
    PeakRow("NVIDIA T4", ("Tesla T4",), {"fp32": 8.1, "fp16": 65.0},
            "NVIDIA T4 Tensor Core GPU datasheet (2018); fp16 = mixed-precision tensor rate", arch="Turing",
            board="PCIe"),
    PeakRow("AMD Instinct MI300X", ("AMD Instinct MI300X",),
            {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            "AMD Instinct MI300X accelerator data sheet (2023); fp32 = peak FP32 vector, others dense matrix",
            arch="CDNA 3", board="OAM"),
    PeakRow("AMD Instinct MI325X", ("AMD Instinct MI325X",),
            {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            "AMD Instinct MI325X accelerator data sheet (2024); fp32 = peak FP32 vector, others dense matrix",
            arch="CDNA 3", board="OAM"),
)


def normalize_name(name: str) -> str:
    """Case and runs of whitespace only: 'nvidia  H100 pcie ' -> 'nvidia h100 pcie'."""
    return " ".join(name.split()).casefold()


_BY_NAME = {normalize_name(n): row for row in GPU_PEAKS for n in row.names}
_BY_PCI = {i: row for row in GPU_PEAKS for i in row.pci_ids}


# Device memory bandwidth: the datasheet rate of each GPU's memory interface (what the acceptance's
# memory copy is judged against, and what bounds a decode step that reads its weights and KV cache).
@dataclass(frozen=True)
class MemoryRow:
    names: tuple[str, ...]  # exact device names, as the driver reports them
    gbps: float  # GB/s (1e9 bytes/s) of device memory
    source: str


MEMORY: tuple[MemoryRow, ...] = (
    MemoryRow(("NVIDIA H100 80GB HBM3",), 3350, "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM: 3.35 TB/s"),
    MemoryRow(("NVIDIA H100 PCIe",), 2000, "NVIDIA H100 Tensor Core GPU datasheet (2022), H100 PCIe: 2 TB/s"),
    MemoryRow(("NVIDIA H100 NVL",), 3900, "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 NVL: 3.9 TB/s"),
    MemoryRow(("NVIDIA H200", "NVIDIA H200 NVL"), 4800, "NVIDIA H200 Tensor Core GPU datasheet (2024): 4.8 TB/s"),
    MemoryRow(("NVIDIA A100-SXM4-80GB",), 2039, "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB SXM: 2,039 GB/s"),
    MemoryRow(("NVIDIA A100 80GB PCIe",), 1935, "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB PCIe: 1,935 GB/s"),
    MemoryRow(("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), 1555,
              "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 40GB: 1,555 GB/s"),
    MemoryRow(("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"), 900,
              "NVIDIA Tesla V100 GPU Accelerator datasheet (2018): 900 GB/s"),
    MemoryRow(("NVIDIA B200",), 8000, "NVIDIA HGX B200 specifications (2024): 64 TB/s for the 8 GPUs / 8"),
    MemoryRow(("NVIDIA L40S",), 864, "NVIDIA L40S GPU datasheet (2023): 864 GB/s"),
    MemoryRow(("AMD Instinct MI300X",), 5300, "AMD Instinct MI300X accelerator data sheet (2023): 5.3 TB/s"),
)
_MEMORY_BY_NAME = {normalize_name(n): row for row in MEMORY for n in row.names}


def memory_gbps(device_name: str | None) -> MemoryRow | None:
    """The datasheet memory row of an exact (normalised) device name, else None."""
    return _MEMORY_BY_NAME.get(normalize_name(device_name or ""))


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s
    kind: str  # "datasheet" | "measured-gemm" | "isa-estimate"
    source: str


def find_row(device_name: str, pci_id: int | None = None) -> PeakRow | None:
    """The row for an exact (normalised) device name, else for a known PCI device id, else None."""
    row = _BY_NAME.get(normalize_name(device_name))
    return row if row is not None or pci_id is None else _BY_PCI.get(pci_id)


def gpu_peak(device_name: str, precision: str, pci_id: int | None = None) -> Peak | None:
    """The datasheet dense peak for a GPU and precision, or None when the table does not have it."""
    row = find_row(device_name, pci_id)
    tf = row.tflops.get(precision) if row else None
    if row is None or tf is None:
        return None
    by = "" if normalize_name(device_name) in _BY_NAME else f" (matched by PCI device id 0x{pci_id:04x})"
    return Peak(tf * TFLOPS, "datasheet", f"{row.label}{by}: {row.source}")


def gpu_peak_reason(device_name: str, precision: str, pci_id: int | None = None) -> str:
    """Why ``gpu_peak`` gave None."""
    row = find_row(device_name, pci_id)
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
