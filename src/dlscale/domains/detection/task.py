"""Detection time to quality: train a torchvision detector to a COCO box mAP@[.5:.95] target.

The data is the COCO 2017 layout (``annotations/instances_{train,val}2017.json``, ``train2017/``,
``val2017/``): COCO itself, or the shapes dataset ``dlscale dataset detection DIR`` makes
(``detection_coco``). Category ids, sparse in COCO (1..90 with gaps), become labels 1..K for the
model (0 is torchvision's background) and go back to the file's ids for scoring. Training flips
each image horizontally with probability 1/2; crowd and degenerate boxes do not train. The metric
is pycocotools' COCOeval over every validation image (``map``, with ``map50`` and ``map75``): each
rank detects on its share of the images and the detections of all ranks are scored together.

The default model is ``detector_tiny`` (an FCOS on a four-stage CNN, domains/detection/workload.py) at the
made images' 64 px; it reaches the default target of 0.7 in about two minutes on two CPU cores
(epochs 10-11 of 20; the attainable value is 1.0 and 20 epochs end near 0.82).
Every detection workload trains; those built for COCO's 91 classes keep them (labels 1..K fit).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dlscale.errors import UsageError
from dlscale.format import fmt_count
from dlscale.tta.tasks import EpochContext, Task, TaskData, register

REAL_SIZE = 800  # images of unequal sizes (COCO itself) train at MLPerf RetinaNet's 800 px
EVAL_BATCH = 32
MLPERF_TARGET = 0.340  # closed_retinanet.yaml: eval_accuracy >= 0.340


@dataclass
class DetectionData(TaskData):
    """Both splits as read, the category mapping and the size the model trains at."""

    train: Any = None  # detection_coco.Split
    val: Any = None
    category_ids: tuple[int, ...] = ()  # label k (1..K) is category_ids[k - 1]
    image_size: int = 64


def _image_size(sizes: list[tuple[int, int]]) -> int:
    """The made data's one square size (up to a multiple of 32, as the detectors pad), else REAL_SIZE."""
    if len(set(sizes)) == 1 and sizes[0][0] == sizes[0][1]:
        return max(32, -(-sizes[0][0] // 32) * 32)
    return REAL_SIZE


def _load_image(path: Any) -> Any:
    """A 3 x H x W float image in [0, 1] (grey JPEGs, common in COCO, become 3 channels)."""
    import torch
    from torchvision.io import ImageReadMode, decode_image

    try:
        return decode_image(str(path), mode=ImageReadMode.RGB).to(torch.float32) / 255
    except RuntimeError as e:
        raise UsageError(f"{path}: not a readable image: {e}") from None


def _masks(polygons: list[Any], width: int, height: int) -> Any:
    """Instance masks (n x H x W uint8) from COCO segmentations, for mask-predicting models."""
    import numpy as np
    import torch
    from pycocotools import mask as cmask

    out = []
    for seg in polygons:
        if isinstance(seg, list):
            rle = cmask.merge(cmask.frPyObjects(seg, height, width))
        elif isinstance(seg, dict) and isinstance(seg.get("counts"), list):
            rle = cmask.frPyObjects(seg, height, width)
        else:
            rle = seg
        out.append(cmask.decode(rle))
    return torch.from_numpy(np.stack(out)).to(torch.uint8) if out else torch.zeros(0, height, width, dtype=torch.uint8)


class DetectionTask(Task):
    family = "detection"
    metric = "map"
    metric_label = "mAP@[.5:.95]"
    metric_unit = "fraction"
    library = "pycocotools"
    default_model = "detector_tiny"
    default_target = 0.7  # seed 0: epoch 11 of 20 (cosine); the run ends near 0.82 (METRICS.md)
    default_optimizer = "adam"  # MLPerf RetinaNet's optimizer (closed division: adam, weight decay 0)
    default_lr = 3e-3
    default_weight_decay = 0.0
    default_batch_size = 8
    default_max_epochs = 20
    default_lr_schedule = "cosine"
    mlperf_benchmark = "retinanet"
    mlperf_ruleset = "5.1.0"
    dataset_help = ("Shapes (circle, square, triangle) on textured 64 px backgrounds in the COCO 2017 layout: "
                    "annotations/instances_{train,val}2017.json with boxes and polygon masks, train2017/ and "
                    "val2017/ JPEGs; 512 train + 128 val images at --scale 1. Boxes are exact, so mAP 1.0 "
                    "is attainable.")

    # -- data -------------------------------------------------------------------------------------
    def make_dataset(self, root: str, seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
        from dlscale.domains.detection.coco import make_shapes

        return make_shapes(root, seed=seed, scale=scale)

    def made_size(self, scale: float) -> str:
        from dlscale.domains.detection.coco import IMAGE_SIZE, TRAIN_IMAGES, VAL_IMAGES

        return (f"{max(2, round(TRAIN_IMAGES * scale)):,} train + {max(2, round(VAL_IMAGES * scale)):,} val images "
                f"of {IMAGE_SIZE} px")

    def open(self, data: str, cfg: Any) -> DetectionData:
        """Read and check both splits (COCO 2017 layout, made or real); val's categories must be train's."""
        from pathlib import Path

        from dlscale.domains.detection.coco import ann_path, read_split

        if not Path(data).is_dir():
            raise UsageError(f"--data {data}: no such directory (the COCO 2017 layout; "
                             "`dlscale dataset detection DIR` makes one)")
        train = read_split(data, "train")
        ids = tuple(sorted({c["id"] for c in train.doc["categories"]}))
        val = read_split(data, "val", {c: i + 1 for i, c in enumerate(ids)})
        if not train.files or not any(train.boxes):
            raise UsageError(f"{ann_path(data, 'train')}: no images with boxes to train on")
        if not val.doc["annotations"]:
            raise UsageError(f"{ann_path(data, 'val')}: no annotations: mAP needs ground-truth boxes")
        size = _image_size(train.sizes + val.sizes)
        n_boxes = sum(len(b) for b in train.boxes)
        describe = (f"COCO layout, {len(train.files)} train ({fmt_count(n_boxes, 'box', 'boxes')}) + {len(val.files)} "
                    f"val images, {fmt_count(len(ids), 'category', 'categories')}, {size} px")
        info = {"layout": "COCO 2017", "categories": len(ids), "train_boxes": n_boxes, "image_size": size,
                "made": "dlscale shapes" in str(train.doc.get("info", {}).get("description", ""))}
        return DetectionData(root=str(data), n_train=len(train.files), n_eval=len(val.files), describe=describe,
                             info=info, train=train, val=val, category_ids=ids, image_size=size)

    # -- model and training -----------------------------------------------------------------------
    def build_model(self, cfg: Any, data: DetectionData) -> Any:
        """The detection workload at the data's size, with K + 1 classes where its builder takes a count."""
        import inspect

        from dlscale import workloads

        w = workloads.get(cfg.model)
        if "num_classes" in inspect.signature(w.builder).parameters:
            return w.builder(data.image_size, num_classes=len(data.category_ids) + 1)
        if len(data.category_ids) + 1 > w.num_classes:
            raise UsageError(f"{cfg.model} predicts {fmt_count(w.num_classes - 1, 'category', 'categories')}; --data has "
                             f"{len(data.category_ids)}: use detector_tiny, which is sized to the data")
        return w.builder(data.image_size)

    def steps_per_epoch(self, data: DetectionData, cfg: Any) -> int:
        return max(1, data.n_train // (cfg.batch_size * cfg.world_size))

    def batches(self, data: DetectionData, model: Any, ctx: EpochContext) -> Iterator[Any]:
        """Shuffled (the order from the run's seed and epoch, shared by all ranks), each rank its slice."""
        import numpy as np

        from dlscale import workloads

        cfg = ctx.cfg
        masks = getattr(workloads.get(cfg.model), "masks", False)
        flips = np.random.default_rng(ctx.seed)
        for idx in ctx.rank_indices(data.n_train, cfg.batch_size, self.steps_per_epoch(data, cfg)):
            images, targets = [], []
            for i in idx:
                image, target = self._sample(data.train, int(i), masks)
                if flips.random() < 0.5:
                    image, target = _hflip(image, target)
                images.append(image.to(ctx.device))
                targets.append({k: v.to(ctx.device) for k, v in target.items()})
            yield images, targets

    @staticmethod
    def _sample(split: Any, i: int, masks: bool) -> tuple[Any, dict[str, Any]]:
        import torch

        image = _load_image(split.files[i])
        target = {"boxes": torch.tensor(split.boxes[i], dtype=torch.float32).reshape(-1, 4),
                  "labels": torch.tensor(split.labels[i], dtype=torch.int64)}
        if masks:
            target["masks"] = _masks(split.polygons[i], image.shape[2], image.shape[1])
        return image, target

    def loss(self, model: Any, batch: Any) -> Any:
        """The sum of the detector's losses (classification, box regression, centerness or masks)."""
        images, targets = batch
        return sum(model(images, targets).values())

    def units(self, batch: Any) -> int:
        return len(batch[0])

    def evaluate_shard(self, model: Any, data: DetectionData, ctx: EpochContext) -> list[tuple[int, list[Any]]]:
        """This rank's detections: (image index, COCO result dicts) for its validation images, boxes
        back to (x, y, w, h) and the file's ids (mAP is no sum over images: the predictions go to
        ``combine``)."""
        import contextlib

        import torch

        val, mine = data.val, list(ctx.shard(len(data.val.files)))
        out: list[tuple[int, list[Any]]] = []
        amp = (torch.autocast(ctx.device.type, dtype=ctx.amp) if ctx.amp is not None else contextlib.nullcontext())
        for start in range(0, len(mine), EVAL_BATCH):
            idx = mine[start:start + EVAL_BATCH]
            with amp:
                outs = model([_load_image(val.files[i]).to(ctx.device) for i in idx])
            for i, o in zip(idx, outs):
                boxes = o["boxes"].float().cpu()
                boxes[:, 2:] -= boxes[:, :2]
                out.append((i, [{"image_id": val.image_ids[i], "category_id": data.category_ids[lab - 1],
                                 "bbox": [round(v, 2) for v in b], "score": round(s, 5)}
                                for b, s, lab in zip(boxes.tolist(), o["scores"].float().cpu().tolist(),
                                                     o["labels"].tolist())
                                if 1 <= lab <= len(data.category_ids)]))
        return out

    def combine(self, parts: list[list[tuple[int, list[Any]]]], data: DetectionData) -> dict[str, float]:
        """COCOeval box mAP over every rank's detections, taken in image order (as one rank makes them)."""
        from dlscale.domains.detection.coco import coco_map

        return coco_map(data.val.doc, [r for _, rs in sorted((x for part in parts for x in part), key=lambda x: x[0]) for r in rs])

    # -- MLPerf -----------------------------------------------------------------------------------
    def mlperf_hparams(self, cfg: Any, peak_lr: float, data: TaskData, steps_per_epoch: int) -> dict[str, Any]:
        """closed_retinanet.yaml's optimizer keys; the warm-up is linear from (almost) zero, hence factor 0."""
        return {"opt_name": cfg.optimizer, "opt_base_learning_rate": peak_lr,
                "opt_weight_decay": cfg.weight_decay,
                "opt_learning_rate_warmup_epochs": float(getattr(cfg, "warmup_epochs", 0.0) or 0.0),
                "opt_learning_rate_warmup_factor": 0.0}

    def closed_division_problems(self, cfg: Any, peak_lr: float, data: TaskData,
                                 steps_per_epoch: int) -> list[str]:
        """What keeps this run out of MLPerf's closed RetinaNet (training 5.1.0: closed_retinanet.yaml)."""
        problems = []
        if cfg.model != "retinanet":
            problems.append(f"model {cfg.model} is not RetinaNet (closed: RetinaNet, ResNeXt50-32x4d FPN backbone)")
        else:
            problems.append("model: dlscale's retinanet has a ResNet-50 backbone; closed trains ResNeXt50-32x4d")
        if cfg.optimizer != "adam":
            problems.append(f"optimizer {cfg.optimizer} is not adam (closed: opt_name adam)")
        if cfg.weight_decay != 0:
            problems.append(f"weight decay {cfg.weight_decay} is not 0 (closed: opt_weight_decay 0.0)")
        if cfg.target < MLPERF_TARGET:
            problems.append(f"target mAP {cfg.target} is below the closed target {MLPERF_TARGET}")
        problems.append("data: closed trains on MLPerf's OpenImages subset (264 classes) at 800x800")
        return problems


def _hflip(image: Any, target: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The image mirrored left-right, its boxes (x1, x2 -> W - x2, W - x1) and masks with it."""
    width = image.shape[-1]
    boxes = target["boxes"].clone()
    boxes[:, [0, 2]] = width - target["boxes"][:, [2, 0]]
    out = {**target, "boxes": boxes}
    if "masks" in target:
        out["masks"] = target["masks"].flip(-1)
    return image.flip(-1), out


register(DetectionTask())
