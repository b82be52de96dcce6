"""One CUDA device's SM clock and clock-event (throttle) reasons through NVML, sampled on demand.

The micro harness samples them while each case's timed windows run, so every row says at what
clock its figure was measured and whether the GPU was slowing itself down (monitor/health.py's
reasons). Where NVML or the device is missing, ``reason`` says why and every sample is empty.
"""

from __future__ import annotations

from typing import Any

from dlscale.monitor import health, nvml


class GpuClocks:
    def __init__(self, cuda_index: int):
        self.notes: list[str] = []
        self.nv = nvml.start()
        self.gpu = None
        self.reason: str | None = None
        if self.nv is None:
            self.reason = "NVML is not available (nvidia-ml-py not installed or no NVIDIA driver)"
            return
        self.gpu = nvml.cuda_handle(self.nv, cuda_index, self.notes)
        if self.gpu is None:
            self.reason = "; ".join(self.notes) or f"no NVML device for CUDA device {cuda_index}"

    def close(self) -> None:
        if self.nv is not None:
            nvml.stop(self.nv)
            self.nv, self.gpu = None, None

    def sample(self) -> dict[str, Any]:
        """``{"sm_clock_mhz": MHz or None, "throttle_reasons": [names] or None}`` now."""
        if self.gpu is None:
            return {"sm_clock_mhz": None, "throttle_reasons": None}
        nv, h = self.nv, self.gpu.handle
        clock = nvml.probe(nv, self.notes, f"{self.gpu.label} SM clock",
                           lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
        mask = nvml.probe(nv, self.notes, f"{self.gpu.label} clock event reasons", lambda: health.throttle_mask(nv, h))
        return {"sm_clock_mhz": clock, "throttle_reasons": None if mask is None else health.decode_reasons(mask)}


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A case's clock figures from its samples: the lowest SM clock seen and every reason seen."""
    clocks = [s["sm_clock_mhz"] for s in samples if s.get("sm_clock_mhz") is not None]
    seen = [s["throttle_reasons"] for s in samples if s.get("throttle_reasons") is not None]
    return {"sm_clock_mhz": min(clocks) if clocks else None,
            "throttle_reasons": sorted({r for rs in seen for r in rs}) if seen else None}
