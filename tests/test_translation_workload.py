"""The translation family: Transformer base/big/tiny, batched by target tokens, label-smoothed loss."""

from __future__ import annotations

import math

import pytest

from dlscale import workloads
from dlscale.config import TrainConfig
from dlscale.domains.translation.workload import BOS, PAD, Dims, draw_lengths, transformer_flops
from dlscale.errors import UsageError


def _cfg(name: str = "transformer_tiny", **shape):
    return TrainConfig(model=name, **shape).resolve("cpu")


def test_registered_sizes_and_unit():
    for name, d, heads, ff in (("transformer_base", 512, 8, 2048), ("transformer_big", 1024, 16, 4096),
                               ("transformer_tiny", 64, 2, 128)):
        w = workloads.get(name)
        assert w.family == "translation" and w.sample_unit == "tokens"
        assert (w.dims.d_model, w.dims.heads, w.dims.ffn) == (d, heads, ff)
        assert w.describe()["sample_unit"] == "tokens"
    assert workloads.get("transformer_base").dims.vocab == 32000
    assert workloads.get("transformer_big").dropout == 0.3
    cfg = _cfg("transformer_base")
    assert (cfg.tokens_per_batch, cfg.seq_len) == (4096, 64)


def test_shared_embedding_and_parameter_count():
    """Source, target and output share one weight: base has 60.5M parameters (6+6 layers + 32000x512)."""
    import torch.nn as nn

    w = workloads.get("transformer_tiny")
    m = w.build(_cfg())
    assert [type(b) for b in m.modules() if isinstance(b, w.block_types(m))] == \
        [nn.TransformerEncoderLayer] * 2 + [nn.TransformerDecoderLayer] * 2
    embeddings = [mod for mod in m.modules() if isinstance(mod, nn.Embedding)]
    assert len(embeddings) == 1 and not any(isinstance(mod, nn.Linear) and mod.out_features == 1000
                                            for mod in m.modules())
    d, ff, v = 512, 2048, 32000
    attn = 4 * d * d + 4 * d  # Q, K, V, output weights and biases
    ffn = 2 * d * ff + ff + d
    enc = attn + ffn + 2 * 2 * d  # two LayerNorms
    dec = 2 * attn + ffn + 3 * 2 * d
    base = workloads.get("transformer_base").build(None)
    assert sum(p.numel() for p in base.parameters()) == 6 * enc + 6 * dec + v * d == 60_522_496


