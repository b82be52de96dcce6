"""FLOP counting against published model costs."""

import pytest

from dlscale import workloads
from dlscale.config import TrainConfig


def workload_flops(workload, image_size):
    """FLOPs per sample unit of a registered workload at ``image_size``, the other fields at their defaults."""
    return workload.flops(TrainConfig(model=workload.name, image_size=image_size).resolve("cpu"))


def test_resnet50_forward_is_published_4_1_gmacs():
    # ResNet-50 at 224x224: ~4.1 GMACs forward (He et al. 2015 report 3.8 GFLOPs counting
    # multiply-adds for v1; torchvision's v1.5 lists 4.09 GFLOPS as MACs). 2 FLOPs per MAC.
    fl = workload_flops(workloads.get("resnet50"), 224)
    gmacs = fl["forward"] / 2 / 1e9
    assert gmacs == pytest.approx(4.09, abs=0.02)
    # backward costs about twice the forward: fwd+bwd ~ 3x forward
    assert fl["train"] / fl["forward"] == pytest.approx(3.0, abs=0.05)


def test_alexnet_and_vgg16_forward_gmacs():
    # torchvision's published costs: AlexNet 0.71 GFLOPS, VGG-16 15.47 GFLOPS (MACs, 224x224)
    assert workload_flops(workloads.get("alexnet"), 224)["forward"] / 2e9 == pytest.approx(0.71, abs=0.01)
    assert workload_flops(workloads.get("vgg16"), 224)["forward"] / 2e9 == pytest.approx(15.47, abs=0.05)


def test_tinycnn_by_hand():
    # 32x32 input: conv 3->16 3x3 at 32x32, conv 16->32 at 16x16, conv 32->64 at 8x8, linear 64->10
    macs = 32 * 32 * 16 * 3 * 9 + 16 * 16 * 32 * 16 * 9 + 8 * 8 * 64 * 32 * 9 + 64 * 10
    fl = workload_flops(workloads.get("tinycnn"), 32)
    assert fl["forward"] == pytest.approx(2 * macs)


def test_flops_scale_with_image_area():
    w = workloads.get("resnet18")
    f64 = workload_flops(w, 64)["forward"]
    f128 = workload_flops(w, 128)["forward"]
    assert f128 / f64 == pytest.approx(4.0, rel=0.02)


def test_depthwise_convolution_backward_costs_twice_its_forward():
    """A depthwise conv's backward is two convolutions of the forward's size (input and weight gradients)."""
    import torch

    from dlscale.flops import counter

    conv = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)
    x = torch.randn(2, 64, 16, 16, requires_grad=True)
    with counter() as fwd:
        y = conv(x)
    with counter() as bwd:
        y.sum().backward()
    macs = 2 * 16 * 16 * 64 * 9  # batch x output positions x weight elements (64 x 1 x 3 x 3)
    assert fwd.get_total_flops() == 2 * macs
    assert bwd.get_total_flops() == 2 * 2 * macs
