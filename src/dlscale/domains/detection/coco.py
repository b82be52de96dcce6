"""The COCO 2017 layout for detection time-to-quality runs: the made shapes dataset, its reader, COCO mAP.

``make_shapes`` writes ``ROOT/annotations/instances_{train,val}2017.json`` and the JPEGs under
``ROOT/train2017`` and ``ROOT/val2017``: circles, squares and triangles (3 categories, ids 1..3) in
random colours on textured backgrounds (a random colour plus pixel noise, some with sinusoidal
stripes at a random angle), 1 to 3 shapes an image, wholly inside it and apart from one another
(their boxes, grown by 2 px, do not meet). Each annotation holds the shape's polygon
(``segmentation``), its pixel ``area`` (the pixels the polygon fills) and its ``bbox`` as the extent
of those pixels, so a box is exactly determined by the image: a perfect detector scores mAP 1.0.
Everything follows from the seed (numpy's PCG64) and the JPEG encoder is deterministic, so the same
seed writes the same bytes.

``read_split`` reads one split of the layout, made or real (COCO 2017 itself), and checks it: a
malformed JSON file, a missing key, an annotation naming an unknown image or category, a listed
image file that is missing are each a UsageError naming the file (and line) and the fault.
``coco_map`` scores detections with pycocotools' COCOeval (bbox), the reference implementation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError, json_problem
from dlscale.paths import make_dir
from dlscale.tta.tasks import layout_error

CATEGORIES = ("circle", "square", "triangle")
SPLITS = ("train", "val")
IMAGE_SIZE = 64
TRAIN_IMAGES = 512  # at scale 1
VAL_IMAGES = 128
MIN_SIDE, MAX_SIDE = 12, 28  # shape sizes in pixels
MAX_SHAPES = 3
QUALITY = 95


def ann_path(root: str | Path, split: str) -> Path:
    return Path(root) / "annotations" / f"instances_{split}2017.json"


# -- making ---------------------------------------------------------------------------------------------


def _background(rng: Any, size: int) -> Any:
    """A textured H x W x 3 float image: a random colour, stripes at a random angle (half the images), noise."""
    import numpy as np

    base = rng.uniform(40, 215, 3)
    img = np.broadcast_to(base, (size, size, 3)).copy()
    if rng.random() < 0.5:
        angle, period = rng.uniform(0, np.pi), rng.uniform(4, 16)
        yy, xx = np.mgrid[0:size, 0:size]
        wave = np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period)
        img += rng.uniform(15, 35) * wave[..., None] * rng.choice([-1.0, 1.0], 3)
    img += rng.normal(0, rng.uniform(4, 14), (size, size, 3))
    return img


def _polygon(kind: str, x: float, y: float, side: float) -> list[float]:
    """The outline of one shape in the box at (x, y) with side ``side``, as COCO's flat [x1, y1, x2, y2, ...]."""
    import math

    if kind == "square":
        pts = [(x, y), (x + side, y), (x + side, y + side), (x, y + side)]
    elif kind == "triangle":
        pts = [(x + side / 2, y), (x + side, y + side), (x, y + side)]
    else:  # a circle as a 24-gon
        r = side / 2
        pts = [(x + r + r * math.cos(2 * math.pi * k / 24), y + r + r * math.sin(2 * math.pi * k / 24))
               for k in range(24)]
    return [round(float(c), 2) for p in pts for c in p]


def _place(rng: Any, size: int, boxes: list[tuple[float, float, float]]) -> tuple[float, float, float] | None:
    """A (x, y, side) square inside the image that keeps 2 px from ``boxes``; None after 50 tries."""
    for _ in range(50):
        side = float(rng.integers(MIN_SIDE, MAX_SIDE + 1))
        x, y = (float(v) for v in rng.integers(1, size - int(side) - 1, 2))
        if all(x + side + 2 <= bx or bx + bs + 2 <= x or y + side + 2 <= by or by + bs + 2 <= y
               for bx, by, bs in boxes):
            return x, y, side
    return None