@pytest.mark.parametrize("tokens,seq_len", [(8, 8), (37, 8), (256, 16), (1000, 64), (4096, 64)])
def test_batch_holds_exactly_the_token_budget(tokens, seq_len):
    w = workloads.get("transformer_tiny")
    cfg = _cfg(tokens_per_batch=tokens, seq_len=seq_len, batch_size=3)
    assert w.units_per_batch(cfg) == tokens  # batch_size plays no part
    for seed in range(4):
        (src, tgt_in, src_pad, tgt_pad), tgt_out = w.make_batch(cfg, "cpu", seed=seed)
        assert int((tgt_out != PAD).sum()) == tokens
        assert ((tgt_out == PAD) == tgt_pad).all() and ((src == PAD) == src_pad).all()
        assert src.shape[1] <= seq_len and tgt_out.shape[1] <= seq_len and tgt_in.shape == tgt_out.shape
        assert (tgt_in[:, 0] == BOS).all()  # teacher forcing: the input is the output shifted right
        assert (tgt_in[:, 1:][~tgt_pad[:, 1:]] == tgt_out[:, :-1][~tgt_pad[:, 1:]]).all()
        assert (~src_pad).sum(1).min() >= 1 and (~tgt_pad).sum(1).min() >= 1
        pairs = w.lengths(cfg, seed)
        assert [int(n) for n in (~tgt_pad).sum(1)] == [t for _, t in pairs]
        assert [int(n) for n in (~src_pad).sum(1)] == [s for s, _ in pairs]
        assert all((seq_len + 1) // 2 <= t <= seq_len for _, t in pairs[:-1])  # only the last is truncated


def test_batch_is_deterministic_and_meta_has_the_same_shapes():
    w = workloads.get("transformer_tiny")
    cfg = _cfg()
    x1, y1 = w.make_batch(cfg, "cpu", seed=5)
    x2, y2 = w.make_batch(cfg, "cpu", seed=5)
    assert all((a == b).all() for a, b in zip(x1, x2)) and (y1 == y2).all()
    x3, y3 = w.make_batch(cfg, "cpu", seed=6)
    assert y3.shape != y1.shape or not (y3 == y1).all()
    xm, ym = w.make_batch(cfg, "meta", seed=5)
    assert [a.shape for a in xm] == [a.shape for a in x1] and ym.shape == y1.shape
    assert draw_lengths(100, 10, 1) == draw_lengths(100, 10, 1)


def test_loss_is_label_smoothed_and_ignores_padding():
    """By hand: (1-e)(-log p_y) + e * mean_k(-log p_k) over the non-pad tokens; pad logits do not matter."""
    import torch

    w = workloads.get("transformer_tiny")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    target = torch.tensor([[2, 4, PAD], [3, PAD, PAD]])
    logp = logits.log_softmax(-1)
    real = [(0, 0), (0, 1), (1, 0)]
    by_hand = sum(0.9 * -logp[b, t, target[b, t]] + 0.1 * -logp[b, t].mean() for b, t in real) / len(real)
    assert float(w.loss(logits, target)) == pytest.approx(float(by_hand), rel=1e-6)
    changed = logits.clone()
    changed[target == PAD] = 100 * torch.randn(3, 5, generator=g)
    assert float(w.loss(changed, target)) == pytest.approx(float(w.loss(logits, target)), rel=1e-7)


def test_padding_positions_do_not_reach_the_loss_through_the_model():
    """Key padding masks: rewriting the ids at padded source and target positions leaves the loss unchanged."""
    import torch

    w = workloads.get("transformer_tiny")
    cfg = _cfg(tokens_per_batch=40, seq_len=8)
    torch.manual_seed(0)
    m = w.build(cfg).eval()  # no dropout, so two forwards compare exactly
    (src, tgt_in, src_pad, tgt_pad), tgt_out = w.make_batch(cfg, "cpu", seed=2)
    assert src_pad.any() and tgt_pad.any()
    with torch.no_grad():
        ref = w.forward_loss(m, (src, tgt_in, src_pad, tgt_pad), tgt_out)
        noisy_src = src.masked_fill(src_pad, 7)
        noisy_tgt = tgt_in.masked_fill(tgt_pad, 9)
        out = w.forward_loss(m, (noisy_src, noisy_tgt, src_pad, tgt_pad), tgt_out)
    assert torch.isfinite(ref) and float(out) == pytest.approx(float(ref), rel=1e-5)


def test_impossible_shapes_are_usage_errors():
    with pytest.raises(UsageError, match="--seq-len 64 is longer than --tokens-per-batch 32"):
        TrainConfig(model="transformer_base", tokens_per_batch=32)
    with pytest.raises(UsageError, match="--seq-len 300 is longer than --tokens-per-batch 256"):
        TrainConfig(model="transformer_tiny", seq_len=300)
    with pytest.raises(UsageError, match="--image-size does not apply to transformer_tiny"):
        TrainConfig(model="transformer_tiny", image_size=32)
    with pytest.raises(UsageError, match="--model-config does not apply"):
        TrainConfig(model="transformer_tiny", model_config="x.json")
    with pytest.raises(UsageError, match="--tokens-per-batch must be > 0"):
        TrainConfig(model="transformer_tiny", tokens_per_batch=0)
    with pytest.raises(UsageError, match="--tokens-per-batch does not apply"):
        TrainConfig(model="tinycnn", tokens_per_batch=64)


def test_flops_by_hand_and_counted():
    """Tiny (d 64, ff 128, V 1000, 2+2 layers), one sentence pair S=5, T=7, written out by hand."""
    import torch

    from dlscale.flops import count_flops

    d, ff, v, s, t = 64, 128, 1000, 5, 7
    enc_layer = s * (2 * (4 * d * d + 2 * d * ff) + 2 * 2 * s * d)  # projections + FFN + scores/sum
    assert enc_layer == 5 * (65536 + 1280) == 334080
    dec_layer = t * (2 * 4 * d * d + 2 * 2 * t * d  # self-attention
                     + 2 * 2 * d * d + 2 * 2 * s * d  # cross-attention: query, output, scores, sum
                     + 2 * 2 * d * ff) + s * 2 * 2 * d * d  # FFN; cross keys/values of the source
    assert dec_layer == 7 * 84992 + 81920 == 676864
    out = 2 * d * v * t
    by_hand = 2 * enc_layer + 2 * dec_layer + out
    assert by_hand == 2_917_888
    w = workloads.get("transformer_tiny")
    assert transformer_flops(w.dims, [(s, t)]) == by_hand
    assert transformer_flops(w.dims, [(s, t), (3, 2)]) == by_hand + transformer_flops(w.dims, [(3, 2)])

    def batch(b, dev):  # three equal sentences: no padding, so counted == model FLOPs
        z = lambda n, dt: torch.zeros(b * 3, n, dtype=dt, device=dev)  # noqa: E731
        return (z(s, torch.long), z(t, torch.long), z(s, torch.bool), z(t, torch.bool)), z(t, torch.long)

    counted = count_flops(lambda: w.build(None), batch, w.forward_loss, 1)
    assert counted == {"forward": 3 * by_hand, "train": 9 * by_hand}


def test_flops_per_target_token_of_the_drawn_batch():
    w = workloads.get("transformer_tiny")
    cfg = _cfg(seed=3)
    fl = w.flops(cfg)
    pairs = w.lengths(cfg, 3)
    assert fl["forward"] == transformer_flops(w.dims, pairs) / 256 and fl["train"] == 3 * fl["forward"]
    assert "closed form" in fl["method"]
    base = workloads.get("transformer_base").flops(_cfg("transformer_base"))
    # ~2 x (parameters outside the input embedding lookup) per token, plus attention: 100-150 MFLOP
    assert 100e6 < base["forward"] < 150e6


def test_block_types_checkpoint_and_train():
    import torch

    from dlscale.train.shorttest import checkpoint_blocks

    w = workloads.get("transformer_tiny")
    cfg = _cfg(tokens_per_batch=32, seq_len=8)
    m = w.build(cfg).train()
    checkpoint_blocks(w, m)
    x, y = w.make_batch(cfg, "cpu")
    loss = w.forward_loss(m, x, y)
    loss.backward()
    assert torch.isfinite(loss) and m.embed.weight.grad is not None


def test_tiny_trains_with_decreasing_loss(tmp_path):
    from dlscale import api

    rec = api.train(model="transformer_tiny", steps=6, warmup_steps=1, db=str(tmp_path / "r.db"), optimizer="adamw",
                    lr=3e-3, breakdown_steps=0, monitor_interval=0)
    assert rec.status == "ok"
    assert rec.config["sample_unit"] == "tokens" and rec.config["family"] == "translation"
    assert rec.config["units_per_batch"] == rec.config["tokens_per_batch"] == 256
    losses = rec.raw["loss"][0]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.5
    assert losses[0] < math.log(1000) + 1  # starts near uniform over the vocabulary
    assert rec.metrics["throughput"] > 0 and rec.metrics["flops_per_sample"] > 0


@pytest.mark.slow
def test_two_rank_ddp(tmp_path):
    from dlscale import api
    from dlscale.layout import Layout

    rec = api.train(model="transformer_tiny", layout=Layout(nproc_per_node=2), steps=3, warmup_steps=1,
                    db=str(tmp_path / "r.db"), optimizer="adamw", lr=1e-3, breakdown_steps=0, monitor_interval=0)
    assert rec.status == "ok" and rec.metrics["world_size"] == 2
    assert rec.config["units_per_batch"] == 256 and rec.config["sample_unit"] == "tokens"
    assert all(math.isfinite(x) for x in rec.raw["loss"][0])


def test_dims_are_a_value():
    assert Dims(64, 2, 2, 2, 128, 1000) == workloads.get("transformer_tiny").dims
