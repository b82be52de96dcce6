"""The recommendation family: NCF (MLPerf v0.5 NeuMF), DLRM-DCNv2 (MLPerf, Criteo 1TB) and dlrm_tiny.

Training runs go through the public API; FLOPs are checked against hand counts of the matrix
products (2 * in * out per sample for every Linear; lookups and element-wise ops are not FLOPs).
"""

from __future__ import annotations

import math

import pytest

from dlscale import workloads
from dlscale.errors import UsageError

QUIET = {"monitor_interval": 0, "breakdown_steps": 0}  # no sampler thread, no instrumented steps: quick runs


def _cfg(model: str, **fields):
    from dlscale.config import TrainConfig

    return TrainConfig(model=model, **fields).resolve("cpu")


def _linear_flops(*sizes: int) -> int:
    """Forward FLOPs per sample of Linear layers through ``sizes``: sum of 2 * in * out."""
    return sum(2 * a * b for a, b in zip(sizes, sizes[1:]))


def test_registered_in_the_recommendation_family():
    for name in ("ncf", "dlrm_dcnv2", "dlrm_tiny"):
        w = workloads.get(name)
        assert w.family == "recommendation" and w.sample_unit == "samples"
        assert w.units_per_batch(_cfg(name, batch_size=48)) == 48


def test_dlrm_tiny_trains_with_decreasing_loss(tmp_path):
    """A few AdamW steps on the fixed synthetic batch: finite losses, each below the one before."""
    from dlscale import api

    rec = api.train(model="dlrm_tiny", steps=5, warmup_steps=1, db=str(tmp_path / "r.db"), batch_size=64,
                    optimizer="adamw", lr=0.01, **QUIET)
    losses = rec.raw["loss"][0]
    assert rec.status == "ok" and len(losses) == 5 and all(math.isfinite(v) for v in losses)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert rec.config["sample_unit"] == "samples" and rec.config["family"] == "recommendation"
    assert rec.config["max_table_rows"] == 1000 and rec.config["units_per_batch"] == 64
    assert rec.metrics["flops_per_sample"] == 38_624  # the hand count of test_dlrm_tiny_flops_by_hand


def test_ncf_trains_a_step_at_full_movielens_size(tmp_path):
    from dlscale import api

    w = workloads.get("ncf")
    model = w.build(_cfg("ncf"))
    assert model.mf_user.weight.shape == (138_493, 64) and model.mlp_item.weight.shape == (26_744, 128)
    assert sum(p.numel() for p in model.parameters()) == 138_493 * 192 + 26_744 * 192 + 107_073
    rec = api.train(model="ncf", steps=2, warmup_steps=1, db=str(tmp_path / "r.db"), batch_size=40, **QUIET)
    assert rec.status == "ok" and rec.config["max_table_rows"] == 138_493
    assert all(math.isfinite(v) for v in rec.raw["loss"][0]) and rec.config["family"] == "recommendation"


def test_ncf_batch_is_one_positive_to_four_negatives_with_ids_in_range():
    w = workloads.get("ncf")
    cfg = _cfg("ncf", batch_size=1000)
    ids, labels = w.make_batch(cfg, "cpu", seed=5)
    assert ids.shape == (1000, 2) and int(ids.min()) >= 0
    assert int(ids[:, 0].max()) < 138_493 and int(ids[:, 1].max()) < 26_744
    assert int(ids[:, 0].max()) > 100_000  # uniform over all users, not a corner of the table
    assert labels.tolist()[:10] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 0] and int(labels.sum()) == 200
    ids2, labels2 = w.make_batch(cfg, "cpu", seed=5)
    assert (ids == ids2).all() and (labels == labels2).all()
    assert not (ids == w.make_batch(cfg, "cpu", seed=6)[0]).all()


def test_dlrm_batch_shapes_ranges_clicks_and_determinism():
    """Per-feature bags within each capped table, log1p of integer counts, round(B/32) clicks."""
    import torch

    w = workloads.get("dlrm_dcnv2")
    cfg = _cfg("dlrm_dcnv2", batch_size=320, max_table_rows=5000)
    (dense, ids), clicks = w.make_batch(cfg, "cpu", seed=1)
    assert dense.shape == (320, 13) and ids.shape == (320, 214) and clicks.shape == (320,)
    rows = torch.tensor([min(r, 5000) for r in w.table_rows_full]).repeat_interleave(torch.tensor(w.hotness))
    assert int(ids.min()) >= 0 and bool((ids < rows).all())
    assert int(ids[:, 0].max()) > 4000  # a capped 40M-row table is drawn over its whole 5000 rows
    counts = torch.expm1(dense)
    assert bool((dense >= 0).all()) and torch.allclose(counts, counts.round(), atol=1e-3)
    assert int(clicks.sum()) == 10 and set(clicks.tolist()) == {0.0, 1.0}
    (dense2, ids2), clicks2 = w.make_batch(cfg, "cpu", seed=1)
    assert (dense == dense2).all() and (ids == ids2).all() and (clicks == clicks2).all()


