"""Every registered workload: builds with random weights and trains one step at a tiny size."""

import pytest

from dlscale import workloads
import dlscale.workloads.base
from dlscale.errors import UsageError


def _smoke_config(w):
    from dlscale.config import TrainConfig

    return TrainConfig(model=w.name, **w.smoke_shape()).resolve("cpu")


@pytest.mark.parametrize("name", workloads.names())
def test_one_forward_backward(name):
    """Every registered workload trains one step at its smallest shape through the interface."""
    import torch

    w = workloads.get(name)
    cfg = _smoke_config(w)
    torch.manual_seed(0)
    model = w.build(cfg)
    model.train()
    x, y = w.make_batch(cfg, "cpu")
    loss = w.forward_loss(model, x, y)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and any(g is not None for g in grads)
    assert w.units_per_batch(cfg) > 0
    assert w.sample_unit == workloads.base.FAMILIES[w.family]


def test_classifier_logits_shape():
    w = workloads.get("tinycnn")
    cfg = _smoke_config(w)
    x, _ = w.make_batch(cfg, "cpu")
    assert w.build(cfg)(x).shape == (2, w.num_classes)


def test_unknown_name_lists_known_ones():
    with pytest.raises(UsageError) as e:
        workloads.get("resnet5")
    assert "resnet50" in str(e.value) and "tinycnn" in str(e.value)


def test_registry_has_the_seed_zoo():
    assert {"resnet50", "vgg16", "vgg19", "inception_v3", "inception_v4", "googlenet", "alexnet",
            "resnet18", "tinycnn"} <= set(workloads.names())


def test_synthetic_batch_is_deterministic():
    w = workloads.get("tinycnn")
    x1, y1 = w.image_batch(4, 16, "cpu", seed=3)
    x2, y2 = w.image_batch(4, 16, "cpu", seed=3)
    assert (x1 == x2).all() and (y1 == y2).all()
    assert x1.shape == (4, 3, 16, 16) and int(y1.max()) < w.num_classes
