"""The step model of `dlscale predict` (predict/model.py) against hand-computed values.

docs/METRICS.md, "Prediction (`dlscale predict`): the step model", derives each equation.
"""

from __future__ import annotations

import random

import pytest

from dlscale.distributed.ladder import parse_layouts
from dlscale.errors import EXIT_USAGE, UsageError
from dlscale.predict import links
from dlscale.predict.links import Link
from dlscale.predict.fitted import fit_host_bandwidth, fit_overlap
from dlscale.predict.grads import Bucket, bucket_plan, ddp_buckets, profile
from dlscale.predict.model import (Compute, Loader, allreduce_s, compute_from_record, host_cost_s, predict_layouts,
                                   predict_step)
from dlscale.record import RunRecord

MiB = 2**20


def lk(alpha_s: float, bandwidth: float, name: str = "test") -> Link:
    return Link(name=name, alpha_s=alpha_s, bandwidth=bandwidth, source="hand-made for the test")


# -- compute from a record ----------------------------------------------------------------------

def train_record(**metrics) -> RunRecord:
    return RunRecord(kind="train", workload="resnet50", config={"model": "resnet50", "batch_size": 64},
                     metrics={"world_size": 1, **metrics}, run_id="20250101T000000-abcdef12")


def test_compute_from_record_scales_the_phases_to_the_measured_step():
    # phases sum to 0.625 s on instrumented steps; the window's mean step is 0.5 s: k = 0.8
    rec = train_record(step_time_mean=0.5, phase_forward=0.125, phase_backward=0.25, phase_optimizer=0.05,
                       phase_h2d=0.125, phase_data_wait=0.075)
    c = compute_from_record(rec)
    assert c.forward_s == pytest.approx(0.1)
    assert c.backward_s == pytest.approx(0.2)
    assert c.optimizer_s == pytest.approx(0.04)
    assert c.other_s == pytest.approx(0.16)  # (0.125 + 0.075) * 0.8
    assert c.step_s == pytest.approx(0.5)
    assert "scaled by 0.8000" in c.notes[0]
    assert compute_from_record(rec.to_dict()) == c  # the record's dict works too


def test_compute_without_phases_splits_by_the_backward_ratio_and_notes_it():
    rec = train_record(samples_per_step=64, throughput=128.0)  # step = 64 / 128 = 0.5 s
    c = compute_from_record(rec)  # not counted: backward twice forward
    assert (c.forward_s, c.backward_s, c.optimizer_s, c.other_s) == pytest.approx((0.5 / 3, 1 / 3, 0.0, 0.0))
    assert "no phase breakdown" in c.notes[0] and "--breakdown-steps" in c.notes[0]
    counted = compute_from_record(rec, 1.5)  # the model's counted FLOPs: forward 0.5 / 2.5, backward 1.5 x that
    assert (counted.forward_s, counted.backward_s) == pytest.approx((0.2, 0.3))
    assert counted.split.startswith("assumed: forward : backward = 1 : 1.5 (counted FLOPs)")


def imported_record(**config) -> RunRecord:
    """A one-GPU row as `dlscale import` stores it: kind train, imported, throughput only."""
    cfg = {"model": "resnet50", "system": "C4130-P100-16GB-PCIe", "batch_size": 128, "nodes": 1,
           "devices_per_node": 1, "world_size": 1, "family": "classification", "sample_unit": "images", **config}
    return RunRecord(kind="train", workload="resnet50", config=cfg,
                     metrics={"throughput": 283.0, "world_size": cfg["world_size"]},
                     imported=True, system={"name": cfg["system"], "imported": True}, run_id="20250101T000000-1mp0r7ed")


def test_compute_from_a_published_figure():
    """Seed 001's one P100: 283 images/s at batch 128 -> a step of 128 / 283 s, split by the counted FLOPs."""
    c = compute_from_record(imported_record(), 1.97)
    assert c.step_s == pytest.approx(128 / 283)
    assert c.forward_s == pytest.approx(128 / 283 / 2.97) and c.optimizer_s == 0.0 and c.other_s == 0.0
    assert "published figure (C4130-P100-16GB-PCIe: 283 images/s at batch 128" in c.notes[0]
    assert "1 : 1.97 (counted FLOPs)" in c.notes[0] and c.split.startswith("assumed")
    with pytest.raises(UsageError, match="without a batch size"):
        compute_from_record(imported_record(batch_size=None))
    with pytest.raises(UsageError, match="published figure in tokens/s"):
        compute_from_record(imported_record(sample_unit="tokens"))
    with pytest.raises(UsageError, match="on 4 rank"):
        compute_from_record(imported_record(world_size=4, devices_per_node=4))


