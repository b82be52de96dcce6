"""The peak table (exact names, dense figures, sources), the CPU peaks and the one peak resolver."""

import json
import re

import pytest

from dlscale import gpus, peaks
from fakes_gpu import fake_cuda

# (device name as the driver reports it, precision, dense TFLOP/s from the row's datasheet)
DATASHEET = [
    ("Tesla V100-PCIE-16GB", "fp16", 112.0), ("Tesla V100-PCIE-32GB", "fp32", 14.0),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0), ("Tesla V100-SXM2-32GB", "fp32", 15.7),
    ("NVIDIA A100-PCIE-40GB", "bf16", 312.0), ("NVIDIA A100 80GB PCIe", "tf32", 156.0),
    ("NVIDIA A100-SXM4-40GB", "fp32", 19.5), ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H100 PCIe", "fp32", 51.0),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5), ("NVIDIA H100 80GB HBM3", "tf32", 494.5),
    ("NVIDIA H100 NVL", "fp16", 835.5), ("NVIDIA H100 NVL", "fp32", 60.0),
    ("NVIDIA H200", "bf16", 989.5), ("NVIDIA H200", "fp8", 1979.0),
    ("NVIDIA H200 NVL", "bf16", 835.5), ("NVIDIA H200 NVL", "fp32", 60.0),
    ("NVIDIA GH200 480GB", "bf16", 989.5), ("NVIDIA GH200 480GB", "fp32", 67.0),
    ("NVIDIA B200", "bf16", 2250.0), ("NVIDIA B200", "tf32", 1125.0), ("NVIDIA B200", "fp32", 75.0),
    ("AMD Instinct MI300X", "bf16", 1307.4), ("AMD Instinct MI300X", "fp32", 163.4),
    ("AMD Instinct MI325X", "fp16", 1307.4), ("AMD Instinct MI325X", "fp32", 163.4),
    ("NVIDIA L40S", "bf16", 362.05), ("NVIDIA L40S", "fp32", 91.6),
    ("Tesla P100-PCIE-16GB", "fp32", 9.3), ("Tesla P100-SXM2-16GB", "fp16", 21.2), ("Tesla T4", "fp16", 65.0),
]


@pytest.mark.parametrize("name,precision,tflops", DATASHEET)
def test_datasheet_peaks_by_exact_name(name, precision, tflops):
    p = peaks.gpu_peak(name, precision)
    assert p is not None and p.kind == "datasheet"
    assert p.flops == pytest.approx(tflops * 1e12)


def test_h200_variants_do_not_share_the_h200_sxm_row():
    sxm = gpus.find("NVIDIA H200")
    assert sxm.label == "NVIDIA H200 SXM"
    for other in ("NVIDIA GH200 480GB", "NVIDIA H200 NVL"):
        assert gpus.find(other) is not sxm and gpus.find(other) is not None
    assert gpus.find("NVIDIA H200 NVL").label == "NVIDIA H200 NVL"
    assert gpus.find("NVIDIA GH200 480GB").label == "NVIDIA GH200"
    assert "H200 SXM" not in peaks.gpu_peak("NVIDIA H200 NVL", "bf16").source


def test_only_case_and_whitespace_are_normalised():
    assert peaks.gpu_peak("  nvidia   h100 PCIe ", "bf16").flops == pytest.approx(756.5e12)
    for near_miss in ("NVIDIA H100", "H100 PCIe", "NVIDIA H100 PCIe MIG 1g.10gb", "NVIDIA GH200", "NVIDIA H200-NVL"):
        assert peaks.gpu_peak(near_miss, "bf16") is None, near_miss


def test_unknown_device_or_precision_has_no_peak_and_a_reason():
    assert peaks.gpu_peak("Some Future GPU", "bf16") is None
    assert peaks.gpu_peak_reason("Some Future GPU", "bf16") == (
        "no datasheet peak for 'Some Future GPU' in dlscale's table: MFU and % of peak left empty")
    assert peaks.gpu_peak("Tesla V100-SXM2-16GB", "bf16") is None  # V100 has no bf16
    assert "no bf16 peak" in peaks.gpu_peak_reason("Tesla V100-SXM2-16GB", "bf16")


def test_pci_device_id_places_a_renamed_board():
    p = peaks.gpu_peak("NVIDIA H100 SXM5 80GB (new driver name)", "bf16", pci_id=0x2330)
    assert p.flops == pytest.approx(989.5e12) and "0x2330" in p.source
    assert peaks.gpu_peak("NVIDIA H100 SXM5 80GB (new driver name)", "bf16", pci_id=0xFFFF) is None


