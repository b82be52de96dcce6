"""The resource monitor: time series, counters to rates, summaries, InfiniBand and NFS readers, the
CPUs' clock and temperature, the GPU's readings through a fake NVML."""

from __future__ import annotations

import os

import pytest

from dlscale.monitor.sampler import Monitor, summarize, to_series
from dlscale.monitor.sources import InfinibandSource, parse_mountstats

from conftest import requires_cuda


def test_time_series_exists_ordered_and_rates_non_negative(tmp_path):
    with Monitor(0.05) as m:
        i = 0
        while i < 6 or m.now() < 0.3:  # disk writes and CPU work for several intervals, however fast the machine
            i += 1
            p = tmp_path / f"f{i % 6}"
            p.write_bytes(os.urandom(1 << 18))
            with open(p, "rb+") as f:
                os.fsync(f.fileno())
            sum(range(200_000))
    s = m.series()
    cols = s["columns"]
    t = cols["t_s"]
    assert len(t) >= 2 and all(b > a for a, b in zip(t, t[1:]))
    for k in ("disk_read_MBps", "disk_write_MBps", "net_send_MBps", "net_recv_MBps", "proc_cpu_cores"):
        assert len(cols[k]) == len(t)
        assert all(v is None or v >= 0 for v in cols[k]), k
    assert all(v > 0 for v in cols["proc_rss_bytes"])
    metrics, units = summarize(s)
    assert metrics["monitor_samples"] == len(t) and units["monitor_disk_write_MBps_mean"] == "MB/s"
    assert metrics["monitor_proc_cpu_cores_max"] >= metrics["monitor_proc_cpu_cores_mean"] >= 0


def test_counters_become_rates_between_samples():
    samples = [
        (0.0, {"disk_read_bytes": 0.0, "proc_cpu_seconds": 10.0, "cpu_total_pct": 5.0}),
        (2.0, {"disk_read_bytes": 4e6, "proc_cpu_seconds": 13.0, "cpu_total_pct": 50.0}),
        (3.0, {"disk_read_bytes": 1e6, "proc_cpu_seconds": 13.5, "cpu_total_pct": 70.0}),  # counter reset
    ]
    cols = to_series(samples, 1.0)["columns"]
    assert cols["t_s"] == [2.0, 3.0]
    assert cols["disk_read_MBps"] == [pytest.approx(2.0), None]  # 4 MB over 2 s; a reset gives no rate
    assert cols["proc_cpu_cores"] == [pytest.approx(1.5), pytest.approx(0.5)]  # CPU-seconds per second
    assert cols["cpu_total_pct"] == [50.0, 70.0]  # gauges as read


def test_summary_over_the_measured_window():
    series = {"interval_s": 1.0, "columns": {"t_s": [1.0, 2.0, 3.0, 4.0], "gpu_power_W": [100.0, 300.0, 500.0, 50.0]}}
    m, u = summarize(series, window=(1.5, 3.0))
    assert m["monitor_gpu_power_W_mean"] == pytest.approx(400.0) and m["monitor_gpu_power_W_max"] == 500.0
    assert m["monitor_samples"] == 2 and u["monitor_gpu_power_W_mean"] == "W"
    m, _ = summarize(series, window=(10.0, 11.0))  # shorter than an interval: all rows
    assert m["monitor_samples"] == 4


def test_gpu_energy_is_the_difference_over_the_run():
    samples = [(0.0, {"gpu_energy_J": 1000.0}), (1.0, {"gpu_energy_J": 1250.0}), (2.0, {"gpu_energy_J": 1600.0})]
    s = to_series(samples, 1.0)
    assert s["gpu_energy_J"] == 600.0
    assert summarize(s)[0]["monitor_gpu_energy"] == 600.0


def test_infiniband_counters_are_four_byte_words(tmp_path):
    for dev, x, r in (("mlx5_0", 100, 50), ("mlx5_1", 1, 2)):
        c = tmp_path / dev / "ports" / "1" / "counters"
        c.mkdir(parents=True)
        (c / "port_xmit_data").write_text(f"{x}\n")
        (c / "port_rcv_data").write_text(f"{r}\n")
    src = InfinibandSource(str(tmp_path))
    assert bool(src) and src.read() == {"ib_xmit_bytes": 404.0, "ib_rcv_bytes": 208.0}
    assert not InfinibandSource(str(tmp_path / "none"))


