"""`overhead.py jpeg`: decode+augment images per second per core: dlscale's loader path vs plain PIL + torchvision.transforms.

Both decode the same JPEG files and apply the standard training transforms (RandomResizedCrop
to ``--image-size``, horizontal flip, float conversion, ImageNet normalisation), one image at a
time on one thread; rates are images per CPU-second of that thread (``time.thread_time``), so
other load on the machine does not count against either. Rounds alternate A/B then B/A. Also
prints dlscale's uint8 path (normalisation left to the device, as ``dlscale train`` does on GPUs).
The target is dlscale / PIL >= 1.0.

    python benchmarks/overhead.py jpeg                      # makes 200 synthetic 224 px JPEGs in a temp dir
    python benchmarks/overhead.py jpeg --data /path/to/imagenet --images 500
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time

import torch


def per_core(fn, items) -> float:
    c0 = time.thread_time()
    for it in items:
        fn(it)
    return len(items) / (time.thread_time() - c0)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", help="dataset root (ROOT/train/<class>/*.jpg); default: make one")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--size", type=int, default=224, help="height of the images made when --data is not given")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=4)


def run(a: argparse.Namespace) -> None:
    from arms import say_arms

    say_arms({"dlscale": "data.loader.JpegDataset (train transforms, normalised on the host), one thread",
              "PIL": "PIL decode + torchvision.transforms RandomResizedCrop, flip, ToTensor, Normalize, one thread",
              "dlscale-uint8": "JpegDataset without normalisation (left to the device), one thread; not in the ratio"})
    torch.set_num_threads(1)
    from PIL import Image
    from torchvision import transforms as T

    from dlscale.data.loader import MEAN, STD, JpegDataset, scan
    from dlscale.data.synth import DatasetSpec, make_dataset

    root = a.data
    if root is None:
        root = tempfile.mkdtemp(prefix="dlscale-decode-")
        make_dataset(root, DatasetSpec(images=a.images, classes=10, size=a.size))
    _classes, samples = scan(root, "train")
    samples = samples[: a.images]
    ours = JpegDataset(samples, a.image_size, train=True, strict=False, normalize=True)
    ours_u8 = JpegDataset(samples, a.image_size, train=True, strict=False, normalize=False)
    pil_tf = T.Compose([T.RandomResizedCrop(a.image_size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])

    def pil(path_label):
        with open(path_label.path, "rb") as f:
            img = Image.open(io.BytesIO(f.read())).convert("RGB")
        return pil_tf(img)

    idx = list(range(len(samples)))
    ours[0], ours_u8[0], pil(samples[0])  # first-call set-up outside the timing
    r_ours, r_pil, r_u8 = [], [], []
    for r in range(a.rounds):
        pair = [(r_ours, lambda: per_core(ours.__getitem__, idx)), (r_pil, lambda: per_core(pil, samples))]
        for dest, fn in (pair if r % 2 == 0 else pair[::-1]):
            dest.append(fn())
        r_u8.append(per_core(ours_u8.__getitem__, idx))
        print(f"round {r + 1}: dlscale {r_ours[-1]:.1f}  PIL {r_pil[-1]:.1f}  dlscale-uint8 {r_u8[-1]:.1f} images/s/core", flush=True)
    ratios = [x / y for x, y in zip(r_ours, r_pil)]
    mean_kb = sum(len(open(s.path, 'rb').read()) for s in samples) / len(samples) / 1e3
    print(f"{len(samples)} JPEGs ({mean_kb:.1f} kB mean) -> {a.image_size}px, {a.rounds} rounds")
    print(f"dlscale {statistics.median(r_ours):.1f}, PIL+torchvision.transforms {statistics.median(r_pil):.1f}, "
          f"dlscale uint8 {statistics.median(r_u8):.1f} images/s per core (medians)")
    print(f"ratio dlscale / PIL: median {statistics.median(ratios):.3f} (target >= 1.0); "
          f"uint8 path / PIL {statistics.median(r_u8) / statistics.median(r_pil):.3f}")

