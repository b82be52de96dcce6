"""The resource monitor: a daemon thread that samples every ``interval`` seconds during a run.

It takes one sample when started, one every interval, and one when stopped, so even a short run
has a rate over its whole length. Counters (bytes, CPU seconds) become rates between consecutive
samples, reported at the later sample's time; gauges (CPU %, RSS, GPU utilisation, power) are
reported as read. The thread sleeps on an Event, so stopping is immediate; reading psutil's
counters for a process tree takes well under a millisecond, so the default 1 s interval costs
under 0.1% of one core (`benchmarks/overhead.py monitor` measures the effect on throughput).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dlscale.monitor.health import HealthWatch, watch_gpu
from dlscale.monitor.sources import COUNTERS, build_sources

DEFAULT_INTERVAL = 1.0

UNITS = {
    "cpu_total_pct": "%", "proc_cpu_cores": "cores", "children_cpu_cores": "cores", "proc_rss_bytes": "bytes", "mem_used_bytes": "bytes",
    "disk_read_MBps": "MB/s", "disk_write_MBps": "MB/s", "net_send_MBps": "MB/s", "net_recv_MBps": "MB/s",
    "ib_xmit_MBps": "MB/s", "ib_rcv_MBps": "MB/s", "nfs_read_MBps": "MB/s", "nfs_write_MBps": "MB/s",
    "gpu_util_pct": "%", "gpu_mem_util_pct": "%", "gpu_mem_used_bytes": "bytes", "gpu_power_W": "W",
    "gpu_sm_clock_MHz": "MHz", "gpu_mem_clock_MHz": "MHz", "gpu_temp_C": "°C", "cpu_clock_MHz": "MHz",
    "cpu_temp_C": "°C", "gpu_pcie_tx_MBps": "MB/s", "gpu_pcie_rx_MBps": "MB/s",
}


class Monitor:
    """``with Monitor(1.0) as m: ...`` then ``m.series()`` and ``summarize(m.series())``."""

    def __init__(self, interval: float = DEFAULT_INTERVAL, pid: int | None = None, gpu_index: int | None = None,
                 cpu_clocks: bool = False):
        if not interval > 0:
            raise ValueError(f"monitor interval must be > 0 s, got {interval}")
        self.interval = interval
        self.sources, self.notes = build_sources(pid, gpu_index, cpu_clocks)
        # The GPU's health over the run (monitor/health.py): its warnings join ``notes`` at stop.
        self.health: HealthWatch | None = watch_gpu(gpu_index, self.notes) if gpu_index is not None else None
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0
        self.started_at = ""

    def _sample(self) -> None:
        vals: dict[str, float] = {}
        for src in list(self.sources):
            try:
                vals.update(src.read())
            except Exception as e:  # noqa: BLE001 - a source that breaks is dropped, the run goes on
                self.sources.remove(src)
                self.notes.append(f"monitor source {type(src).__name__} stopped: {type(e).__name__}: {e}")
        self._samples.append((time.monotonic() - self.t0, vals))
        if self.health is not None:
            self.health.poll()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> "Monitor":
        from datetime import datetime, timezone

        self.t0 = time.monotonic()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        if self.health is not None:
            self.health.start()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="dlscale-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10 * self.interval + 5)
        self._thread = None
        self._sample()
        if self.health is not None:
            self.health.stop()
            self.notes.extend(self.health.notes + self.health.warnings())

    def now(self) -> float:
        """Seconds since the monitor started (the time axis of the series)."""
        return time.monotonic() - self.t0

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def series(self) -> dict[str, Any]:
        """Columnar time series: ``t_s`` and one list per quantity (None where a sample lacks it)."""
        out = to_series(self._samples, self.interval, self.started_at)
        if self.health is not None:
            out["health"] = self.health.report()
        return out


def to_series(samples: list[tuple[float, dict[str, float]]], interval: float, started_at: str = "") -> dict[str, Any]:
    """Counters -> rates between consecutive samples; gauges as read. One row per sample after the first."""
    cols: dict[str, list[Any]] = {"t_s": []}
    gauge_keys = sorted({k for _, v in samples for k in v if k not in COUNTERS and k != "gpu_energy_J"})
    rate_keys = sorted({COUNTERS[k][0] for _, v in samples for k in v if k in COUNTERS})
    for k in gauge_keys + rate_keys:
        cols[k] = []
    energy = [v.get("gpu_energy_J") for _, v in samples]
    for (ta, a), (tb, b) in zip(samples, samples[1:]):
        dt = tb - ta
        if dt <= 0:
            continue
        cols["t_s"].append(round(tb, 4))
        for k in gauge_keys:
            cols[k].append(b.get(k))
        for counter, (name, scale) in COUNTERS.items():
            if name in cols:
                ok = counter in a and counter in b and b[counter] >= a[counter]  # a reset counter gives no rate
                cols[name].append((b[counter] - a[counter]) / dt / scale if ok else None)
    out: dict[str, Any] = {"interval_s": interval, "started_at": started_at, "columns": cols}
    if energy and energy[0] is not None and energy[-1] is not None:
        out["gpu_energy_J"] = energy[-1] - energy[0]
    return out


def summarize(series: dict[str, Any], window: tuple[float, float] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Mean and max of every column as ``monitor_<name>_mean`` / ``_max`` (over ``window`` if given).

    ``window`` is (start, end) on the series' time axis, e.g. the measured window; rows whose time
    falls inside it are used, or all rows if none does (a window shorter than the interval).
    """
    cols = series["columns"]
    t = cols["t_s"]
    rows = [i for i, x in enumerate(t) if window is None or window[0] <= x <= window[1] + 1e-9]
    if not rows:
        rows = list(range(len(t)))
    metrics: dict[str, Any] = {"monitor_samples": len(rows), "monitor_interval": series["interval_s"]}
    units = {"monitor_samples": "samples", "monitor_interval": "s"}
    for k, v in cols.items():
        if k == "t_s":
            continue
        vals = [v[i] for i in rows if v[i] is not None]
        if not vals:
            continue
        metrics[f"monitor_{k}_mean"] = sum(vals) / len(vals)
        metrics[f"monitor_{k}_max"] = max(vals)
        units[f"monitor_{k}_mean"] = units[f"monitor_{k}_max"] = UNITS.get(k, "")
    if "gpu_energy_J" in series:
        metrics["monitor_gpu_energy"] = series["gpu_energy_J"]
        units["monitor_gpu_energy"] = "J"
    return metrics, units