@pytest.mark.parametrize("change", [{"status": "failed"}, {"kind": "micro"}, {"metrics": {"world_size": 4}}])
def test_compute_from_record_wants_an_ok_one_rank_train_run(change):
    rec = train_record(step_time_mean=0.5)
    for k, v in change.items():
        setattr(rec, k, v)
    with pytest.raises(UsageError, match=r"run 20250101T000000-abcdef12 .*one-device `dlscale train` run"):
        compute_from_record(rec)


# -- gradients and buckets -----------------------------------------------------------------------

def test_gradients_are_fp32_in_the_order_backward_produces_them():
    from dlscale import workloads

    params = list(workloads.get("tinycnn").build().parameters())
    prof = profile("tinycnn", "fp32")
    assert prof.nbytes == [4 * p.numel() for p in reversed(params)]  # a chain: backward runs it in reverse
    assert sorted(g.index for g in prof.grads) == list(range(len(params)))
    assert [g.ready for g in prof.grads] == sorted(g.ready for g in prof.grads) and prof.grads[-1].ready == 1.0
    assert profile("tinycnn", "bf16").nbytes == prof.nbytes  # autocast keeps parameters, so gradients, in fp32


def test_gradients_of_resnet50():
    prof = profile("resnet50", "fp16")
    assert sum(prof.nbytes) == 4 * 25_557_032  # torchvision's published parameter count
    assert prof.nbytes[:2] == [4 * 1000, 4 * 2048 * 1000]  # fc.bias, then fc.weight: backward starts at the top
    with pytest.raises(UsageError, match="unknown precision"):
        profile("resnet50", "fp64")


def test_resnet50_readiness_follows_backward_compute_not_bytes():
    """ResNet-50's last stage (layer4) and fc hold two thirds of the gradient bytes but about a fifth of
    backward's FLOPs: their gradients are all ready a fifth of the way into backward, not two thirds."""
    from dlscale import workloads

    names = [n for n, p in workloads.get("resnet50").build().named_parameters() if p.requires_grad]
    prof = profile("resnet50", "fp32", {"image_size": 224})
    top = [g for g in prof.grads if names[g.index].startswith(("layer4.", "fc."))]
    assert sum(g.nbytes for g in top) / sum(prof.nbytes) == pytest.approx(0.6657, abs=1e-4)
    assert max(g.ready for g in top) == pytest.approx(0.201, abs=0.005)
    assert prof.backward_ratio == pytest.approx(1.97, abs=0.01)  # backward counts about twice the forward's FLOPs
    plan = bucket_plan(prof.grads)
    assert [b.nbytes for b in plan] == ddp_buckets(prof.nbytes)
    assert plan[0].ready < 0.001 and plan[2].ready == pytest.approx(0.176, abs=0.005) and plan[-1].ready == 1.0


def test_a_model_that_cannot_run_on_meta_spreads_readiness_over_bytes(monkeypatch):
    from dlscale import workloads
    from dlscale.predict.grads import _profile

    w = workloads.get("tinycnn")
    monkeypatch.setattr(type(w), "forward_loss", lambda self, m, x, y: (_ for _ in ()).throw(
        RuntimeError("Tensor.item() cannot be called on meta tensors")))
    _profile.cache_clear()
    prof = profile("tinycnn", "fp32")
    _profile.cache_clear()
    assert prof.backward_ratio is None and "spread over gradient bytes" in prof.note and "item()" in prof.note
    total = sum(prof.nbytes)
    assert prof.grads[0].ready == pytest.approx(prof.nbytes[0] / total) and prof.grads[-1].ready == 1.0


