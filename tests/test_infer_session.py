"""infer.session: bf16/fp16 cast the model once (BatchNorm folded in fp32 first) instead of autocast on
every forward; detection keeps autocast; fp32 runs the model as built. Tiny models on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dlscale.infer.config import InferConfig  # noqa: E402
from dlscale.infer.session import fold_batchnorm, open_session  # noqa: E402


def session_of(model: str, precision: str, **kw):
    cfg = InferConfig(model, batch_sizes="4", precision=precision, device="cpu", **kw).resolve("cpu")
    return open_session(cfg, torch.device("cpu"))


def bn_count(m) -> int:
    return sum(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())


def test_folding_batchnorm_keeps_the_eval_output_and_counts_what_it_folded():
    """resnet18 has 20 BatchNorm layers, each after a convolution: all folded, the fp32 logits the same
    up to fp32 rounding (the folded weight is W * gamma / sqrt(var + eps))."""
    from dlscale import workloads

    cfg = InferConfig("resnet18", image_size=32).resolve("cpu")
    torch.manual_seed(0)
    model = workloads.get("resnet18").build(cfg.train_config()).eval()
    for m in model.modules():  # BatchNorm statistics a fold must carry (fresh ones are 0 and 1)
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        ref = model(x)
        fused, (folded, left) = fold_batchnorm(model)
        out = fused(x)
    assert (folded, left) == (bn_count(model), 0) == (20, 0) and bn_count(fused) == 0
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_a_model_without_batchnorm_is_returned_as_it_is():
    lin = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    assert fold_batchnorm(lin) == (lin, (0, 0))


def test_bf16_casts_the_model_once_with_batchnorm_folded_and_no_autocast(monkeypatch):
    fp32, bf16 = session_of("tinycnn", "fp32"), session_of("tinycnn", "bf16")
    weights = bf16.describe()["weights"]
    assert weights == "bfloat16 weights, cast once (no autocast); 3 BatchNorm layers folded into the layer before each, in fp32"
    assert "weights" not in fp32.describe()  # fp32: the model as built
    entered = []
    real = torch.autocast

    def spy(*a, **k):
        entered.append(a)
        return real(*a, **k)

    monkeypatch.setattr(torch, "autocast", spy)
    samples = [fp32.sample(i) for i in range(4)]
    assert bf16.stored(0)[0].dtype == torch.bfloat16 and fp32.stored(0)[0].dtype == torch.float32
    ref, out = fp32.run(samples), bf16.run(samples)
    assert not entered and out.dtype == torch.bfloat16  # no autocast on the forward; bf16 all through
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    assert err < 0.05  # bf16's 8-bit mantissa over a few layers (measured 0.004 - 0.006)


def test_float_inputs_of_a_cast_model_are_held_in_its_precision():
    s = session_of("dlrm_tiny", "bf16")
    dense, *ids = s.stored(0)
    assert dense.dtype == torch.bfloat16 and all(not t.is_floating_point() for t in ids)
    assert s.run([s.sample(i) for i in range(2)]).dtype == torch.bfloat16


def test_detection_keeps_autocast_and_fp32_weights():
    s = session_of("detector_tiny", "bf16")
    assert "autocast" in s.describe()["weights"] and s.input_dtype is None
    out = s.run([s.sample(i) for i in range(2)])
    assert isinstance(out, list) and len(out) == 2  # NMS ran (it has no bf16 kernel on the CPU)
