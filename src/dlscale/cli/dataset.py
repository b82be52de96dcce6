"""``dlscale dataset make DIR``: write a synthetic JPEG dataset in the ImageNet layout."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dlscale.cli.common import Format, FormatOpt, info, out, print_json

app = typer.Typer(help="Make datasets for input-pipeline and storage runs (nothing is downloaded).", no_args_is_help=True)


@app.command("make", help="Write DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg: smooth random images, "
             "JPEG-encoded, widths varying around --size.\n\nExample: dlscale dataset make /tmp/imgs --images 2000 --classes 10 --size 224")
def make(
    root: Annotated[str, typer.Argument(help="Directory to write (created if missing).", show_default=False)],
    images: Annotated[int, typer.Option("--images", "-n", help="Training images in total, split evenly over classes.")] = 1000,
    classes: Annotated[int, typer.Option("--classes", "-k", help="Number of classes (sub-folders).")] = 10,
    size: Annotated[int, typer.Option("--size", help="Image height in pixels; widths vary from 3:4 to 4:3.")] = 224,
    val_images: Annotated[Optional[int], typer.Option("--val-images", help="Validation images (default: a tenth of --images, at least one per class).", show_default=False)] = None,
    quality: Annotated[int, typer.Option("--quality", help="JPEG quality, 1-100.")] = 90,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the image content.")] = 0,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.data.synth import DatasetSpec, make_dataset

    spec = DatasetSpec(images=images, classes=classes, size=size, val_images=val_images, quality=quality, seed=seed)
    info(f"dlscale dataset make {root}: {spec.images} train + {spec.n_val} val images, {classes} classes, {size}px")
    summary = make_dataset(root, spec)
    if fmt == Format.json:
        print_json(summary)
        return
    for split in ("train", "val"):
        s = summary[split]
        out.print(f"{split}: {s['images']} images, {s['bytes'] / 1e6:.1f} MB, "
                  f"{s['bytes'] / max(1, s['images']) / 1e3:.1f} kB mean, in {root}/{split}/<class>/")
