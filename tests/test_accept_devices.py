"""The acceptance suite's GPU paths on this CPU machine, through the fake NVML and torch.cuda
(tests/fakes_gpu.py): GEMM and memory on every device, each rank's device identity, the health
check as a recorded run; and the per-device pieces on the CPU itself."""

from __future__ import annotations

import json

import pytest

from dlscale.errors import UsageError
from fakes_gpu import FakeGpu, cuda_from_host, fake_cuda, fake_nvml

H100 = "NVIDIA H100 80GB HBM3"


def test_gemm_on_every_device_plans_each_gpu_in_turn(monkeypatch):
    import torch

    from dlscale.micro import gemm
    from dlscale.micro.base import MicroOptions

    fake_cuda(monkeypatch, [H100] * 4)
    plan = gemm.plan(MicroOptions(precisions=("bf16",), every_device=True), torch.device("cuda", 0))
    per_device = {}
    for c in plan.cases:
        per_device.setdefault(c.labels["device"], []).append(c)
        assert c.device == torch.device(c.labels["device"])  # timed on the device it is labelled with
    assert list(per_device) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert len({len(cs) for cs in per_device.values()}) == 1  # the same shapes on every GPU
    one = gemm.plan(MicroOptions(precisions=("bf16",)), torch.device("cuda", 0))
    assert all("device" not in c.labels for c in one.cases) and len(one.cases) * 4 == len(plan.cases)


def test_gemm_summary_gives_each_devices_best_rate():
    from dlscale.micro import gemm

    rows = [{"device": f"cuda:{d}", "tflops": t, "pct_peak": None} for d, t in ((0, 600.0), (0, 650.0), (1, 590.0))]
    metrics, units = gemm.summarize(rows)
    assert metrics["devices"] == ["cuda:0", "cuda:1"] and metrics["best_tflops_by_device"] == [650.0, 590.0]
    assert units["best_tflops_by_device"] == "TFLOP/s"


def test_memory_on_every_device_copies_on_each_gpu(monkeypatch):
    import torch

    from dlscale.micro import memory
    from dlscale.micro.base import MicroOptions

    fake_cuda(monkeypatch, [H100] * 2)
    plan = memory.plan(MicroOptions(every_device=True, mem_mib=8), torch.device("cuda", 0))
    where = [(c.labels["op"], c.labels["where"], str(c.device)) for c in plan.cases if c.labels["where"] != "host memory"]
    assert ("d2d", "cuda:1", "cuda:1") in where and ("h2d_pinned", "cuda:0", "cuda:0") in where
    assert len(where) == 2 * 5  # five transfers per GPU
    rows = [{"op": op, "where": w, "gbps": 100.0 + i, "gbps_best": 110.0} for i, (op, w, _) in enumerate(where)]
    metrics, _ = memory.summarize(rows)
    assert metrics["devices"] == ["cuda:0", "cuda:1"] and metrics["d2d_gbps"] == 104.0  # the first device's
    assert metrics["d2d_gbps_by_device"] == [104.0, 109.0]


def test_every_device_is_an_option_of_gemm_and_memory_only():
    from dlscale.micro.kinds import check_options

    check_options("gemm", {"every_device": True})
    with pytest.raises(UsageError, match="micro conv does not read every_device"):
        check_options("conv", {"every_device": True})


def test_each_rank_records_its_gpu_identity(monkeypatch):
    import torch

    from dlscale.distributed.env import DistEnv
    from dlscale.distributed.worker import device_identity

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x2A)])
    cuda_from_host(monkeypatch, host)
    env = DistEnv(launcher="torchrun", rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1, nnodes=2,
                  master_addr="127.0.0.1", master_port=29500)
    ident = device_identity(env, torch.device("cuda", 1))
    assert (ident["rank"], ident["node"], ident["local_rank"], ident["device"]) == (5, 1, 1, "cuda:1")
    assert ident["device_name"] == H100 and ident["pci_bus_id"] == "00000000:2A:00.0"
    assert ident["uuid"] == host.gpus[1].uuid[4:]


def test_the_health_check_is_a_recorded_run_and_a_verdict_per_gpu(monkeypatch, db_path, tmp_path):
    from dlscale import api, system
    from dlscale.accept import acceptance as run
    from dlscale.accept.plan import spec
    from dlscale.monitor import kernlog

    (tmp_path / "kernel.log").write_text("[    5.000000] nvidia: loading out-of-tree module\n")
    monkeypatch.setenv(kernlog.KERNEL_LOG_ENV, str(tmp_path / "kernel.log"))  # no Xid since boot
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x2A, throttle=0x40)])
    cuda_from_host(monkeypatch, host)
    monkeypatch.setattr(system, "_CACHE", None)  # the inventory of the fake server
    rec = api.health(tag="acc", db=str(db_path))
    assert rec.kind == "health" and rec.status == "ok" and rec.metrics == {"gpus": 2, "health_warnings": 1}
    assert "GPU 1 is slowing its clocks now (hw_thermal_slowdown)" in rec.warnings[0]
    vs = run.judge([rec], spec.builtin(True))
    assert [(v.subject, v.status, v.reason) for v in vs] == [
        ("GPU 0", "PASS", "no throttling, ECC, retired-page, row-remap, link, limit or Xid problem"),
        ("GPU 1", "FAIL", "hw_thermal_slowdown")]


def test_parallel_none_refuses_ddp_options():
    from dlscale.config import TrainConfig

    assert TrainConfig(model="tinycnn", parallel="none").parallel == "none"
    with pytest.raises(UsageError, match="--ddp-bucket-mb is a DistributedDataParallel option; --parallel none"):
        TrainConfig(model="tinycnn", parallel="none", ddp_bucket_mb=10)


def test_gemm_every_device_on_a_cpu_labels_the_cpu(cli, db_path, tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("m,n,k,a_t,b_t\n64,32,48,0,0\n")
    r = cli("micro", "gemm", "--shapes", str(p), "--warmup", "0", "--iters", "3", "--every-device", "--format", "json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [x["device"] for x in rows if x["set"] == "user"] == ["cpu"]
    from dlscale.accept.figures import collect as figures
    from dlscale.store import Store

    with Store.open(db_path) as s:
        (rec,) = s.query(kind="micro")
    figs = figures.figures([rec])
    assert [(f.name, f.subject, len(f.samples)) for f in figs] == [("fp32 best rate", None, 3)]  # the CPU: the system's
    assert figs[0].value == max(x["tflops"] for x in rows)
