"""The detection family: torchvision's RetinaNet, SSD300, Mask R-CNN and SSDlite on synthetic boxes."""

import math

import pytest

from dlscale import api, workloads
from dlscale.config import TrainConfig
from dlscale.domains.detection.workload import MAX_BOXES, NUM_CLASSES, synthetic_batch
from dlscale.errors import UsageError
from dlscale.flops import conv_backward_flops

DETECTORS = ("maskrcnn", "retinanet", "ssd300", "ssdlite")
QUIET = {"monitor_interval": 0, "breakdown_steps": 0}  # only the measured window: keeps the runs short


def test_detectors_are_registered_as_image_workloads():
    for name in DETECTORS:
        w = workloads.get(name)
        assert w.family == "detection" and w.sample_unit == "images" and w.source == "torchvision"
        assert not w.images_in  # inputs are lists of 3-D images: no NCHW batch to lay out channels_last
        assert w.num_classes == 91 and w.min_image_size <= w.native_image_size
    assert {"maskrcnn", "retinanet", "ssd300", "ssdlite"} <= {w.name for w in workloads.all_workloads()
                                                               if w.family == "detection"}


def test_synthetic_boxes_are_valid_and_deterministic():
    size = 64
    images, targets = synthetic_batch(6, size, seed=5, masks=True)
    again_images, again_targets = synthetic_batch(6, size, seed=5, masks=True)
    other_images, _ = synthetic_batch(6, size, seed=6, masks=True)
    assert len(images) == len(targets) == 6 and not (images[0] == other_images[0]).all()
    for im, im2, t, t2 in zip(images, again_images, targets, again_targets):
        assert im.shape == (3, size, size) and 0 <= float(im.min()) and float(im.max()) <= 1
        assert (im == im2).all() and all((t[k] == t2[k]).all() for k in t)
        b = t["boxes"]
        n = b.shape[0]
        assert 1 <= n <= MAX_BOXES and b.shape == (n, 4)
        assert (b[:, 0] < b[:, 2]).all() and (b[:, 1] < b[:, 3]).all()
        assert (b >= 0).all() and (b <= size).all()
        sides = b[:, 2:] - b[:, :2]
        assert (sides >= 0.1 * size - 1e-4).all() and (sides <= 0.5 * size + 1e-4).all()
        assert t["labels"].shape == (n,) and 1 <= int(t["labels"].min()) and int(t["labels"].max()) < NUM_CLASSES
        assert t["masks"].shape == (n, size, size) and str(t["masks"].dtype) == "torch.uint8"


def test_mask_is_the_pixels_whose_centres_are_inside_the_box():
    _, targets = synthetic_batch(1, 64, seed=1, masks=True)
    box, mask = targets[0]["boxes"][0].tolist(), targets[0]["masks"][0]
    # columns c with x1 <= c + 0.5 < x2, rows likewise: a filled rectangle of their product
    cols = [c for c in range(64) if box[0] <= c + 0.5 < box[2]]
    rows = [r for r in range(64) if box[1] <= r + 0.5 < box[3]]
    assert int(mask.sum()) == len(cols) * len(rows) > 0
    assert int(mask[rows[0], cols[0]]) == 1 and int(mask[rows[-1], cols[-1]]) == 1
    assert int(mask[:, : cols[0]].sum()) == 0 and int(mask[rows[-1] + 1:, :].sum()) == 0


def test_make_batch_puts_every_tensor_on_the_device():
    w = workloads.get("maskrcnn")
    cfg = TrainConfig(model="maskrcnn", batch_size=2, image_size=64).resolve("cpu")
    x, y = w.make_batch(cfg, "meta")
    assert all(im.device.type == "meta" for im in x)
    assert all(v.device.type == "meta" for t in y for v in t.values()) and "masks" in y[0]


@pytest.mark.parametrize("name,size,msg", [("retinanet", 32, "--image-size 32 is too small"),
                                           ("maskrcnn", 100, "multiple of 32 such as 128"),
                                           ("ssd300", 267, "at least 268"), ("ssdlite", 16, "at least 32")])
def test_image_size_the_model_cannot_train_is_a_usage_error(name, size, msg):
    with pytest.raises(UsageError) as e:
        TrainConfig(model=name, batch_size=2, image_size=size)
    assert "--image-size" in str(e.value) and msg in str(e.value)


def test_one_image_per_rank_is_too_few_for_ssdlite():
    with pytest.raises(UsageError, match="--batch-size 1"):
        TrainConfig(model="ssdlite", batch_size=1)
    TrainConfig(model="retinanet", batch_size=1, image_size=64)  # 2x2 maps at its minimum: fine


def test_sequence_options_do_not_apply():
    with pytest.raises(UsageError, match="--seq-len"):
        TrainConfig(model="retinanet", seq_len=128)


def _backbone_input_shape(name, size):
    import torch

    w = workloads.get(name)
    cfg = TrainConfig(model=name, batch_size=2, image_size=size).resolve("cpu")
    model = w.build(cfg)
    seen = []
    model.backbone.register_forward_hook(lambda _m, inp, _o: seen.append(tuple(inp[0].shape)))
    model.train()
    torch.manual_seed(0)
    w.forward_loss(model, *w.make_batch(cfg, "cpu"))
    return seen[0]


