"""Every registered workload: builds with random weights and trains one step at a tiny size."""

import pytest

from dlscale import workloads
from dlscale.errors import UsageError


@pytest.mark.parametrize("name", workloads.names())
def test_one_forward_backward(name):
    import torch

    w = workloads.get(name)
    torch.manual_seed(0)
    model = w.build()
    model.train()
    x, y = w.make_batch(2, w.min_image_size, "cpu")
    out = model(x)
    logits = out[0] if isinstance(out, tuple) else out
    assert logits.shape == (2, w.num_classes)
    loss = w.loss(out, y)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


def test_unknown_name_lists_known_ones():
    with pytest.raises(UsageError) as e:
        workloads.get("resnet5")
    assert "resnet50" in str(e.value) and "tinycnn" in str(e.value)


def test_registry_has_the_seed_zoo():
    assert {"resnet50", "vgg16", "vgg19", "inception_v3", "inception_v4", "googlenet", "alexnet",
            "resnet18", "tinycnn"} <= set(workloads.names())


def test_synthetic_batch_is_deterministic():
    w = workloads.get("tinycnn")
    x1, y1 = w.make_batch(4, 16, "cpu", seed=3)
    x2, y2 = w.make_batch(4, 16, "cpu", seed=3)
    assert (x1 == x2).all() and (y1 == y2).all()
    assert x1.shape == (4, 3, 16, 16) and int(y1.max()) < w.num_classes
