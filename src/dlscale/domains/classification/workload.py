"""Image classification's workloads: ``ImageClassifier`` (synthetic images, cross-entropy) and the
seed papers' model zoo, from torchvision and timm, randomly initialised.

Inception-v3 and GoogLeNet are built without their auxiliary classifier heads: the short test
measures the main network (as tf_cnn_benchmarks' synthetic runs do); the heads add <5% FLOPs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlscale.workloads.base import Workload, check_image_size, register

if TYPE_CHECKING:  # torch is imported only when a model is built
    import torch


@dataclass(frozen=True)
class ImageClassifier(Workload):
    """An image-classification model trained with cross-entropy on synthetic images.

    ``builder(num_classes)`` returns a randomly initialised ``nn.Module`` (weights are never
    downloaded). ``min_image_size`` is the smallest input the architecture accepts.
    """

    name: str
    builder: Callable[[int], "torch.nn.Module"]
    source: str
    native_image_size: int
    min_image_size: int
    description: str
    num_classes: int = 1000
    channels: int = 3
    family: str = "classification"
    images_in: bool = True

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        if cfg.image_size is not None:
            check_image_size(self, cfg.image_size)

    def resolve(self, cfg: Any) -> dict[str, Any]:
        return {"image_size": cfg.image_size or self.native_image_size}

    def build(self, cfg: Any = None) -> "torch.nn.Module":
        return self.builder(self.num_classes)

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        return self.image_batch(cfg.batch_size, cfg.image_size or self.native_image_size, device, seed)

    def image_batch(self, batch_size: int, image_size: int, device: Any, seed: int = 0) -> tuple[Any, Any]:
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
        return {**super().describe(), "native_image_size": self.native_image_size,
                "min_image_size": self.min_image_size, "num_classes": self.num_classes}

    def smoke_shape(self) -> dict[str, Any]:
        return {"batch_size": 2, "image_size": self.min_image_size}

    def default_shape(self) -> str:
        return f"{self.native_image_size}px (min {self.min_image_size}), {self.num_classes} classes"



def _tv(fn_name: str, **kw):
    def build(num_classes: int):
        import torchvision.models as tvm

        return getattr(tvm, fn_name)(weights=None, num_classes=num_classes, **kw)

    return build


def _timm(model_name: str):
    def build(num_classes: int):
        import timm

        return timm.create_model(model_name, pretrained=False, num_classes=num_classes)

    return build


register(ImageClassifier("resnet50", _tv("resnet50"), "torchvision", 224, 32,
                  "ResNet-50 v1.5 (stride on the 3x3 conv), 25.6M parameters"))
register(ImageClassifier("resnet18", _tv("resnet18"), "torchvision", 224, 32, "ResNet-18, 11.7M parameters"))
register(ImageClassifier("vgg16", _tv("vgg16"), "torchvision", 224, 32, "VGG-16 (no batch norm), 138M parameters"))
register(ImageClassifier("vgg19", _tv("vgg19"), "torchvision", 224, 32, "VGG-19 (no batch norm), 144M parameters"))
register(ImageClassifier("alexnet", _tv("alexnet"), "torchvision", 224, 63,
                  "AlexNet (torchvision's one-GPU variant), 61M parameters"))
register(ImageClassifier("googlenet", _tv("googlenet", aux_logits=False, init_weights=True), "torchvision", 224, 32,
                  "GoogLeNet (Inception-v1), no auxiliary heads, 6.6M parameters"))
register(ImageClassifier("inception_v3", _tv("inception_v3", aux_logits=False, init_weights=True), "torchvision", 299, 75,
                  "Inception-v3, no auxiliary head, 23.8M parameters"))
register(ImageClassifier("inception_v4", _timm("inception_v4"), "timm", 299, 75, "Inception-v4 (timm), 42.7M parameters"))
