"""Everything a short test records besides step times: the monitor, the real-data feed, the explanation.

``RunObserver`` opens the resource monitor, the energy meter (harness/energy_meter.py: the timed loop
reads it at each measured window's edges) and (with ``--data``) the loader before the first
repeat, collects each measured window's data-waits and time span, explains the last repeat
(train/phases.py) and closes workers and the sampler threads whatever happens.
"""

from __future__ import annotations

from typing import Any

from dlscale.harness.energy_meter import EnergyMeter
from dlscale.monitor import Monitor, summarize
from dlscale.train.phases import explain, process_rank


class RunObserver:
    def __init__(self, cfg: Any, device: Any, world_size: int = 1):
        self.cfg = cfg
        self.device = device
        self.world_size = world_size
        self.monitor: Monitor | None = None
        self.feed: Any = None
        self.waits: list[float] = []
        self.spans: list[tuple[float, float]] = []
        self.window_seconds = 0.0
        self.explained: tuple[dict, dict, dict, list] = ({}, {}, {}, [])
        self.meter = EnergyMeter(device)
        if cfg.monitor_interval > 0:
            gpu = (device.index or 0) if device.type == "cuda" else None
            self.monitor = Monitor(cfg.monitor_interval, gpu_index=gpu).start()
        if cfg.data:
            from dlscale.data.train_feed import open_feed

            self.feed = open_feed(cfg, device, process_rank(), world_size)

    def end_window(self, times: list[float]) -> None:
        """After a measured window: keep the waits of its steps and its span on the monitor's clock."""
        if self.feed is not None:
            waits = self.feed.take_waits()
            self.waits.extend(waits[len(waits) - len(times):])  # the warm-up fetches came first
        if self.monitor is not None:
            end = self.monitor.now()
            self.spans.append((end - sum(times), end))
        self.window_seconds += sum(times)

    def explain(self, setup: Any) -> None:
        self.explained = explain(self.cfg, setup, self.device, self.feed, self.waits, self.window_seconds,
                                 self.world_size)

    def close(self) -> None:
        self.meter.close()
        if self.feed is not None:
            self.feed.close()
        if self.monitor is not None:
            self.monitor.stop()

    def outcome(self) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], list[str]]:
        metrics, units, raw, warnings = (dict(x) if isinstance(x, dict) else list(x) for x in self.explained)
        if self.monitor is not None:
            series = self.monitor.series()
            window = (self.spans[0][0], self.spans[-1][1]) if self.spans else None
            m, u = summarize(series, window)
            metrics.update(m)
            units.update(u)
            series["measured_spans_s"] = self.spans
            raw["monitor"] = series
            warnings.extend(self.monitor.notes)
        return metrics, units, raw, warnings