def test_every_row_names_its_datasheet_and_year_and_dense_figures():
    seen: set[str] = set()
    for row in (g for g in gpus.table().gpus if g.tflops):
        source = row.source("tflops")
        assert row.names and row.tflops and all(v > 0 for v in row.tflops.values())
        assert re.search(r"\((?:19|20)\d\d\b", source), source  # a publication year
        assert "datasheet" in source.lower() or "data sheet" in source.lower() \
            or "specifications" in source.lower()
        assert not seen & {gpus.normalize_name(n) for n in row.names}
        seen |= {gpus.normalize_name(n) for n in row.names}
        assert set(row.tflops) <= {"fp32", "tf32", "bf16", "fp16", "fp8"}


def test_cpu_isa_estimate_by_hand():
    # 2 cores x 2.0 GHz x 64 FLOP/cycle (AVX-512, 2 FMA) = 256 GFLOP/s
    p = peaks.cpu_isa_peak({"avx512f": True}, 2, 2.0)
    assert p.flops == pytest.approx(256e9)
    assert peaks.cpu_isa_peak({"avx2": True, "fma": True}, 4, 3.0).flops == pytest.approx(384e9)
    assert peaks.cpu_isa_peak({"avx512f": True}, 2, None) is None


def test_measured_cpu_gemm_peak_is_physical():
    p = peaks.measured_cpu_gemm_peak("fp32", n=256, reps=2)
    assert p.kind == "measured-gemm"
    assert 1e8 < p.flops < 1e14  # between 0.1 GFLOP/s and 100 TFLOP/s on any CPU


def test_the_gemm_peak_probe_stops_growing_at_its_time_budget():
    """A precision the CPU only emulates must not hold a run for minutes: with no time to spare the
    probe measures at its smallest size and says so; with time to spare it reaches n."""
    tight = peaks.measured_cpu_gemm_peak("fp32", n=512, reps=2, budget_s=1e-9)
    assert tight.source.startswith("best of 2 256x256x256 fp32") and "within the probe's 1e-09 s budget" in tight.source
    roomy = peaks.measured_cpu_gemm_peak("fp32", n=512, reps=2, budget_s=1e9)
    assert roomy.source.startswith("best of 2 512x512x512 fp32") and "budget" not in roomy.source


CPU_SYSTEM = {"cpu": {"model": "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", "nominal_ghz": 2.4, "physical_cores": 2,
                      "isa": {"avx512f": True}}}


def test_resolver_on_cpu_measured_gemm_with_isa_beside(monkeypatch):
    import torch

    monkeypatch.setitem(peaks._MEASURED, ("torch.float32", 2048, torch.get_num_threads(), peaks.PROBE_BUDGET_S),
                        peaks.Peak(1e11, "measured-gemm", "best of 5 ..."))
    r = peaks.resolve_peak(torch.device("cpu"), "fp32", CPU_SYSTEM)
    assert (r.flops, r.kind) == (1e11, "measured-gemm")
    assert r.isa_flops == pytest.approx(2 * 2.4e9 * 64)  # 2 cores x 2.4 GHz x 64 FLOP/cycle


def test_resolver_on_cpu_isa_estimate_and_its_reasons():
    import torch

    cpu = torch.device("cpu")
    r = peaks.resolve_peak(cpu, "fp32", CPU_SYSTEM, measure=False)
    assert r.kind == "isa-estimate" and r.flops == pytest.approx(307.2e9) and "the CPU model name" in r.source
    r = peaks.resolve_peak(cpu, "fp32", CPU_SYSTEM, cpu_ghz=2.0, measure=False)
    assert r.flops == pytest.approx(256e9) and "--cpu-ghz 2" in r.source
    r = peaks.resolve_peak(cpu, "bf16", CPU_SYSTEM, measure=False)
    assert r.flops is None and r.kind is None and "only fp32" in r.source


def test_resolver_on_gpu_uses_the_exact_name(monkeypatch):
    import torch

    fake_cuda(monkeypatch, ["NVIDIA GH200 480GB", "Mystery GPU"])
    r = peaks.resolve_peak(torch.device("cuda", 0), "bf16", {})
    assert r.kind == "datasheet" and r.flops == pytest.approx(989.5e12) and "GH200" in r.source
    r = peaks.resolve_peak(torch.device("cuda", 1), "bf16", {})
    assert r.flops is None and r.kind is None
    assert r.source.startswith("no datasheet peak for 'Mystery GPU' in dlscale's table")
    system = {"accelerators": {"topology": {"gpus": [{"index": 1, "pci_device_id": 0x20B2}]}}}
    assert peaks.resolve_peak(torch.device("cuda", 1), "bf16", system).flops == pytest.approx(312e12)


def test_short_test_records_which_peak_mfu_used(cli, db_path):
    res = cli("train", "tinycnn", "--batch-size", "4", "--warmup-steps", "1", "--steps", "2", "--format", "json")
    assert res.code == 0, res.stderr
    m = json.loads(res.stdout)["metrics"]
    assert m["peak_kind"] == "measured-gemm" and m["peak_flops"] > 0 and "torch.matmul" in m["peak_flops_source"]