MOUNTSTATS = """device rootfs mounted on / with fstype rootfs
device server:/export mounted on /data with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.2
\tbytes:\t1000\t200\t30\t4\t1030\t204\t10\t2
device other:/x mounted on /x with fstype nfs statvers=1.1
\tbytes:\t5\t6\t7\t8\t0\t0\t0\t0
device /dev/vda mounted on /work with fstype ext4
\tbytes:\t999\t999\t999\t999
"""


def test_nfs_mountstats_bytes_are_normal_plus_direct():
    assert parse_mountstats(MOUNTSTATS) == {"nfs_read_bytes": 1000 + 30 + 5 + 7, "nfs_write_bytes": 200 + 4 + 6 + 8}


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        Monitor(0)


@requires_cuda
def test_nvml_gpu_series():
    with Monitor(0.1, gpu_index=0) as m:
        import torch

        a = torch.randn(2048, 2048, device="cuda")
        for _ in range(50):
            a = a @ a / 2048
        torch.cuda.synchronize()
    cols = m.series()["columns"]
    assert not m.notes
    assert all(0 <= v <= 100 for v in cols["gpu_util_pct"]) and all(v > 0 for v in cols["gpu_power_W"])


def test_process_tree_includes_children():
    import subprocess
    import sys

    from dlscale.monitor.sources import HostSource
    from dlscale.procs import descendants

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants(os.getpid())
        src = HostSource(os.getpid())
        assert child.pid in [p.pid for p in src._tree()]
        vals = src.read()
        assert vals["children_cpu_seconds"] >= 0 and vals["proc_cpu_seconds"] >= vals["children_cpu_seconds"]
    finally:
        child.kill()
        child.wait()


def test_gpu_series_and_health_on_a_fake_gpu(monkeypatch):
    """CUDA device 0 is NVML GPU 1 (CUDA_VISIBLE_DEVICES=1); it throttles and raises an Xid mid-run."""
    from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28)])
    cuda_from_host(monkeypatch, host, visible=[1])
    m = Monitor(10.0, gpu_index=0).start()  # samples at start and stop only
    host.gpus[1].throttle = 0x80  # power brake
    host.xid(1, 79)
    m.stop()
    cols = m.series()["columns"]
    assert cols["gpu_power_W"] == [650.0] and cols["gpu_util_pct"] == [90.0]
    rep = m.series()["health"]
    assert rep["nvml_index"] == 1 and rep["matched_by"] == "UUID" and rep["mig_instance"] is None
    assert rep["throttle_samples"] == {"hw_power_brake_slowdown": 1} and rep["xid_events"] == [79]
    assert any("hw_power_brake_slowdown in 1 of 2 samples" in n for n in m.notes)
    assert any("Xid 79" in n for n in m.notes)


def test_a_broken_health_probe_does_not_stop_the_monitor(monkeypatch):
    from fakes_gpu import cuda_from_host, fake_nvml

    host = fake_nvml(monkeypatch)
    cuda_from_host(monkeypatch, host)
    host.fail["nvmlEventSetCreate"] = OSError("no events here")
    host.fail["nvmlDeviceGetRemappedRows"] = ValueError("odd")
    with Monitor(10.0, gpu_index=0) as m:
        pass
    assert any("no events here" in n for n in m.notes) and any("odd" in n for n in m.notes)
    assert m.series()["columns"]["gpu_power_W"] == [650.0]


