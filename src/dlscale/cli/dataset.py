"""``dlscale dataset make DIR``: write a synthetic JPEG dataset in the ImageNet layout."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dlscale.cli.common import Format, FormatOpt, info, out, print_json
from dlscale.format import fmt_count

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
    info(f"dlscale dataset make {root}: {spec.images} train + {spec.n_val} val images, {fmt_count(classes, 'class', 'classes')}, {size}px")
    summary = make_dataset(root, spec)
    if fmt == Format.json:
        print_json(summary)
        return
    for split in ("train", "val"):
        s = summary[split]
        out.print(f"{split}: {fmt_count(s['images'], 'image')}, {s['bytes'] / 1e6:.1f} MB, "
                  f"{s['bytes'] / max(1, s['images']) / 1e3:.1f} kB mean, in {root}/{split}/<class>/")


DOMAIN_HELP = {
    "detection": "Write a COCO-2017-layout detection set (annotations/instances_{train,val}2017.json, train2017/ and "
                 "val2017/ JPEGs): shapes on textured backgrounds with boxes and masks, for `dlscale tta` to a COCO mAP.",
    "translation": "Write a parallel corpus ({train,val}.{src,tgt}, one sentence a line, and tokenizer.json): "
                   "sentences of a random grammar and their translation by a fixed dictionary with local reordering, "
                   "for `dlscale tta` to a BLEU score.",
    "recommendation": "Write implicit feedback from planted user/item factors as a MovieLens ratings.csv, for "
                      "`dlscale tta` to HR@10 (leave-one-out, 99 sampled negatives).",
    "llm": "Write text of a probabilistic grammar with a known entropy rate as JSONL shards (train/, val/) and "
           "tokenizer.json, for `dlscale tta` to a validation log-perplexity.",
    "reinforcement": "Reinforcement learning needs no dataset: `dlscale tta ppo_mlp --data CartPole-v1` trains in a "
                     "gymnasium environment (this command says so and exits 2).",
}


def _domain_command(domain: str) -> None:
    def make_domain(
        root: Annotated[str, typer.Argument(help="Directory to write (created if missing).", show_default=False)],
        seed: Annotated[int, typer.Option("--seed", help="Seed of everything in the dataset (same seed, same bytes).")] = 0,
        scale: Annotated[float, typer.Option("--scale", help="Multiply the dataset's default size by this.")] = 1.0,
        fmt: FormatOpt = Format.human,
    ) -> None:
        from dlscale.tta import tasks

        task = tasks.get(domain)
        task.check_made(scale)
        info(f"dlscale dataset {domain} {root}: seed {seed}, scale {scale:g} ({task.made_size(scale)})")
        summary = task.write_dataset(root, seed=seed, scale=scale)
        if fmt == Format.json:
            print_json(summary)
            return
        for k, v in summary.items():
            out.print(f"{k}: {v}")
        out.print(f"train to it: dlscale tta {task.default_model} --data {root}  (default target: "
                  f"{task.metric_label} {task.default_target:g})")

    app.command(domain, help=DOMAIN_HELP[domain] + f"\n\nExample: dlscale dataset {domain} /tmp/{domain}")(make_domain)


for _domain in DOMAIN_HELP:
    _domain_command(_domain)