def test_uncapped_criteo_ids_reach_the_40m_rows():
    """Without a binding cap ids span the MLPerf tables (40M rows for features 1, 10, 20-22)."""
    w = workloads.get("dlrm_dcnv2")
    (_, ids), _ = w.make_batch(_cfg("dlrm_dcnv2", batch_size=256, max_table_rows=40_000_000), "cpu", seed=0)
    assert 30_000_000 < int(ids[:, 0].max()) < 40_000_000
    start = sum(w.hotness[:5])  # the 6th feature's single id (a 3-row table) follows bags of 3+2+1+2+6 ids
    assert start == 14 and set(ids[:, start].tolist()) == {0, 1, 2}


def test_max_table_rows_caps_every_table_and_defaults_per_model():
    w = workloads.get("dlrm_dcnv2")
    assert _cfg("dlrm_dcnv2").max_table_rows == 100_000 and _cfg("ncf").max_table_rows == 138_493
    model = w.build(_cfg("dlrm_dcnv2", max_table_rows=50))
    assert [t.num_embeddings for t in model.tables] == [min(r, 50) for r in w.table_rows_full]
    assert {t.embedding_dim for t in model.tables} == {128} and len(model.tables) == 26
    ncf = workloads.get("ncf").build(_cfg("ncf", max_table_rows=1000))
    assert ncf.mf_user.num_embeddings == 1000 and ncf.mf_item.num_embeddings == 1000


@pytest.mark.parametrize("model", ["dlrm_tiny", "ncf"])
def test_max_table_rows_zero_is_a_usage_error(model):
    with pytest.raises(UsageError, match="--max-table-rows"):
        _cfg(model, max_table_rows=0)


@pytest.mark.parametrize("model", ["tinycnn", "resnet18"])
def test_max_table_rows_on_a_non_recommendation_model_is_a_usage_error(model):
    with pytest.raises(UsageError, match="--max-table-rows does not apply"):
        _cfg(model, max_table_rows=1000)


def test_dlrm_tiny_flops_by_hand():
    """bottom 13-32-16, 2 cross layers 80->8->80, top 80-32-16-1 (80 = 16 * (4 tables + 1));
    backward is twice forward except the first layer, whose input (the dense features) needs no gradient."""
    forward = (_linear_flops(13, 32, 16) + 2 * (_linear_flops(80, 8) + _linear_flops(8, 80))
               + _linear_flops(80, 32, 16, 1))
    assert forward == 1856 + 5120 + 6176 == 13_152
    fl = workloads.get("dlrm_tiny").flops(_cfg("dlrm_tiny"))
    assert fl["forward"] == forward and fl["train"] == 3 * forward - 2 * 13 * 32 == 38_624


def test_ncf_flops_by_hand():
    """MLP 256-256-128-64 and the final 128 -> 1; every layer's input needs a gradient (embeddings)."""
    forward = _linear_flops(256, 256, 128, 64) + _linear_flops(64 + 64, 1)
    assert forward == 2 * (65_536 + 32_768 + 8_192 + 128) == 213_248
    fl = workloads.get("ncf").flops(_cfg("ncf"))
    assert fl["forward"] == forward and fl["train"] == 3 * forward


def test_dlrm_dcnv2_flops_by_hand():
    """bottom 13-512-256-128, 3 cross layers 3456->512->3456 (3456 = 128 * 27), top 3456-1024-1024-512-256-1."""
    forward = (_linear_flops(13, 512, 256, 128) + 3 * (_linear_flops(3456, 512) + _linear_flops(512, 3456))
               + _linear_flops(3456, 1024, 1024, 512, 256, 1))
    assert forward == 340_992 + 21_233_664 + 10_486_272 == 32_060_928
    fl = workloads.get("dlrm_dcnv2").flops(_cfg("dlrm_dcnv2", max_table_rows=64))
    assert fl["forward"] == forward and fl["train"] == 3 * forward - 2 * 13 * 512


@pytest.mark.isa
@pytest.mark.parametrize("model", ["dlrm_tiny", "ncf"])
def test_bf16_autocast_step_and_blocks(model):
    """Under CPU bf16 autocast the loss is an fp32 scalar; the named blocks are in the model."""
    import torch

    w = workloads.get(model)
    cfg = _cfg(model, **w.smoke_shape())
    net = w.build(cfg)
    x, y = w.make_batch(cfg, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = w.forward_loss(net, x, y)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    blocks = w.block_types(net)
    assert blocks and all(any(isinstance(m, b) for m in net.modules()) for b in blocks)


def test_activation_checkpointing_runs_on_the_blocks(tmp_path):
    from dlscale import api

    rec = api.train(model="dlrm_tiny", steps=2, warmup_steps=1, db=str(tmp_path / "r.db"), batch_size=16,
                    activation_checkpointing=True, **QUIET)
    assert rec.status == "ok" and all(math.isfinite(v) for v in rec.raw["loss"][0])


@pytest.mark.slow
def test_dlrm_tiny_two_rank_ddp(tmp_path):
    """Two DDP ranks (dense embedding gradients all-reduced): throughput counts both ranks' samples."""
    from dlscale import api
    from dlscale.layout import Layout

    rec = api.train(model="dlrm_tiny", layout=Layout(nproc_per_node=2), steps=3, warmup_steps=1,
                    db=str(tmp_path / "r.db"), batch_size=32, optimizer="adamw", lr=0.01, **QUIET)
    assert rec.status == "ok" and rec.metrics["world_size"] == 2
    assert rec.config["units_per_batch"] == 32 and rec.config["sample_unit"] == "samples"
    losses = rec.raw["loss"][0]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