def test_ddp_buckets_by_hand():
    # first cap 1 MiB: 300,000 + 800,000 = 1,100,000 >= 1,048,576 closes it; then 25 MiB caps
    sizes = [300_000, 800_000, 100_000, 30 * MiB, 10 * MiB, 10 * MiB, 10 * MiB, 1000]
    assert ddp_buckets(sizes) == [1_100_000, 100_000 + 30 * MiB, 30 * MiB, 1000]
    # a gradient over the cap arriving at an empty bucket is alone in it
    assert ddp_buckets([2 * MiB, 30 * MiB, 5 * MiB, 4 * MiB]) == [2 * MiB, 30 * MiB, 9 * MiB]
    assert ddp_buckets([]) == []
    with pytest.raises(UsageError, match="bucket caps"):
        ddp_buckets([4], bucket_cap=0)


def test_ddp_buckets_match_torch_ddp():
    """Same buckets as DDP's own assignment (the rebuild, with gradients given in ready order)."""
    import torch
    import torch.distributed as dist

    rng = random.Random(1)
    for _ in range(20):
        sizes = [4 * rng.choice([rng.randint(1, 2000), rng.randint(1, 4 * MiB)]) for _ in range(rng.randint(1, 40))]
        tensors = [torch.empty(s // 4) for s in sizes]
        groups, _ = dist._compute_bucket_assignment_by_size(tensors, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MiB])
        assert ddp_buckets(sizes) == [sum(sizes[i] for i in g) for g in groups]


def test_find_unused_parameters_keeps_ddp_s_construction_buckets():
    """Under find_unused_parameters DDP does not rebuild: its buckets are torch's assignment over the
    parameters in definition order, launched in reverse (torch.nn.parallel.DistributedDataParallel)."""
    import torch
    import torch.distributed as dist

    prof = profile("resnet50", "fp32")
    by_index = sorted(prof.grads, key=lambda g: g.index)
    tensors = [torch.empty(g.nbytes // 4) for g in by_index]
    groups, _ = dist._compute_bucket_assignment_by_size(tensors, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MiB])
    torch_order = [sum(by_index[i].nbytes for i in g) for g in reversed(groups)]
    plan = bucket_plan(prof.grads, rebuilt=False)
    assert [b.nbytes for b in plan] == torch_order
    assert plan[-1].nbytes < 2 * MiB and plan[-1].ready == 1.0  # the first parameters' small bucket goes last
    assert [b.nbytes for b in plan] != [b.nbytes for b in bucket_plan(prof.grads)]
    # an explicit --ddp-bucket-mb applies to the first bucket too: 50 MiB caps, no 1 MiB bucket
    assert [b.nbytes for b in bucket_plan(prof.grads, 50)] == ddp_buckets(prof.nbytes, 50 * MiB, 50 * MiB)


def test_buckets_launch_in_order_even_when_a_later_one_is_ready_first():
    # the second bucket is ready at 0.2 of backward, the first at 0.5: DDP launches the second only after the first
    plan = [Bucket(1_000_000, 0.5), Bucket(1_000_000, 0.2), Bucket(1_000_000, 1.0)]
    p = predict_step(Compute(1.0, 2.0, 0.0), plan, 1, 2, lk(0.0, 1e9), None)
    assert [b["ready_s"] for b in p.schedule] == pytest.approx([2.0, 2.0, 3.0])
    assert [b["start_s"] for b in p.schedule] == pytest.approx([2.0, 2.001, 3.0])


# -- all-reduce times ----------------------------------------------------------------------------

def test_ring_by_hand_for_four_ranks():
    # 2*3*5e-6 + 2*3/4 * 1e8 / 1e10 = 3e-5 + 0.015
    one_node = allreduce_s(1e8, 1, 4, lk(5e-6, 1e10), None)
    assert one_node == pytest.approx(0.01503, rel=1e-12)
    assert links.ring_allreduce_s(lk(5e-6, 1e10), 1e8, 4) == pytest.approx(0.01503, rel=1e-12)
    assert allreduce_s(1e8, 1, 1, None, None) == 0.0


def test_two_by_four_flat_ring_and_hierarchical_by_hand():
    intra, inter = lk(5e-6, 1e10), lk(2e-5, 1e9)
    # flat ring over 8 ranks at the slowest hop: 2*7*2e-5 + 2*7/8 * 1e8 / 1e9 = 2.8e-4 + 0.175
    assert allreduce_s(1e8, 2, 4, intra, inter) == pytest.approx(0.17528, rel=1e-12)
    # reduce-scatter + all-gather in each node (a ring of 4 on intra): 3e-5 + 0.015; across the 2 nodes
    # 4 rings of 1e8/4 bytes share the NIC: 2*1*2e-5 + 2*1/2 * 4 * (1e8/4) / 1e9 = 4e-5 + 0.1
    assert allreduce_s(1e8, 2, 4, intra, inter, "hierarchical") == pytest.approx(0.01503 + 0.10004, rel=1e-12)
    # one rank per node: a ring of 2 on the inter link
    assert allreduce_s(1e8, 2, 1, None, inter) == pytest.approx(0.10004, rel=1e-12)
    with pytest.raises(UsageError, match="algorithm"):
        allreduce_s(1e8, 2, 4, intra, inter, "tree")


def test_missing_links_are_usage_errors():
    with pytest.raises(UsageError, match=r"spans 2 nodes: give --inter LINK or record `dlscale micro collectives`"):
        allreduce_s(1e8, 2, 4, lk(5e-6, 1e10), None)
    with pytest.raises(UsageError, match="--inter LINK"):
        predict_step(Compute(1.0, 2.0, 0.5), [], 2, 1, None, None)  # even with nothing to reduce
    with pytest.raises(UsageError, match="--intra LINK"):
        predict_step(Compute(1.0, 2.0, 0.5), [4], 1, 4, None, None)


# -- the step ------------------------------------------------------------------------------------

COMPUTE = Compute(forward_s=1.0, backward_s=2.0, optimizer_s=0.5, other_s=0.25)
BUCKETS = [1_000_000, 2_000_000, 1_000_000]  # ready at 1 + 2*(1/4, 3/4, 4/4) = 1.5, 2.5, 3.0 s


def test_zero_communication_reproduces_the_compute():
    one = predict_step(COMPUTE, BUCKETS, 1, 1, None, None)
    assert (one.step_s, one.comm_s, one.exposed_s, one.comm_fraction, one.schedule) == (3.75, 0.0, 0.0, 0.0, [])
    free = lk(0.0, 1e30)  # T = 2(p-1)/p * n / 1e30: below the last bit of a 3 s step
    for nodes, per_node in [(1, 4), (2, 4), (4, 1)]:
        for algorithm in ("ring", "hierarchical"):
            p = predict_step(COMPUTE, BUCKETS, nodes, per_node, free, free, algorithm=algorithm)
            assert p.step_s == COMPUTE.step_s and p.exposed_s == 0.0
            assert len(p.schedule) == 3


def test_full_overlap_exposes_only_the_last_bucket():
    # 4 ranks, alpha 0, 1.5e9 B/s: T = 2*3/4 * n / 1.5e9 = n / 1e9 = 1, 2, 1 ms. Each all-reduce ends
    # long before the next bucket is ready; the last starts when backward ends (3.0 s): exposed = 1 ms.
    p = predict_step(COMPUTE, BUCKETS, 1, 4, lk(0.0, 1.5e9), None)
    assert [b["ready_s"] for b in p.schedule] == pytest.approx([1.5, 2.5, 3.0])
    assert [b["start_s"] for b in p.schedule] == pytest.approx([1.5, 2.5, 3.0])
    assert [b["end_s"] for b in p.schedule] == pytest.approx([1.501, 2.502, 3.001])
    assert p.exposed_s == pytest.approx(0.001)
    assert p.step_s == pytest.approx(3.75 + 0.001)
    assert p.comm_s == pytest.approx(0.004)
    assert p.comm_fraction == pytest.approx(0.004 / 3.751)


def test_no_overlap_exposes_all_but_the_time_from_the_first_ready_to_backwards_end():
    # 2 ranks, alpha 0.01 s, 1e6 B/s: T = 2*1*0.01 + 2*1/2 * n / 1e6 = 1.02, 2.02, 1.02 s.
    # starts 1.5, max(2.5, 2.52) = 2.52, max(3.0, 4.54) = 4.54; ends 2.52, 4.54, 5.56.
    # exposed = 5.56 - 3.0 = 2.56 = sum T (4.06) - (3.0 - 1.5)
    p = predict_step(COMPUTE, BUCKETS, 1, 2, lk(0.01, 1e6), None)
    assert [b["start_s"] for b in p.schedule] == pytest.approx([1.5, 2.52, 4.54])
    assert [b["end_s"] for b in p.schedule] == pytest.approx([2.52, 4.54, 5.56])
    assert p.exposed_s == pytest.approx(2.56)
    assert p.exposed_s == pytest.approx(p.comm_s - (3.0 - 1.5))
    assert p.step_s == pytest.approx(3.75 + 2.56)
    assert p.comm_fraction == pytest.approx(4.06 / 6.31)


def test_contention_slows_every_compute_phase():
    p = predict_step(COMPUTE, BUCKETS, 1, 4, lk(0.0, 1e30), None, contention=1.2)
    assert p.step_s == pytest.approx(3.75 * 1.2)
    assert p.schedule[-1]["ready_s"] == pytest.approx(3.6)
    with pytest.raises(UsageError, match="contention"):
        predict_step(COMPUTE, BUCKETS, 1, 4, lk(0.0, 1e30), None, contention=0.0)


def test_overlap_cost_slows_backward_while_an_all_reduce_is_in_flight():
    # the no-overlap link above (T = 1.02, 2.02, 1.02 s), cost 0.5: backward runs at half speed while one is in flight.
    # b1 ready at 1.5 (0.5 s of backward), in flight to 2.52. b2 needs 1.5 s of backward: by 2.52 it has
    # 0.5 + 1.02/2 = 1.01, then 0.49 at full speed: ready 3.01, in flight to 5.03. b3 needs 2.0: 0.5 more at
    # half speed, ready 4.01 = backward's end (1.01 late); it starts at 5.03, ends 6.05: exposed 2.04.
    p = predict_step(COMPUTE, BUCKETS, 1, 2, lk(0.01, 1e6), None, overlap_cost=0.5)
    assert [b["ready_s"] for b in p.schedule] == pytest.approx([1.5, 3.01, 4.01])
    assert [b["end_s"] for b in p.schedule] == pytest.approx([2.52, 5.03, 6.05])
    assert p.overlap_loss_s == pytest.approx(1.01) and p.exposed_s == pytest.approx(2.04)
    assert p.step_s == pytest.approx(4.01 + 2.04 + 0.75)
    free = predict_step(COMPUTE, BUCKETS, 1, 2, lk(0.01, 1e6), None)
    assert free.overlap_loss_s == 0.0 and free.step_s == pytest.approx(6.31)


def test_overlap_cost_one_serialises_every_all_reduce_with_backward():
    for link in (lk(0.01, 1e6), lk(5e-6, 1.5e9)):
        p = predict_step(COMPUTE, BUCKETS, 1, 4, link, None, overlap_cost=1.0)
        assert p.step_s == pytest.approx(COMPUTE.step_s + p.comm_s)  # nothing hidden: compute + every all-reduce
    with pytest.raises(UsageError, match="overlap cost"):
        predict_step(COMPUTE, BUCKETS, 1, 4, lk(0.0, 1e9), None, overlap_cost=1.5)


def test_fit_overlap_recovers_the_cost_and_puts_the_rest_in_contention():
    link = lk(0.01, 1e6)
    measured = predict_step(COMPUTE, BUCKETS, 1, 2, link, None, overlap_cost=0.3).step_s
    cost, c, how = fit_overlap(COMPUTE, BUCKETS, 2, link, measured)
    assert (cost, c) == pytest.approx((0.3, 1.0), abs=1e-9) and "solved" in how
    # slower than even no overlap explains: cost 1, the rest contention (solved with cost 1)
    slow = predict_step(COMPUTE, BUCKETS, 1, 2, link, None, contention=1.1, overlap_cost=1.0).step_s
    assert fit_overlap(COMPUTE, BUCKETS, 2, link, slow)[:2] == pytest.approx((1.0, 1.1))
    # measured contention is kept, not solved
    with_c = predict_step(COMPUTE, BUCKETS, 1, 2, link, None, contention=1.1, overlap_cost=0.6).step_s
    assert fit_overlap(COMPUTE, BUCKETS, 2, link, with_c, contention=1.1)[:2] == pytest.approx((0.6, 1.1))
    assert fit_overlap(COMPUTE, BUCKETS, 2, link, 5.0)[:2] == (0.0, 1.0)  # faster than free overlap


def test_nics_per_node_carry_the_inter_node_stage_side_by_side():
    """An HGX H100 has eight 400G rails: with one NIC per node the inter-node stage is 8x too slow."""
    nvl, ndr = links.link("nvlink4"), links.link("ib-ndr")
    S = 1e9
    # hierarchical 2x8: inside 2*7/8 S / 450e9; across, the 8 shard rings share the NICs: 2*1/2 S / (m 50e9)
    one = allreduce_s(S, 2, 8, nvl, ndr, "hierarchical")
    eight = allreduce_s(S, 2, 8, nvl, ndr, "hierarchical", nics=8)
    inside = 14 * 5e-6 + 1.75 * S / 450e9
    assert one == pytest.approx(inside + 2e-6 + S / 50e9)
    assert eight == pytest.approx(inside + 2e-6 + S / 400e9)
    assert (one - inside - 2e-6) / (eight - inside - 2e-6) == pytest.approx(8.0)
    # the flat ring's hop out of the node: min(intra, m x inter)
    assert allreduce_s(S, 2, 8, nvl, ndr, nics=8) == pytest.approx(30 * 5e-6 + 2 * 15 / 16 * S / 400e9)
    assert allreduce_s(S, 2, 8, nvl, ndr, nics=16) == pytest.approx(30 * 5e-6 + 2 * 15 / 16 * S / 450e9)
    with pytest.raises(UsageError, match="nics-per-node"):
        allreduce_s(S, 2, 8, nvl, ndr, nics=0)


def test_dgx1_ring_bandwidth_depends_on_the_gpus_in_the_ring():
    nv2 = links.link("nvlink2")
    # 1x2 on GPUs 0 and 1: one NVLink, 25 GB/s; not the 150 GB/s of all six
    assert allreduce_s(1e9, 1, 2, nv2, None) == pytest.approx(2 * 5e-6 + 1e9 / 25e9)
    assert allreduce_s(1e9, 1, 8, nv2, None) == pytest.approx(14 * 5e-6 + 1.75 * 1e9 / 150e9)
    with pytest.raises(UsageError, match="for 2, 3, 4, 8 GPUs per node, not 6"):
        allreduce_s(1e9, 1, 6, nv2, None)


# -- layouts -------------------------------------------------------------------------------------

def test_layouts_by_hand():
    # the no-overlap link: 1x2 step 6.31 s (above); 1x1 step 3.75 s; batch 10 per rank
    rows = predict_layouts(COMPUTE, BUCKETS, 10, [(1, 2)], lk(0.01, 1e6), None)
    (r,) = rows
    assert (r["layout"], r["nodes"], r["per_node"], r["devices"]) == ("1x2", 1, 2, 2)
    assert r["throughput"] == pytest.approx(20 / 6.31)
    assert r["speedup"] == pytest.approx((20 / 6.31) / (10 / 3.75))
    assert r["efficiency"] == pytest.approx(3.75 / 6.31) == pytest.approx(r["intra_node_efficiency"])
    assert r["inter_node_efficiency"] == pytest.approx(1.0)
    assert r["step_time"] == pytest.approx(6.31) and r["exposed_comm"] == pytest.approx(2.56)
    assert not r["input_bound"]


def test_layouts_split_efficiency_into_intra_and_inter_node():
    fast, slow = lk(0.0, 1.5e9), lk(0.01, 1e6)
    (r,) = predict_layouts(COMPUTE, BUCKETS, 10, [(2, 2)], fast, slow, contention={2: 1.1})
    x1, x12 = 10 / 3.75, 20 / predict_step(COMPUTE, BUCKETS, 1, 2, fast, None, 1.1).step_s
    assert r["intra_node_efficiency"] == pytest.approx(x12 / (2 * x1))
    assert r["inter_node_efficiency"] == pytest.approx(r["throughput"] / (2 * x12))
    assert r["efficiency"] == pytest.approx(r["intra_node_efficiency"] * r["inter_node_efficiency"])
    assert r["contention"] == 1.1
    with pytest.raises(UsageError, match="no contention factor for 2 ranks per host"):
        predict_layouts(COMPUTE, BUCKETS, 10, [(2, 2)], fast, slow, contention={4: 1.1})


def test_the_loader_caps_throughput():
    # 1x4 with free links would give 4 * 10 / 3.75 = 10.67/s; a loader of 2/s with unknown cores: 4 ranks' workers, 8/s
    (r,) = predict_layouts(COMPUTE, BUCKETS, 10, [(1, 4)], lk(0.0, 1e30), None, loader=Loader(2.0))
    assert r["throughput"] == pytest.approx(8.0) and r["input_bound"]
    assert r["efficiency"] == pytest.approx(1.0)  # the 1x1 is capped too, at 2/s


def test_a_host_s_loader_rate_is_shared_by_its_ranks():
    """The source run's 7 workers (one per core but the trainer's on 8 cores) gave 2 samples/s. Four
    ranks on that host keep a core each and share the other 4: 2 / 7 x 4 = 1.143/s for the host, not
    4 x 2. Two nodes of 4: twice that. Emulated nodes share one host: 2x2 is 4 ranks on it."""
    ld = Loader(2.0, workers=7, cores=8)
    assert ld.host_rate(1) == pytest.approx(2.0) and ld.host_rate(4) == pytest.approx(8 / 7)
    rows = {r["layout"]: r for r in predict_layouts(COMPUTE, BUCKETS, 10, [(1, 4), (2, 4)], lk(0.0, 1e30),
                                                     lk(0.0, 1e30), loader=ld)}
    assert rows["1x4"]["throughput"] == pytest.approx(8 / 7) and rows["1x4"]["input_bound"]
    assert rows["2x4"]["throughput"] == pytest.approx(16 / 7)
    (emulated,) = predict_layouts(COMPUTE, BUCKETS, 10, [(2, 2)], lk(0.0, 1e30), lk(0.0, 1e30), loader=ld,
                                  shared_host=True)
    assert emulated["throughput"] == pytest.approx(8 / 7)
    assert Loader(2.0, workers=0, cores=2).host_rate(4) == pytest.approx(4.0)  # each rank decodes, 2 cores
    assert Loader(2.0, workers=1, cores=2).host_rate(2) == pytest.approx(2.0)  # no core left: one slot at least
    with pytest.raises(UsageError, match="loader"):
        Loader(0.0)


@pytest.mark.parametrize("text", ["0x4", "2x", "x4", "2x0"])
def test_bad_layouts_exit_2(text):
    with pytest.raises(UsageError) as e:
        parse_layouts(text)
    assert e.value.exit_code == EXIT_USAGE
    assert parse_layouts("1x8,2x4") == [(1, 8), (2, 4)]


def test_host_cost_fitted_from_a_measured_run_and_added_per_bucket():
    link = lk(0.0, 1e9)
    # buckets 1e6 and 2e6 B on a 2-rank ring: the link alone takes 2*1/2*3e6 / 1e9 = 3 ms; measured 6 ms
    beta = fit_host_bandwidth(6e-3, [1_000_000, 2_000_000], 2, link)
    assert beta == pytest.approx(3e6 / 3e-3)  # the 3 MB the ring moved over the 3 ms the link does not explain
    assert host_cost_s(1_000_000, 2, beta) == pytest.approx(1e-3)
    assert fit_host_bandwidth(2e-3, [1_000_000, 2_000_000], 2, link) is None  # the link explains it all
    assert host_cost_s(1_000_000, 1, beta) == 0.0 and host_cost_s(1_000_000, 4, None) == 0.0
    compute = Compute(forward_s=0.01, backward_s=0.02, optimizer_s=0.0)
    with_cost = predict_step(compute, [1_000_000, 2_000_000], 1, 2, link, None, host_bandwidth=beta)
    without = predict_step(compute, [1_000_000, 2_000_000], 1, 2, link, None)
    assert with_cost.comm_s == pytest.approx(without.comm_s + 3e-3)
