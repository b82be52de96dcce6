"""What a workload is, and the registry that finds one by name.

A workload says only what it runs and how much work one step is: it builds a model, makes a
synthetic batch, and computes the loss. Timing, synchronisation, statistics and recording
belong to the harness. Registering a workload adds it to the CLI and to the registry smoke test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlscale.errors import UsageError

if TYPE_CHECKING:  # torch is imported only when a workload is built
    import torch


@dataclass(frozen=True)
class Workload:
    """An image-classification model trained with cross-entropy on synthetic images.

    ``builder(num_classes)`` returns a randomly initialised ``nn.Module`` (weights are never
    downloaded). ``min_image_size`` is the smallest input the architecture accepts.
    """

    name: str
    builder: Callable[[int], "torch.nn.Module"]
    source: str  # "torchvision" | "timm" | "dlscale"
    native_image_size: int
    min_image_size: int
    description: str
    num_classes: int = 1000
    sample_unit: str = "images"
    channels: int = 3

    def build(self) -> "torch.nn.Module":
        return self.builder(self.num_classes)

    def make_batch(self, batch_size: int, image_size: int, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """A random batch, made once and kept on the device (synthetic data)."""
        import torch

        if str(device) == "meta":  # shapes only, for FLOP counting
            x = torch.empty(batch_size, self.channels, image_size, image_size, device="meta")
            return x, torch.zeros(batch_size, dtype=torch.long, device="meta")
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, self.channels, image_size, image_size, generator=g)
        y = torch.randint(0, self.num_classes, (batch_size,), generator=g)
        return x.to(device), y.to(device)

    def loss(self, output: Any, target: Any) -> Any:
        import torch.nn.functional as F

        if isinstance(output, tuple):  # (logits, aux...) from models built with aux heads
            output = output[0]
        return F.cross_entropy(output, target)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name, "source": self.source, "native_image_size": self.native_image_size,
            "min_image_size": self.min_image_size, "num_classes": self.num_classes,
            "sample_unit": self.sample_unit, "description": self.description,
        }


_REGISTRY: dict[str, Workload] = {}


def register(w: Workload) -> Workload:
    if w.name in _REGISTRY:
        raise ValueError(f"workload {w.name!r} registered twice")
    _REGISTRY[w.name] = w
    return w


def _load_builtin() -> None:
    # Importing the modules registers their workloads; no torch import happens here.
    from dlscale.workloads import tinycnn, vision  # noqa: F401


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get(name: str) -> Workload:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; known models: {', '.join(sorted(_REGISTRY))}") from None


def all_workloads() -> list[Workload]:
    _load_builtin()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]