def _make_image(rng: Any, size: int, image_id: int, next_ann: int) -> tuple[Any, list[dict[str, Any]]]:
    """One image (uint8 H x W x 3) and its annotations (ids from ``next_ann``)."""
    import numpy as np
    from PIL import Image, ImageDraw

    img, anns, placed = _background(rng, size), [], []
    for _ in range(int(rng.integers(1, MAX_SHAPES + 1))):
        where = _place(rng, size, placed)
        if where is None:
            continue
        placed.append(where)
        cat = int(rng.integers(len(CATEGORIES)))
        poly = _polygon(CATEGORIES[cat], *where)
        canvas = Image.new("L", (size, size), 0)
        ImageDraw.Draw(canvas).polygon(list(zip(poly[::2], poly[1::2])), fill=1)
        mask = np.asarray(canvas, dtype=bool)
        colour = rng.uniform(0, 255, 3)
        while np.abs(colour - img[mask].mean(0)).max() < 80:  # stands out from what lies beneath
            colour = rng.uniform(0, 255, 3)
        img[mask] = colour + rng.normal(0, 4, (int(mask.sum()), 3))
        ys, xs = np.nonzero(mask)
        x0, y0 = int(xs.min()), int(ys.min())
        anns.append({"id": next_ann + len(anns), "image_id": image_id, "category_id": cat + 1,
                     "bbox": [x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0], "area": int(mask.sum()),
                     "iscrowd": 0, "segmentation": [poly]})
    return np.clip(img, 0, 255).round().astype(np.uint8), anns


def make_shapes(root: str | Path, seed: int = 0, scale: float = 1.0, size: int = IMAGE_SIZE) -> dict[str, Any]:
    """Write the shapes dataset in the COCO 2017 layout under ``root``; a summary (counts per split)."""
    import numpy as np
    from PIL import Image

    root = Path(root)
    rng = np.random.default_rng(seed)
    cats = [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(CATEGORIES)]
    summary: dict[str, Any] = {"dataset": "dlscale-shapes", "layout": "COCO 2017", "seed": seed, "scale": scale,
                               "image_size": size, "categories": list(CATEGORIES)}
    image_id, ann_id = 1, 1
    for split, n in (("train", TRAIN_IMAGES), ("val", VAL_IMAGES)):
        folder = make_dir(root / f"{split}2017")
        make_dir(root / "annotations")
        images, anns = [], []
        for _ in range(max(2, round(n * scale))):
            pixels, new = _make_image(rng, size, image_id, ann_id)
            name = f"{image_id:012d}.jpg"
            Image.fromarray(pixels).save(folder / name, quality=QUALITY)
            images.append({"id": image_id, "file_name": name, "width": size, "height": size})
            anns += new
            image_id, ann_id = image_id + 1, ann_id + len(new)
        doc = {"info": {"description": f"dlscale shapes, seed {seed}, scale {scale}"}, "licenses": [],
               "images": images, "annotations": anns, "categories": cats}
        ann_path(root, split).write_text(json.dumps(doc, indent=1) + "\n")
        summary[split] = {"images": len(images), "annotations": len(anns)}
    return summary


# -- reading --------------------------------------------------------------------------------------------


