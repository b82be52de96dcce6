"""The training input pipeline over an ImageNet-layout JPEG tree.

``build_loader(root, split, batch_size, image_size, workers)`` returns an ``ImageLoader``:
iterate it for ``(images, labels)`` batches of one epoch, or call ``forever()`` for an endless
stream over epochs (the sampler reshuffles each epoch). Decoding uses libjpeg-turbo through
``torchvision.io.decode_jpeg`` on raw bytes, and the augmentations run on uint8 tensors
(RandomResizedCrop + horizontal flip for training; resize + centre crop for evaluation), which
is about twice as fast per core as PIL + ``transforms.ToTensor`` (docs/PERFORMANCE.md).

With ``normalize=False`` batches stay uint8 (4x fewer bytes through shared memory and the PCIe
link); ``normalize_on_device`` then converts on the accelerator. A file that cannot be read or
decoded is counted and replaced by the next image (``skipped``, ``skipped_paths``), or, with
``strict=True``, fails the run with ``CorruptImage`` naming the path. Worker processes are
persistent; a batch that takes longer than ``timeout`` seconds fails instead of hanging.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.format import fmt_count

MEAN = (0.485, 0.456, 0.406)  # ImageNet channel statistics (the torchvision convention)
STD = (0.229, 0.224, 0.225)
EXTENSIONS = (".jpg", ".jpeg")
MAX_CONSECUTIVE_BAD = 16  # more unreadable files in a row than this: the dataset is broken


# torchvision 0.29 deprecates its image codecs in favour of TorchCodec, which is not a dependency
# here; its libjpeg-turbo decoder is still the fastest one installed (docs/PERFORMANCE.md).
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)


class CorruptImage(RuntimeError):
    """An image that cannot be read or decoded; the message names its path."""


def default_workers(local_world_size: int = 1) -> int:
    """One worker per core left after the training process, per local rank (at least 1, at most 16)."""
    from dlscale.system import usable_cpus

    return max(1, min(16, usable_cpus() // max(1, local_world_size) - 1))


@dataclass(frozen=True)
class Sample:
    path: str
    label: int


def scan(root: str | Path, split: str) -> tuple[list[str], list[Sample]]:
    """Classes (sorted folder names) and samples of ``root/split/<class>/*.jpg``."""
    base = Path(root) / split
    if not base.is_dir():
        raise UsageError(f"{base} is not a directory; expected the ImageNet layout ROOT/{split}/<class>/*.jpg "
                         "(make one with `dlscale dataset make ROOT`)")
    classes = sorted(d.name for d in base.iterdir() if d.is_dir())
    samples = [
        Sample(str(f), k)
        for k, c in enumerate(classes)
        for f in sorted((base / c).iterdir())
        if f.suffix.lower() in EXTENSIONS
    ]
    if not samples:
        raise UsageError(f"no JPEG files under {base}/<class>/; expected ROOT/{split}/<class>/*.jpg")
    return classes, samples


def decode(path: str) -> Any:
    """Read and decode one JPEG to a uint8 RGB CHW tensor; ``CorruptImage`` on any failure."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        with open(path, "rb") as f:
            data = bytearray(f.read())
        return decode_jpeg(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)
    except Exception as e:  # noqa: BLE001 - every read/decode failure is the same event
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        reason = reason.rsplit(", ", 1)[-1] if ".cpp:" in reason else reason  # drop the C++ source location
        raise CorruptImage(f"cannot read or decode {path}: {reason}") from None


def make_transform(image_size: int, train: bool, normalize: bool, plain_resize: bool = False) -> Any:
    import torch
    from torchvision.transforms import v2

    if plain_resize:  # tiny images (e.g. the digits): the same exact resize for every split, no augmentation
        steps = [v2.Resize((image_size, image_size), antialias=True)]
    elif train:
        steps = [v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip()]
    else:
        steps = [v2.Resize(int(round(image_size * 256 / 224)), antialias=True), v2.CenterCrop(image_size)]
    if normalize:
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose(steps)


class JpegDataset:
    """Map-style dataset: item i -> (image, label, paths skipped to get it)."""

    def __init__(self, samples: list[Sample], image_size: int, train: bool, strict: bool, normalize: bool,
                 plain_resize: bool = False):
        self.samples = samples
        self.strict = strict
        self.transform = make_transform(image_size, train, normalize, plain_resize)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int, tuple[str, ...]]:
        skipped: list[str] = []
        for k in range(MAX_CONSECUTIVE_BAD):
            s = self.samples[(i + k) % len(self.samples)]
            try:
                img = decode(s.path)
            except CorruptImage:
                if self.strict:
                    raise
                skipped.append(s.path)
                continue
            return self.transform(img), s.label, tuple(skipped)
        raise CorruptImage(f"{MAX_CONSECUTIVE_BAD} unreadable images in a row, first {skipped[0]}: "
                           "the dataset is broken")


def collate(items: list[tuple[Any, int, tuple[str, ...]]], channels_last: bool = False) -> tuple[Any, Any, tuple[str, ...]]:
    import torch

    images = torch.stack([it[0] for it in items])
    if channels_last:  # in the worker, not in the training process
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.tensor([it[1] for it in items], dtype=torch.long)
    return images, labels, tuple(p for it in items for p in it[2])


class ImageLoader:
    """A DataLoader over a JPEG tree that counts skipped files and re-raises worker errors cleanly."""

    def __init__(self, loader: Any, sampler: Any, classes: list[str], normalized: bool):
        self.loader = loader
        self.sampler = sampler
        self.classes = classes
        self.normalized = normalized
        self.skipped = 0
        self.skipped_paths: list[str] = []  # the first 20
        self.epoch = 0

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def batch_size(self) -> int:
        return self.loader.batch_size

    @property
    def workers(self) -> int:
        return self.loader.num_workers

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        it = iter(self.loader)
        while True:
            try:
                images, labels, bad = self._next(it)
            except StopIteration:
                return
            except CorruptImage as e:  # from a worker: the wrapped message ends with the original line
                raise CorruptImage(_last_line(str(e))) from None
            if bad:
                self.skipped += len(bad)
                self.skipped_paths.extend(bad[: max(0, 20 - len(self.skipped_paths))])
            yield images, labels

    def _next(self, it: Iterator) -> Any:
        if self.workers > 0:
            return next(it)
        # Decoding in this process: one thread, as in a worker (small-image ops on many
        # threads only contend; measured 5-10x slower on a loaded 2-core machine).
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return next(it)
        finally:
            torch.set_num_threads(threads)

    def forever(self) -> Iterator[tuple[Any, Any]]:
        """Batches over as many epochs as asked for."""
        while True:
            yield from self

    def close(self) -> None:
        """Stop persistent workers now rather than at garbage collection."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None


def _last_line(msg: str) -> str:
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else msg
    head, sep, rest = line.partition(f"{CorruptImage.__name__}: ")
    return rest if sep else line


def build_loader(
    root: str | Path,
    split: str,
    batch_size: int,
    image_size: int,
    workers: int | None = None,
    *,
    train: bool = True,
    strict: bool = False,
    normalize: bool = True,
    channels_last: bool = False,
    pin_memory: bool | None = None,
    distributed: tuple[int, int] | None = None,
    seed: int = 0,
    drop_last: bool | None = None,
    prefetch_factor: int | None = None,
    timeout: float = 120.0,
    plain_resize: bool = False,
) -> ImageLoader:
    """The input pipeline for ``root/split``.

    ``workers`` None: ``default_workers()``; 0 decodes in the calling process. ``channels_last``
    makes batches NHWC in the workers (the fast layout for convolutions on CPUs). ``pin_memory``
    None: on when CUDA is available (pinning without a GPU buys nothing). ``prefetch_factor``: batches
    each worker loads ahead (None: 2, torch's default). ``distributed=(rank, world_size)`` shards the samples with a
    ``DistributedSampler`` (shuffled for training, seeded). ``drop_last`` defaults to ``train``.
    ``plain_resize`` resizes every image to ``image_size`` square, no crop and no random
    augmentation, for every split (tiny images such as the digits).
    """
    import functools

    import torch
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    if batch_size < 1:
        raise UsageError(f"batch size must be >= 1, got {batch_size}")
    if image_size < 8:
        raise UsageError(f"image size must be >= 8, got {image_size}")
    workers = default_workers() if workers is None else workers
    if workers < 0:
        raise UsageError(f"--workers must be >= 0, got {workers}")
    classes, samples = scan(root, split)
    drop_last = train if drop_last is None else drop_last
    if drop_last and len(samples) < batch_size:
        raise UsageError(f"{Path(root) / split} has {fmt_count(len(samples), 'image')}, fewer than one batch of {batch_size}")
    ds = JpegDataset(samples, image_size, train, strict, normalize, plain_resize)
    g = torch.Generator().manual_seed(seed)
    if distributed is not None:
        rank, world = distributed
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=train, seed=seed, drop_last=drop_last)
    else:
        sampler = RandomSampler(ds, generator=g) if train else SequentialSampler(ds)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    loader = DataLoader(
        ds, batch_size=batch_size, sampler=sampler, num_workers=workers,
        collate_fn=functools.partial(collate, channels_last=channels_last),
        pin_memory=pin, drop_last=drop_last, generator=g,
        persistent_workers=workers > 0, prefetch_factor=(prefetch_factor or 2) if workers > 0 else None,
        timeout=timeout if workers > 0 else 0,
    )
    return ImageLoader(loader, sampler, classes, normalized=normalize)


def pipeline_options(cfg: Any, device_type: str) -> dict[str, Any]:
    """``build_loader``'s pin_memory and prefetch_factor from a TrainConfig: pinned only where batches are
    copied to a GPU (``TrainConfig.resolve`` refuses --pin-memory on CPU), prefetch as given (None: 2)."""
    pin = cfg.pin_memory if cfg.pin_memory is not None else device_type != "cpu"
    return {"pin_memory": bool(pin) and device_type != "cpu", "prefetch_factor": cfg.prefetch_factor}


_STATS: dict[str, tuple[Any, Any]] = {}


def _stats_on(device: Any) -> tuple[Any, Any]:
    """Mean and std (x255) made once per device: a new host->device copy every step would stall the host."""
    import torch

    key = str(device)
    if key not in _STATS:
        _STATS[key] = (torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255,
                       torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255)
    return _STATS[key]


def normalize_on_device(images: Any, channels_last: bool = False) -> Any:
    """uint8 NCHW batch (already on its device) -> float32 normalised with ImageNet statistics."""
    import torch

    mean, std = _stats_on(images.device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return ((images.float() - mean) / std).contiguous(memory_format=fmt)
