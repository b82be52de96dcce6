"""Object detection: torchvision's RetinaNet, SSD300, Mask R-CNN and SSDlite, randomly initialised.

Every model is built with ``weights=None, weights_backbone=None`` (nothing is downloaded), so the
ResNet-50 backbones are torchvision's from-scratch variant: ordinary BatchNorm and every stage
trainable (the fine-tuning recipes freeze BatchNorm and the stem instead). The models take COCO's
91 category indices (0 is background) and, in train mode, ``model(images, targets)`` returns a
dict of losses whose sum is the step's loss.

The image size asked for is the size trained. Each model's ``GeneralizedRCNNTransform`` is set up
so that a square S x S image reaches the backbone unchanged: RetinaNet and Mask R-CNN get
``min_size = max_size = S`` (scale 1) and S must be a multiple of 32, which their transform would
otherwise pad up to; the SSDs get ``fixed_size = (S, S)`` (no padding). Batches are synthetic:
random [0, 1] images and 1-4 random boxes per image (plus a filled mask per box for Mask R-CNN),
deterministic from the seed.

FLOPs cannot be counted on the meta device here (box matching, proposal sampling and NMS depend on
values), so ``flops`` counts one real training step of one image on the CPU with
``torch.utils.flop_counter`` and caches the figure per model and size for the process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlscale.errors import UsageError
from dlscale.workloads.base import Workload, check_image_size, register

if TYPE_CHECKING:
    import torch

NUM_CLASSES = 91  # torchvision's COCO convention: 0 is background, 1..90 are categories
MAX_BOXES = 4  # synthetic boxes per image: 1..MAX_BOXES
_FLOPS: dict[tuple[str, int], dict[str, Any]] = {}  # (model, image size) -> counted FLOPs, per process


def _retinanet(size: int) -> "torch.nn.Module":
    from torchvision.models.detection import retinanet_resnet50_fpn

    return retinanet_resnet50_fpn(weights=None, weights_backbone=None, num_classes=NUM_CLASSES,
                                  min_size=size, max_size=size)


def _maskrcnn(size: int) -> "torch.nn.Module":
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    return maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=NUM_CLASSES,
                                 min_size=size, max_size=size)


def _fix_size(model: Any, size: int) -> Any:
    """Make an SSD's transform resize every image to exactly ``size`` x ``size``."""
    model.transform.min_size = (size,)
    model.transform.max_size = size
    model.transform.fixed_size = (size, size)
    return model


def _ssd300(size: int) -> "torch.nn.Module":
    """SSD300 at ``size``: away from 300 the default boxes are laid on each feature map's own grid.

    torchvision's SSD300 places box centres with strides fixed for a 300 px input; at another size
    those would fall off the image, so the boxes are regenerated with the same aspect ratios and
    scales and no fixed strides (the SSD paper's rule). The head's box counts are unchanged.
    """
    from torchvision.models.detection import ssd300_vgg16
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator

    model = ssd300_vgg16(weights=None, weights_backbone=None, num_classes=NUM_CLASSES)
    if size != 300:
        old = model.anchor_generator
        model.anchor_generator = DefaultBoxGenerator(old.aspect_ratios, scales=old.scales, clip=old.clip)
    return _fix_size(model, size)


def _ssdlite(size: int) -> "torch.nn.Module":
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    return _fix_size(ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=NUM_CLASSES), size)