@dataclass
class Split:
    """One split as read: image files, their boxes (x1, y1, x2, y2, trainable ones), labels, the raw JSON."""

    path: Path  # the annotation file
    files: list[Path] = field(default_factory=list)
    image_ids: list[int] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (width, height)
    boxes: list[list[list[float]]] = field(default_factory=list)
    labels: list[list[int]] = field(default_factory=list)  # contiguous 1..K
    polygons: list[list[Any]] = field(default_factory=list)  # segmentation of each kept box
    doc: dict[str, Any] = field(default_factory=dict)


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"{path}: missing; --data must hold the COCO 2017 layout (annotations/instances_"
                         "{train,val}2017.json, train2017/, val2017/); `dlscale dataset detection DIR` makes one")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise layout_error(path, e.lineno, f"malformed JSON: {json_problem(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise layout_error(path, None, f"unreadable: {e}") from None
    if not isinstance(doc, dict):
        raise layout_error(path, None, "not a COCO annotation file: the top level must be an object")
    for key in ("images", "annotations", "categories"):
        if not isinstance(doc.get(key), list):
            raise layout_error(path, None, f"no {key!r} list: not a COCO annotation file")
    return doc


def _need(path: Path, what: str, n: int, item: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(item, dict):
        raise layout_error(path, None, f"{what} {n} is not an object")
    missing = [k for k in keys if k not in item]
    if missing:
        raise layout_error(path, None, f"{what} {n} lacks {', '.join(repr(k) for k in missing)}")


def read_categories(path: Path, doc: dict[str, Any]) -> list[int]:
    """The sorted category ids of an annotation file (COCO's are sparse: 1..90 with gaps)."""
    for n, c in enumerate(doc["categories"]):
        _need(path, "category", n, c, ("id", "name"))
    return sorted(int(c["id"]) for c in doc["categories"])


def read_split(root: str | Path, split: str, label_of: dict[int, int] | None = None) -> Split:
    """Read and check one split; ``label_of`` maps category ids to labels 1..K (from this file if None)."""
    path = ann_path(root, split)
    doc = _load_json(path)
    ids = read_categories(path, doc)
    label_of = label_of or {c: i + 1 for i, c in enumerate(ids)}
    out, index = Split(path=path, doc=doc), {}
    for n, im in enumerate(doc["images"]):
        _need(path, "image", n, im, ("id", "file_name", "width", "height"))
        f = Path(root) / f"{split}2017" / str(im["file_name"])
        if not f.is_file():
            raise UsageError(f"{f}: missing: {path} lists it (image {n}, id {im['id']})")
        index[im["id"]] = len(out.files)
        out.files.append(f)
        out.image_ids.append(im["id"])
        out.sizes.append((int(im["width"]), int(im["height"])))
        out.boxes.append([]), out.labels.append([]), out.polygons.append([])
    for n, a in enumerate(doc["annotations"]):
        _need(path, "annotation", n, a, ("image_id", "category_id", "bbox"))
        if a["image_id"] not in index:
            raise layout_error(path, None, f"annotation {n} names image_id {a['image_id']}, which no image has")
        if a["category_id"] not in label_of:
            raise layout_error(path, None, f"annotation {n} names category_id {a['category_id']}, which is not "
                                           "among the categories" + (" of the train split" if split != "train" else ""))
        bbox = a["bbox"]
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            raise layout_error(path, None, f"annotation {n}: bbox must be [x, y, width, height], got {bbox!r}")
        x, y, w, h = (float(v) for v in bbox)
        if a.get("iscrowd", 0) or w < 1 or h < 1:  # crowds and degenerate boxes do not train (COCOeval sees them)
            continue
        i = index[a["image_id"]]
        out.boxes[i].append([x, y, x + w, y + h])
        out.labels[i].append(label_of[a["category_id"]])
        out.polygons[i].append(a.get("segmentation"))
    return out


# -- scoring --------------------------------------------------------------------------------------------


def coco_map(gt_doc: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, float]:
    """COCO box mAP@[.5:.95], @.5 and @.75 of ``results`` (COCO result dicts) against ``gt_doc``.

    No detections at all scores 0 (pycocotools cannot load an empty result list); pycocotools'
    progress printing is silenced.
    """
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not results:
        return {"map": 0.0, "map50": 0.0, "map75": 0.0, "detections": 0}
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = gt_doc
        gt.createIndex()
        dt = gt.loadRes(results)
        ev = COCOeval(gt, dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    s = [max(0.0, float(v)) for v in ev.stats[:3]]  # -1: no ground truth in that range
    return {"map": s[0], "map50": s[1], "map75": s[2], "detections": len(results)}
