"""From the loader to the device: the batch source of a training step with real data.

``fetch()`` takes the next host batch from the loader and records how long the training
process waited for it (data-wait: zero when the workers are ahead, the shortfall when they are
behind); ``to_device()`` copies it (non-blocking from pinned memory on CUDA) and, where the
loader left it uint8, normalises it on the device. Only two ``perf_counter`` calls are added
per step, so the wait is measured inside the timed window without slowing it.
"""

from __future__ import annotations

import time
from typing import Any

from dlscale.data.loader import ImageLoader, build_loader, normalize_on_device, pipeline_options


class DeviceFeed:
    def __init__(self, loader: ImageLoader, device: Any, channels_last: bool):
        self.loader = loader
        self.device = device
        self.channels_last = channels_last
        self.waits: list[float] = []
        self._it = loader.forever()

    def fetch(self) -> tuple[Any, Any]:
        t0 = time.perf_counter()
        x, y = next(self._it)
        self.waits.append(time.perf_counter() - t0)
        return x, y

    def to_device(self, x: Any, y: Any) -> tuple[Any, Any]:
        if self.device.type != "cpu":
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
        if not self.loader.normalized:
            x = normalize_on_device(x, self.channels_last)
        return x, y

    def __call__(self) -> tuple[Any, Any]:
        return self.to_device(*self.fetch())

    def take_waits(self) -> list[float]:
        """The waits recorded since the last call."""
        w, self.waits = self.waits, []
        return w

    def close(self) -> None:
        self.loader.close()


def open_feed(cfg: Any, device: Any, rank: int = 0, world_size: int = 1) -> DeviceFeed:
    """The training feed for ``cfg.data`` (train split): uint8 to the device on CUDA, normalised in workers on CPU."""
    on_cpu = device.type == "cpu"
    loader = build_loader(
        cfg.data, "train", cfg.batch_size, cfg.image_size, cfg.workers, train=True, strict=cfg.strict,
        normalize=on_cpu, channels_last=cfg.channels_last, **pipeline_options(cfg, device.type),
        distributed=(rank, world_size) if world_size > 1 else None, seed=cfg.seed,
    )
    return DeviceFeed(loader, device, cfg.channels_last)
