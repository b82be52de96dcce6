"""``dlscale dataset make``: a synthetic JPEG dataset in the ImageNet folder layout.

``ROOT/train/<class>/*.jpg`` and ``ROOT/val/<class>/*.jpg``. Each image is a smooth random
field (a coarse random grid upsampled bilinearly, tinted per class) plus fine noise, so JPEG
files have a realistic size and decode cost (a plain noise image compresses badly; a flat one
decodes for free). Widths vary around ``size`` (aspect 3:4 to 4:3) like photographs do, so
RandomResizedCrop has real work. Nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import UsageError


@dataclass(frozen=True)
class DatasetSpec:
    images: int  # training images in total (split evenly over classes)
    classes: int
    size: int  # image height in pixels; widths vary around it
    val_images: int | None = None  # default: images // 10, at least one per class
    quality: int = 90
    seed: int = 0

    def __post_init__(self) -> None:
        if self.classes < 1:
            raise UsageError(f"--classes must be >= 1, got {self.classes}")
        if self.images < self.classes:
            raise UsageError(f"--images {self.images} is fewer than --classes {self.classes}; use at least one image per class")
        if self.size < 16:
            raise UsageError(f"--size must be >= 16 pixels, got {self.size}")
        if self.val_images is not None and self.val_images < 0:
            raise UsageError(f"--val-images must be >= 0, got {self.val_images}")
        if not 1 <= self.quality <= 100:
            raise UsageError(f"--quality must be in 1..100, got {self.quality}")

    @property
    def n_val(self) -> int:
        return self.val_images if self.val_images is not None else max(self.classes, self.images // 10)


def class_name(k: int) -> str:
    return f"c{k:04d}"


def _image(g, k: int, size: int):
    """One uint8 CHW image of class k (a smooth field tinted by class, plus fine noise)."""
    import torch
    import torch.nn.functional as F

    aspect = 0.75 + 0.583 * torch.rand(1, generator=g).item()  # 3:4 .. 4:3
    h, w = size, max(16, int(round(size * aspect)))
    coarse = torch.rand(1, 3, 6, 6, generator=g)
    field = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)[0]
    hue = torch.tensor([(k * 0.37) % 1.0, (k * 0.61) % 1.0, (k * 0.13) % 1.0]).view(3, 1, 1)
    img = 0.6 * field + 0.4 * hue + 0.06 * torch.randn(3, h, w, generator=g)
    return (img.clamp(0, 1) * 255).to(torch.uint8)


def make_dataset(root: str | Path, spec: DatasetSpec, on_file=None) -> dict:
    """Write the dataset; returns counts and bytes written per split."""
    import torch

    from dlscale.paths import make_dir

    root = make_dir(root)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one small image at a time: threads only contend
    try:
        return _write(root, spec, on_file)
    finally:
        torch.set_num_threads(threads)


def _write(root: Path, spec: DatasetSpec, on_file) -> dict:
    import torch
    from torchvision.io import encode_jpeg

    g = torch.Generator().manual_seed(spec.seed)
    summary: dict = {"root": str(root), "classes": spec.classes, "size": spec.size}
    for split, n in (("train", spec.images), ("val", spec.n_val)):
        total = 0
        for k in range(spec.classes):
            (root / split / class_name(k)).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            k = i % spec.classes
            data = encode_jpeg(_image(g, k, spec.size), quality=spec.quality)
            path = root / split / class_name(k) / f"{split}_{i:07d}.jpg"
            path.write_bytes(data.numpy().tobytes())
            total += data.numel()
            if on_file:
                on_file(split, i + 1, n)
        summary[split] = {"images": n, "bytes": total}
    return summary
