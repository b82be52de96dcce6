"""The peak table's matching and the CPU peaks."""

import pytest

from dlscale import peaks


def test_gpu_peak_matching_by_name():
    p = peaks.gpu_peak("NVIDIA A100-SXM4-80GB", "bf16")
    assert p.flops == pytest.approx(312e12) and "A100" in p.source and p.kind == "datasheet"
    assert peaks.gpu_peak("NVIDIA H100 80GB HBM3", "bf16").flops == pytest.approx(989.4e12)
    assert peaks.gpu_peak("NVIDIA H100 PCIe", "bf16").flops == pytest.approx(756e12)
    assert peaks.gpu_peak("NVIDIA H100 NVL", "fp16").flops == pytest.approx(835.5e12)
    assert peaks.gpu_peak("Tesla V100-SXM2-16GB", "fp16").flops == pytest.approx(125e12)
    assert peaks.gpu_peak("Tesla V100-PCIE-16GB", "fp16").flops == pytest.approx(112e12)
    assert peaks.gpu_peak("AMD Instinct MI300X", "bf16").flops == pytest.approx(1307.4e12)
    assert peaks.gpu_peak("NVIDIA L40S", "fp32").flops == pytest.approx(91.6e12)
    assert peaks.gpu_peak("NVIDIA H200", "bf16").flops == pytest.approx(989.4e12)
    assert peaks.gpu_peak("NVIDIA B200", "bf16").flops == pytest.approx(2250e12)


def test_unknown_device_or_precision_has_no_peak():
    assert peaks.gpu_peak("Some Future GPU", "bf16") is None
    assert peaks.gpu_peak("Tesla V100-SXM2-16GB", "bf16") is None  # V100 has no bf16


def test_every_row_has_a_source():
    for row in peaks.GPU_PEAKS:
        assert row.source and row.tflops and all(v > 0 for v in row.tflops.values())


def test_cpu_isa_estimate_by_hand():
    # 2 cores x 2.0 GHz x 64 FLOP/cycle (AVX-512, 2 FMA) = 256 GFLOP/s
    p = peaks.cpu_isa_peak({"avx512f": True}, 2, 2.0)
    assert p.flops == pytest.approx(256e9)
    assert peaks.cpu_isa_peak({"avx2": True, "fma": True}, 4, 3.0).flops == pytest.approx(384e9)
    assert peaks.cpu_isa_peak({"avx512f": True}, 2, None) is None


def test_measured_cpu_gemm_peak_is_physical():
    p = peaks.measured_cpu_gemm_peak("fp32", n=256, reps=2)
    assert p.kind == "measured"
    assert 1e8 < p.flops < 1e14  # between 0.1 GFLOP/s and 100 TFLOP/s on any CPU