def synthetic_batch(batch_size: int, image_size: int, seed: int = 0, masks: bool = False) -> tuple[list, list]:
    """``batch_size`` random 3 x S x S images in [0, 1] and their targets, on the CPU.

    Each target has 1..MAX_BOXES boxes (x1, y1, x2, y2) with sides between 0.1 S and 0.5 S placed
    wholly inside the image, labels in 1..90, and with ``masks`` a uint8 S x S mask per box that is
    1 on the pixels whose centres lie inside the box.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    images, targets = [], []
    for _ in range(batch_size):
        images.append(torch.rand(3, image_size, image_size, generator=g))
        n = int(torch.randint(1, MAX_BOXES + 1, (1,), generator=g))
        wh = image_size * (0.1 + 0.4 * torch.rand(n, 2, generator=g))
        xy = (image_size - wh) * torch.rand(n, 2, generator=g)
        boxes = torch.cat([xy, xy + wh], dim=1)
        target = {"boxes": boxes, "labels": torch.randint(1, NUM_CLASSES, (n,), generator=g)}
        if masks:
            centres = torch.arange(image_size, dtype=torch.float32) + 0.5
            in_x = (centres >= boxes[:, 0:1]) & (centres < boxes[:, 2:3])  # n x S
            in_y = (centres >= boxes[:, 1:2]) & (centres < boxes[:, 3:4])
            target["masks"] = (in_y[:, :, None] & in_x[:, None, :]).to(torch.uint8)
        targets.append(target)
    return images, targets


@dataclass(frozen=True)
class Detector(Workload):
    """A torchvision detection model trained on synthetic boxes; the sample unit is images.

    ``builder(image_size)`` returns the randomly initialised model whose transform trains exactly
    that size. ``size_multiple`` is the stride the size must be a multiple of (1: any size),
    ``min_batch_size`` the fewest images a rank's BatchNorm can train on. ``images_in`` is False:
    the inputs are lists of 3-D tensors, which the model's own transform normalises and stacks, so
    the harness's channels_last conversion of an NCHW batch does not apply.
    """

    name: str
    builder: Callable[[int], "torch.nn.Module"]
    native_image_size: int
    min_image_size: int
    description: str
    masks: bool = False  # targets carry instance masks (Mask R-CNN)
    size_multiple: int = 1
    min_batch_size: int = 1
    smoke_batch_size: int = 2
    source: str = "torchvision"
    family: str = "detection"
    images_in: bool = False
    num_classes: int = NUM_CLASSES
    default_lr: float = 0.01

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        if cfg.image_size is not None:
            check_image_size(self, cfg.image_size)
            if cfg.image_size % self.size_multiple:
                m = self.size_multiple
                up = -(-cfg.image_size // m) * m
                raise UsageError(f"--image-size {cfg.image_size}: {self.name} pads its input to a multiple of {m}, "
                                 f"so it would train {up} px; use a multiple of {m} such as {up}")
        if cfg.batch_size < self.min_batch_size:
            raise UsageError(f"--batch-size {cfg.batch_size} is too small for {self.name}: its BatchNorm layers see "
                             f"1x1 feature maps; use at least {self.min_batch_size} images per rank")

    def resolve(self, cfg: Any) -> dict[str, Any]:
        return {"image_size": cfg.image_size or self.native_image_size}

    def _size(self, cfg: Any) -> int:
        return (cfg.image_size if cfg is not None else None) or self.native_image_size

    def build(self, cfg: Any = None) -> "torch.nn.Module":
        return self.builder(self._size(cfg))

    def make_batch(self, cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
        """Lists of images and target dicts on ``device`` (made on the CPU, then moved)."""
        images, targets = synthetic_batch(cfg.batch_size, self._size(cfg), seed, self.masks)
        return ([im.to(device) for im in images],
                [{k: v.to(device) for k, v in t.items()} for t in targets])

    def forward_loss(self, model: Any, inputs: Any, targets: Any) -> Any:
        """The sum of the losses the model returns in train mode (classification, box regression, ...)."""
        losses = model(inputs, targets)
        return sum(losses.values())

    def block_types(self, model: Any) -> tuple[type, ...]:
        """The backbone's residual blocks: ResNet Bottlenecks or MobileNetV3 inverted residuals.

        They are the natural repeated units (16 Bottlenecks in ResNet-50); the FPN, heads and the
        RoI stages stay in the root group. SSD300's VGG-16 is a flat sequence of convolutions: ().
        """
        from torchvision.models.mobilenetv3 import InvertedResidual
        from torchvision.models.resnet import Bottleneck

        present = {type(m) for m in model.modules()}
        return tuple(b for b in (Bottleneck, InvertedResidual) if b in present)

    def flops(self, cfg: Any) -> dict[str, Any] | None:
        """Counted once per (model, image size) in this process: it runs one real step (seconds at 800 px)."""
        key = (self.name, self._size(cfg))
        if key not in _FLOPS:
            _FLOPS[key] = count_step_flops(self, key[1])
        return _FLOPS[key]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "native_image_size": self.native_image_size,
                "min_image_size": self.min_image_size, "num_classes": self.num_classes}

    def smoke_shape(self) -> dict[str, Any]:
        return {"batch_size": self.smoke_batch_size, "image_size": self.min_image_size}

    def default_shape(self) -> str:
        multiple = f", a multiple of {self.size_multiple}" if self.size_multiple > 1 else ""
        return (f"{self.native_image_size}px (min {self.min_image_size}{multiple}), {self.num_classes} COCO classes, "
                f"1-{MAX_BOXES} boxes per image")


def count_step_flops(w: Detector, image_size: int) -> dict[str, Any]:
    """Forward and training FLOPs of one image, counted on a real CPU step with FlopCounterMode.

    The model runs in train mode (so the forward includes the training-time work: RoI sampling,
    the mask head on the sampled positives) on synthetic image 0, except that BatchNorm uses its
    running statistics so that a batch of one works at any size; BatchNorm is not a counted op.
    Only matmul-like and convolution ops are counted (2 FLOPs per multiply-accumulate); RoIAlign,
    NMS and element-wise work are not; convolution backward uses ``dlscale.flops.conv_backward_flops`` (grouped
convolutions counted right). The global RNG is left as it was.
    """
    import torch

    from dlscale.flops import counter

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = w.builder(image_size)
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.eval()
        images, targets = synthetic_batch(1, image_size, seed=0, masks=w.masks)
        with counter() as fwd:
            loss = w.forward_loss(model, images, targets)
        with counter() as bwd:
            loss.backward()
    forward = float(fwd.get_total_flops())
    return {"forward": forward, "train": forward + float(bwd.get_total_flops()),
            "method": f"counted: torch.utils.flop_counter on one real {image_size}px image on the CPU in train mode "
                      "(matmul and convolution ops only; RoIAlign, NMS, element-wise not counted)"}


# 64 px is the least at which ResNet-50's last stage is more than 1x1: training BatchNorm on 1x1 maps of
# two images diverges (Mask R-CNN at 32 px reached NaN in 4 steps at lr 0.001).
register(Detector("retinanet", _retinanet, 800, 64,
                  "RetinaNet, ResNet-50 FPN (MLPerf's detector trains at 800x800), 34.0M parameters",
                  size_multiple=32))
register(Detector("maskrcnn", _maskrcnn, 800, 64,
                  "Mask R-CNN, ResNet-50 FPN, box and mask losses, 44.4M parameters", masks=True, size_multiple=32))
# SSD300's smallest input is 268 px (its last extra layers are unpadded 3x3 convolutions); one
# VGG-16 image at that size is a few seconds of CPU, so its smoke shape is a batch of one (no BatchNorm).
# From random init (VGG-16 has no BatchNorm) SSD300 diverges to NaN at lr 0.01 and 0.001 within a few
# steps; 1e-4 is stable (loss 76 -> 20 over 13 steps at 300 px, batch 2).
register(Detector("ssd300", _ssd300, 300, 268, "SSD300, VGG-16 backbone, 35.6M parameters", smoke_batch_size=1,
                  default_lr=1e-4))
# Below 32 px every feature map SSDlite predicts from is 1x1; its last extra block is 1x1 even at
# 320 px, and BatchNorm cannot train on one value per channel, hence two images per rank.
register(Detector("ssdlite", _ssdlite, 320, 32, "SSDlite320, MobileNetV3-Large backbone, 3.4M parameters: "
                  "quick on a CPU", min_batch_size=2))


# -- detector_tiny: the time-to-quality default (dlscale tta on the made shapes dataset) -------------------------

TINY_SIZE = 64  # native size: the made shapes dataset's images (``dlscale dataset detection``)
TINY_WIDTH = 64  # channels of the pyramid and the head (GroupNorm(32) in FCOS's head needs a multiple of 32)


def tiny_backbone() -> "torch.nn.Module":
    """A four-stage convolutional backbone with a feature pyramid: outputs at strides 4, 8 and 16.

    Each stage is two 3x3 convolutions with BatchNorm, the first with stride 2; the pyramid
    (torchvision's ``FeaturePyramidNetwork``) brings every level to ``TINY_WIDTH`` channels, as
    FCOS's head expects (``out_channels``).
    """
    from collections import OrderedDict

    import torch
    from torch import nn
    from torchvision.ops import FeaturePyramidNetwork

    def stage(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                             nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))

    class TinyBackbone(nn.Module):
        """Stages at strides 2, 4, 8, 16 (16, 32, 64, 128 channels); the last three feed the pyramid."""

        def __init__(self) -> None:
            super().__init__()
            self.stages = nn.ModuleList([stage(3, 16), stage(16, 32), stage(32, 64), stage(64, 128)])
            self.fpn = FeaturePyramidNetwork([32, 64, 128], TINY_WIDTH)
            self.out_channels = TINY_WIDTH

        def forward(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
            feats = OrderedDict()
            for i, s in enumerate(self.stages):
                x = s(x)
                if i >= 1:
                    feats[f"p{i + 1}"] = x
            return self.fpn(feats)

    return TinyBackbone()


def tiny_fcos(size: int, num_classes: int = NUM_CLASSES) -> "torch.nn.Module":
    """FCOS (anchor-free, one location per feature cell) on ``tiny_backbone`` for ``size`` px images.

    The anchor sizes (one per level, equal to its stride: 4, 8, 16 px at 64 px) set FCOS's
    size ranges: objects whose farthest side is under 32 px from a location train on the stride-4
    level, 32-64 px on stride 8, larger on stride 16; they scale with ``size`` / 64 so that a
    larger input keeps the same split. The head has two convolutions per branch (FCOS has four).
    ``num_classes`` counts the background (torchvision's convention: label 0 is never a box).
    """
    from torchvision.models.detection import FCOS
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.fcos import FCOSHead

    k = max(1, round(size / TINY_SIZE))
    anchors = AnchorGenerator(sizes=((4 * k,), (8 * k,), (16 * k,)), aspect_ratios=((1.0,),) * 3)
    head = FCOSHead(TINY_WIDTH, 1, num_classes, num_convs=2)
    return FCOS(tiny_backbone(), num_classes, min_size=size, max_size=size, anchor_generator=anchors, head=head,
                score_thresh=0.05, detections_per_img=100)


# Learns the made shapes in minutes on 2 CPU cores (dlscale tta's detection default); at 64 px a step of
# 2 images is milliseconds. Stride 16 is its coarsest level, so 32 px is the least size with a 2x2 map there;
# FCOS's transform pads to a multiple of 32.
register(Detector("detector_tiny", tiny_fcos, TINY_SIZE, 32,
                  "FCOS, 4-stage CNN + 3-level FPN, 2-conv head (dlscale's tiny detector for the made shapes), "
                  "0.62M parameters", size_multiple=32, default_lr=1e-3))