@pytest.mark.parametrize("name,size", [("retinanet", 96), ("ssdlite", 48)])
def test_the_chosen_size_is_the_size_trained(name, size):
    """The transform neither rescales nor pads: the backbone sees exactly S x S."""
    assert _backbone_input_shape(name, size) == (2, 3, size, size)


def test_ssd300_resizes_to_the_chosen_size_and_has_no_blocks():
    w = workloads.get("ssd300")
    model = w.build(TrainConfig(model="ssd300", image_size=320, batch_size=1))
    # default boxes on each feature map's own grid away from 300 px (torchvision's strides assume 300)
    assert model.transform.fixed_size == (320, 320) and model.anchor_generator.steps is None
    assert w.block_types(model) == ()  # VGG-16: a flat run of convolutions


def test_block_types_are_the_backbone_blocks():
    from torchvision.models.mobilenetv3 import InvertedResidual
    from torchvision.models.resnet import Bottleneck

    for name, blocks in (("retinanet", (Bottleneck,)), ("ssdlite", (InvertedResidual,))):
        w = workloads.get(name)
        assert w.block_types(w.build()) == blocks


def test_conv_backward_flops_by_hand():
    # 3x3 conv, 8 -> 16 channels, batch 2, 10x10 output: forward MACs = 2*100*16*8*9 = 230400
    fwd_macs = 2 * 100 * 16 * 8 * 9
    assert conv_backward_flops([2, 16, 10, 10], [2, 8, 10, 10], [16, 8, 3, 3]) == 2 * 2 * fwd_macs
    assert conv_backward_flops([2, 16, 10, 10], [2, 8, 10, 10], [16, 8, 3, 3], output_mask=(False, True)) == 2 * fwd_macs
    # depthwise (groups 16): weight 16 x 1 x 3 x 3, forward MACs = 2*100*16*9; torch 2.14 counts its
    # grad_weight 16 times over
    assert conv_backward_flops([2, 16, 10, 10], [2, 16, 10, 10], [16, 1, 3, 3]) == 2 * 2 * (2 * 100 * 16 * 9)


@pytest.mark.long
def test_counted_flops_match_torchvision_published_figure():
    """SSD300 at its fixed 300x300 input: torchvision's "_ops" (GFLOPS, one multiply-add counted once)
    is 34.858; FlopCounterMode counts 2 per multiply-add, and train-mode SSD runs the same
    convolutions as inference, so the forward should be 2 x 34.858e9 within 1% (rounding, and the
    few ops either counter leaves out)."""
    from torchvision.models.detection import SSD300_VGG16_Weights

    w = workloads.get("ssd300")
    cfg = TrainConfig(model="ssd300", batch_size=1).resolve("cpu")
    fl = w.flops(cfg)
    published = SSD300_VGG16_Weights.COCO_V1.meta["_ops"] * 1e9
    assert published == pytest.approx(34.858e9)
    assert fl["forward"] == pytest.approx(2 * published, rel=0.01)
    # backward: grad_input and grad_weight each cost a forward, except the first conv's grad_input
    # (images need no gradient): a little under 3x
    assert 2.9 < fl["train"] / fl["forward"] < 3.0
    assert "flop_counter" in fl["method"] and w.flops(cfg) is fl  # cached for the process


@pytest.mark.slow
@pytest.mark.parametrize("name", DETECTORS)
@pytest.mark.long
def test_smoke_shape_trains_a_few_steps(name):
    """Three SGD steps on the smoke shape's fixed batch, as the short test runs them; the FLOPs count there too."""
    import torch

    w = workloads.get(name)
    cfg = TrainConfig(model=name, **w.smoke_shape()).resolve("cpu")
    torch.manual_seed(0)
    model = w.build(cfg)
    model.train()
    lr = 1e-4 if name == "ssd300" else 0.01  # random-init SSD300 diverges at 0.01 (and 0.001) by step 3
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    x, y = w.make_batch(cfg, "cpu")
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = w.forward_loss(model, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses), losses
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused  # DDP needs no find_unused_parameters
    fl = w.flops(cfg)
    assert fl["train"] > fl["forward"] > 0


@pytest.mark.long
def test_smallest_detector_loss_decreases(tmp_path):
    rec = api.train(model="ssdlite", image_size=32, batch_size=2, steps=15, warmup_steps=1, lr=0.01,
                    db=str(tmp_path / "r.db"), **QUIET)
    assert rec.status == "ok", rec.error
    assert rec.config["family"] == "detection" and rec.config["sample_unit"] == "images"
    assert rec.units["throughput"] == "images/s"
    assert rec.metrics["loss_last"] < 0.8 * rec.metrics["loss_first"]


@pytest.mark.slow
@pytest.mark.long
def test_two_rank_ddp(tmp_path):
    from dlscale.layout import Layout

    rec = api.train(model="ssdlite", image_size=32, batch_size=2, steps=3, warmup_steps=1,
                    layout=Layout(nproc_per_node=2), db=str(tmp_path / "r.db"), **QUIET)
    assert rec.status == "ok", rec.error
    assert rec.metrics["world_size"] == 2 and rec.config["sample_unit"] == "images"
    assert rec.metrics["throughput"] > 0 and math.isfinite(rec.metrics["loss_last"])
