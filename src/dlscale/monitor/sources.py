"""What the monitor reads: counters from psutil, NVML, InfiniBand sysfs and NFS mountstats.

Each source is a small object with ``read() -> dict[str, float]`` of *cumulative* counters or
instantaneous gauges; the sampler turns counters into rates between samples. A source that is
absent on this machine (no GPU, no HCA, no NFS mount) is simply not built; one that fails while
running is dropped with a warning rather than stopping the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlscale.monitor import nvml
from dlscale.monitor.cpu import CpuClockSource
from dlscale.procs import descendants

MB = 1e6

# Counters (monotonic totals): the sampler reports (b - a) / dt in the unit named here.
COUNTERS = {
    "disk_read_bytes": ("disk_read_MBps", MB),
    "disk_write_bytes": ("disk_write_MBps", MB),
    "net_sent_bytes": ("net_send_MBps", MB),
    "net_recv_bytes": ("net_recv_MBps", MB),
    "proc_cpu_seconds": ("proc_cpu_cores", 1.0),
    "children_cpu_seconds": ("children_cpu_cores", 1.0),
    "ib_xmit_bytes": ("ib_xmit_MBps", MB),
    "ib_rcv_bytes": ("ib_rcv_MBps", MB),
    "nfs_read_bytes": ("nfs_read_MBps", MB),
    "nfs_write_bytes": ("nfs_write_MBps", MB),
}


class HostSource:
    """CPU, memory, disk and network through psutil; the process tree of ``pid`` (workers included)."""

    def __init__(self, pid: int):
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self._procs: dict[int, Any] = {}
        self._dead_cpu = 0.0  # CPU seconds of tree members that have exited
        self._last_cpu: dict[int, float] = {}
        psutil.cpu_percent(None)  # primes the system-wide counter

    def _tree(self) -> list[Any]:
        """The root and its descendants. /proc/PID/task/TID/children lists a thread's children
        directly (~0.1 ms); psutil's children() scans every process on the machine (~3 ms), so it
        is only the fallback where the kernel lacks that file."""
        pids = descendants(self.root.pid)
        if pids is None:
            try:
                return [self.root, *self.root.children(recursive=True)]
            except self.psutil.Error:
                return [self.root]
        procs = [self.root]
        for pid in pids:
            if pid not in self._procs:
                try:
                    self._procs[pid] = self.psutil.Process(pid)
                except self.psutil.Error:
                    continue
            procs.append(self._procs[pid])
        self._procs = {p.pid: p for p in procs[1:]}
        return procs

    def read(self) -> dict[str, float]:
        ps = self.psutil
        cpu_s, rss, seen = 0.0, 0, {}
        kids_s = 0.0
        for p in self._tree():
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    c = t.user + t.system
                    rss += p.memory_info().rss
            except ps.Error:
                continue
            seen[p.pid] = c
            cpu_s += c
            kids_s += c if p.pid != self.root.pid else 0.0
        for pid, c in self._last_cpu.items():  # keep the CPU time of exited members
            if pid not in seen:
                self._dead_cpu += c
        self._last_cpu = seen
        vals = {
            "cpu_total_pct": ps.cpu_percent(None),
            "proc_cpu_seconds": cpu_s + self._dead_cpu,
            "children_cpu_seconds": kids_s + self._dead_cpu,  # loader workers and any other children
            "proc_rss_bytes": float(rss),
            "mem_used_bytes": float(ps.virtual_memory().used),
        }
        d = ps.disk_io_counters()
        if d is not None:
            vals["disk_read_bytes"] = float(d.read_bytes)
            vals["disk_write_bytes"] = float(d.write_bytes)
        n = ps.net_io_counters()
        if n is not None:
            vals["net_sent_bytes"] = float(n.bytes_sent)
            vals["net_recv_bytes"] = float(n.bytes_recv)
        return vals


class InfinibandSource:
    """Port data counters under /sys/class/infiniband (in 4-byte words, summed over ports)."""

    def __init__(self, root: str = "/sys/class/infiniband"):
        self.ports = sorted(Path(root).glob("*/ports/*/counters"))

    def __bool__(self) -> bool:
        return bool(self.ports)

    def read(self) -> dict[str, float]:
        x = r = 0
        for c in self.ports:
            x += int((c / "port_xmit_data").read_text())
            r += int((c / "port_rcv_data").read_text())
        return {"ib_xmit_bytes": 4.0 * x, "ib_rcv_bytes": 4.0 * r}


def parse_mountstats(text: str) -> dict[str, float]:
    """Bytes read/written by NFS mounts: the 'bytes:' line of each nfs device in /proc/self/mountstats.

    Its fields are normalread normalwrite directread directwrite serverread serverwrite ...;
    the application-level totals are normal + direct.
    """
    read = write = 0
    in_nfs = False
    for line in text.splitlines():
        if line.startswith("device "):
            in_nfs = " with fstype nfs" in line
        elif in_nfs and line.strip().startswith("bytes:"):
            f = [int(v) for v in line.split()[1:]]
            read += f[0] + f[2]
            write += f[1] + f[3]
    return {"nfs_read_bytes": float(read), "nfs_write_bytes": float(write)}


class NfsSource:
    PATH = "/proc/self/mountstats"

    def __init__(self) -> None:
        try:
            self.present = " with fstype nfs" in Path(self.PATH).read_text()
        except OSError:
            self.present = False

    def __bool__(self) -> bool:
        return self.present

    def read(self) -> dict[str, float]:
        return parse_mountstats(Path(self.PATH).read_text())


class NvmlSource:
    """GPU utilisation, memory, power, energy, clocks, temperature and PCIe throughput through NVML.

    Each reading is asked for on its own: one that NVML does not support on this device (utilisation
    on a MIG instance or on a GPU in MIG mode, energy before Volta, PCIe counters on an SXM board) is
    left out of the series for the rest of the run with one note, and the others go on. Another NVML
    error leaves that reading out of this sample (one note per reading and error); anything that is
    not an NVML error stops the source, as for every source."""

    def __init__(self, index: int, notes: list[str] | None = None):
        nv = nvml.start()
        if nv is None:
            raise RuntimeError("pynvml is not installed or NVML did not initialise (no NVIDIA driver?)")
        found: list[str] = []
        gpu = nvml.cuda_handle(nv, index, found)
        if gpu is None:
            raise RuntimeError("; ".join(found) or f"no NVML device for CUDA device {index}")
        self.nv, self.h, self.gpu = nv, gpu.handle, gpu
        self.notes = notes if notes is not None else []
        self.unsupported: set[str] = set()
        self._said: set[tuple[str, int | None]] = set()

    def _readings(self) -> dict[str, Any]:
        nv, h = self.nv, self.h

        def util() -> dict[str, float]:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return {"gpu_util_pct": float(u.gpu), "gpu_mem_util_pct": float(u.memory)}

        return {
            "utilisation": util,
            "memory used": lambda: {"gpu_mem_used_bytes": float(nv.nvmlDeviceGetMemoryInfo(h).used)},
            "power": lambda: {"gpu_power_W": nv.nvmlDeviceGetPowerUsage(h) / 1e3},
            "SM clock": lambda: {"gpu_sm_clock_MHz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))},
            "memory clock": lambda: {"gpu_mem_clock_MHz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))},
            "temperature": lambda: {"gpu_temp_C": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))},
            "energy": lambda: {"gpu_energy_J": nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3},
            "PCIe TX": lambda: {"gpu_pcie_tx_MBps":
                                nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1e3 / MB},
            "PCIe RX": lambda: {"gpu_pcie_rx_MBps":
                                nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1e3 / MB},
        }

    def read(self) -> dict[str, float]:
        vals: dict[str, float] = {}
        for what, fn in self._readings().items():
            if what in self.unsupported:
                continue
            try:
                vals.update(fn())
            except self.nv.NVMLError as e:
                code = getattr(e, "value", None)
                if code == self.nv.NVML_ERROR_NOT_SUPPORTED:
                    self.unsupported.add(what)
                    self.notes.append(f"{self.gpu.label}: NVML does not support {what} on this device: "
                                      "left out of the GPU series")
                elif (what, code) not in self._said:
                    self._said.add((what, code))
                    self.notes.append(f"{self.gpu.label}: NVML {what}: {e} (left out of that sample)")
        return vals


def build_sources(pid: int | None = None, gpu_index: int | None = None,
                  cpu_clocks: bool = False) -> tuple[list[Any], list[str]]:
    """The sources present on this machine, and a note for each one that could not start
    (``cpu_clocks``: also the CPUs' clock and temperature, ``monitor.cpu``)."""
    sources: list[Any] = [HostSource(pid or os.getpid())]
    notes: list[str] = []
    if cpu_clocks:
        clocks = CpuClockSource()
        sources.append(clocks)
        notes.extend(clocks.notes)
    ib = InfinibandSource()
    if ib:
        sources.append(ib)
    nfs = NfsSource()
    if nfs:
        sources.append(nfs)
    if gpu_index is not None:
        try:
            sources.append(NvmlSource(gpu_index, notes))
        except Exception as e:  # noqa: BLE001 - NVML missing or no driver: the run goes on without GPU series
            notes.append(f"GPU monitoring unavailable (NVML: {e})")
    return sources, notes
