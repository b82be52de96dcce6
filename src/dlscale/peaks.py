"""Dense peak FLOP/s of known accelerators, and a measured peak for CPUs.

MFU divides achieved FLOP/s by a peak. A wrong peak makes every MFU lie, so each row of the
table carries its source, the match is by device name, and an unknown device gets no MFU (null)
rather than somebody else's peak. On CPUs the peak is measured: the best rate of a large GEMM in
the run's precision on this machine (docs/METRICS.md), with an ISA-and-clock estimate beside it
where the clock is known.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

TFLOPS = 1e12


@dataclass(frozen=True)
class PeakRow:
    name: str
    match: tuple[str, ...]  # all substrings must occur in the lower-cased device name
    tflops: dict[str, float]  # precision -> dense TFLOP/s (no structured sparsity)
    source: str


# Dense (non-sparse) peaks. "fp32" is the non-tensor-core FP32 rate, used for --precision fp32
# (dlscale turns TF32 off for fp32); "tf32", "bf16", "fp16" are dense tensor-core rates.
GPU_PEAKS: tuple[PeakRow, ...] = (
    PeakRow("NVIDIA H200", ("h200",), {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
            "NVIDIA H200 Tensor Core GPU datasheet (SXM; dense = half of the with-sparsity figures)"),
    PeakRow("NVIDIA H100 NVL", ("h100", "nvl"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
            "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL; dense = half of the with-sparsity figures)"),
    PeakRow("NVIDIA H100 PCIe", ("h100", "pcie"), {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
            "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe; dense = half of the with-sparsity figures)"),
    PeakRow("NVIDIA H100 SXM", ("h100",), {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5; dense = half of the with-sparsity figures)"),
    PeakRow("NVIDIA B200", ("b200",), {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
            "NVIDIA HGX B200 datasheet, per GPU (dense = half of the with-sparsity figures)"),
    PeakRow("NVIDIA A100", ("a100",), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            "NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe share these dense peaks)"),
    PeakRow("NVIDIA L40S", ("l40s",), {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
            "NVIDIA L40S datasheet (dense = half of the with-sparsity figures)"),
    PeakRow("NVIDIA V100 PCIe", ("v100", "pcie"), {"fp32": 14.0, "fp16": 112.0},
            "NVIDIA Tesla V100 datasheet (PCIe)"),
    PeakRow("NVIDIA V100 SXM2", ("v100",), {"fp32": 15.7, "fp16": 125.0},
            "NVIDIA Tesla V100 datasheet (SXM2)"),
    PeakRow("NVIDIA P100 PCIe", ("p100", "pcie"), {"fp32": 9.3, "fp16": 18.7},
            "NVIDIA Tesla P100 datasheet (PCIe)"),
    PeakRow("NVIDIA P100 SXM2", ("p100",), {"fp32": 10.6, "fp16": 21.2},
            "NVIDIA Tesla P100 datasheet (SXM2)"),
    PeakRow("NVIDIA T4", ("tesla t4",), {"fp32": 8.1, "fp16": 65.0},
            "NVIDIA T4 datasheet"),
    PeakRow("AMD Instinct MI300X", ("mi300x",), {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            "AMD Instinct MI300X datasheet (dense matrix peaks)"),
)


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s
    kind: str  # "datasheet" | "measured"
    source: str


def gpu_peak(device_name: str, precision: str) -> Peak | None:
    """The datasheet dense peak for a GPU name and precision, or None when not known."""
    name = device_name.lower()
    for row in GPU_PEAKS:
        if all(m in name for m in row.match):
            tf = row.tflops.get(precision)
            if tf is None:
                return None
            return Peak(tf * TFLOPS, "datasheet", f"{row.name}: {row.source}")
    return None


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
                f"{cores} cores x {ghz} GHz x {per_cycle} FLOP/cycle ({what}, fp32)")


_MEASURED: dict[tuple[str, int, int], Peak] = {}


def measured_cpu_gemm_peak(precision: str, n: int = 2048, reps: int = 5) -> Peak:
    """Best rate of an n x n x n matmul in this precision on this CPU (cached per process)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    key = (str(dtype), n, torch.get_num_threads())
    if key in _MEASURED:
        return _MEASURED[key]
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    torch.matmul(a, b)  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    peak = Peak(2 * n**3 / best, "measured",
                f"best of {reps} {n}x{n}x{n} {precision} torch.matmul on this CPU, {torch.get_num_threads()} threads")
    _MEASURED[key] = peak
    return peak
