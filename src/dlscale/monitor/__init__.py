"""Resource monitoring during a run: CPU, memory, disk, network, GPU (NVML) and its health, InfiniBand, NFS."""

from dlscale.monitor.sampler import DEFAULT_INTERVAL, Monitor, summarize

__all__ = ["DEFAULT_INTERVAL", "Monitor", "summarize"]