def test_a_mig_instance_is_monitored_as_itself_not_as_its_gpu(monkeypatch):
    """CUDA device 0 is MIG instance 1 of NVML GPU 1: its series is the instance's memory, and the
    utilisation NVML refuses on MIG does not take the other GPU readings down with it."""
    from fakes_gpu import FakeGpu, FakeMig, cuda_from_mig, fake_nvml

    mig = [FakeMig("MIG-aaaaaaaa-1111-2222-3333-444455556666", memory_used=1 * 2**30),
           FakeMig("MIG-bbbbbbbb-1111-2222-3333-444455556666", memory_used=7 * 2**30)]
    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18), FakeGpu(bus=0x28, mig=mig)])
    cuda_from_mig(monkeypatch, host, [(1, 1)])
    with Monitor(10.0, gpu_index=0) as m:
        pass
    cols, rep = m.series()["columns"], m.series()["health"]
    assert (rep["nvml_index"], rep["mig_instance"], rep["matched_by"]) == (1, 1, "UUID")
    assert cols["gpu_mem_used_bytes"] == [7.0 * 2**30]  # the instance's, not the GPU's 10 GiB
    assert "gpu_util_pct" not in cols and "gpu_power_W" not in cols  # NVML has no such figures per instance
    assert cols["gpu_sm_clock_MHz"] == [1755.0]
    said = [n for n in m.notes if "does not support utilisation" in n]
    assert len(said) == 1 and "NVML GPU 1 MIG instance 1" in said[0]  # once, not once per sample
    assert not any("stopped" in n for n in m.notes)


def test_a_reading_nvml_does_not_support_leaves_the_others(monkeypatch):
    from fakes_gpu import NOT_SUPPORTED, FakeNVMLError, cuda_from_host, fake_nvml

    host = fake_nvml(monkeypatch)
    cuda_from_host(monkeypatch, host)
    host.fail["nvmlDeviceGetUtilizationRates"] = FakeNVMLError(NOT_SUPPORTED)
    host.fail["nvmlDeviceGetPowerUsage"] = FakeNVMLError(999)  # another NVML error: left out of that sample
    m = Monitor(10.0, gpu_index=0).start()
    m.stop()
    cols = m.series()["columns"]
    assert "gpu_util_pct" not in cols and "gpu_power_W" not in cols
    assert cols["gpu_mem_used_bytes"] == [10.0 * 2**30] and cols["gpu_mem_clock_MHz"] == [1755.0]
    assert host.calls.count("nvmlDeviceGetUtilizationRates") == 1  # not asked again once unsupported
    assert host.calls.count("nvmlDeviceGetPowerUsage") == 2
    assert len([n for n in m.notes if "power" in n]) == 1


def test_the_cpu_clock_and_temperature_come_from_sysfs_else_cpuinfo_else_a_note(tmp_path):
    from dlscale.monitor.cpu import CpuClockSource

    for c, khz in ((0, 2_000_000), (1, 3_000_000)):
        d = tmp_path / f"a/sys/devices/system/cpu/cpu{c}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_cur_freq").write_text(f"{khz}\n")
    zone = tmp_path / "a/sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("x86_pkg_temp\n")
    (zone / "temp").write_text("61000\n")
    src = CpuClockSource([0, 1], root=str(tmp_path / "a"))
    assert src.read() == {"cpu_clock_MHz": 2500.0, "cpu_temp_C": 61.0} and src.notes == []

    (tmp_path / "b/proc").mkdir(parents=True)
    (tmp_path / "b/proc/cpuinfo").write_text("processor\t: 0\ncpu MHz\t\t: 2599.998\n\nprocessor\t: 1\n"
                                             "cpu MHz\t\t: 2400.002\n")
    src = CpuClockSource([1], root=str(tmp_path / "b"))
    assert src.read() == {"cpu_clock_MHz": 2400.002}
    assert any("/proc/cpuinfo" in n for n in src.notes) and any("temperature not recorded" in n for n in src.notes)

    src = CpuClockSource([0], root=str(tmp_path / "empty"))
    assert src.read() == {} and any("clock not recorded" in n for n in src.notes)


def test_the_gpu_monitor_records_temperature(monkeypatch):
    from fakes_gpu import FakeGpu, cuda_from_host, fake_nvml

    host = fake_nvml(monkeypatch, gpus=[FakeGpu(bus=0x18, temp_c=71)])
    cuda_from_host(monkeypatch, host)
    with Monitor(10.0, gpu_index=0) as m:
        pass
    assert m.series()["columns"]["gpu_temp_C"] == [71.0]
