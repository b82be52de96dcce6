"""Accept's collectives within a node: judged on their bandwidth plateau, each against its own fraction
of the NVLink rate (accept/figures/collect.py ``plateau``, accept/sources/datasheet.py ``COLLECTIVE_FRACTIONS``)."""

from __future__ import annotations

import pytest

import accept_records as ar
from dlscale.accept.sources import datasheet
from dlscale.accept.figures import collect as figures

MIB = 2**20


def coll(curves: dict[str, dict[int, float]], world: int = 8):
    """A ``micro collectives`` record on one node: per op, busbw (GB/s) by size, both modes alike."""
    rows = [{"op": op, "size": s, "in-place": {"busbw": b}, "out-of-place": {"busbw": b}}
            for op, curve in curves.items() for s, b in curve.items()]
    return ar.rec("micro", "collectives", {"world_size": world, "nodes": 1}, {}, {"rows": rows})


def rising(top: float, half: float, sizes) -> dict[int, float]:
    """busbw approaching ``top`` as size grows, at half of it at ``half`` bytes (latency-bound below)."""
    return {s: top * s / (s + half) for s in sizes}


def test_the_plateau_is_where_busbw_levelled_off_not_every_size_near_the_largest():
    curve = rising(400.0, 32 * MIB, [MIB * 2**k for k in range(11)])  # 1M .. 1G
    (f,) = figures.figures([coll({"all_reduce": curve})])
    # 1G 388, 512M 376, 256M 356 (>= 0.9 x 388), 128M 320 (< 349): the plateau is 256M..1G
    assert f.context["plateau"] == {"from_bytes": 256 * MIB, "to_bytes": 1024 * MIB, "levelled": True}
    assert len(f.samples) == 6 and f.value == pytest.approx((curve[256 * MIB] * curve[512 * MIB] * curve[1024 * MIB])
                                                            ** (1 / 3))
    # the old rule (every size within 1/8 of the largest) took 128M in as well
    assert f.value > (curve[128 * MIB] * curve[256 * MIB] * curve[512 * MIB] * curve[1024 * MIB]) ** 0.25


def test_a_dip_past_the_plateau_and_a_plateau_not_yet_reached():
    dip = {64 * MIB: 300.0, 128 * MIB: 390.0, 256 * MIB: 400.0, 512 * MIB: 395.0, 1024 * MIB: 250.0}
    climbing = {64 * MIB: 100.0, 128 * MIB: 200.0, 256 * MIB: 400.0}
    a, b = figures.figures([coll({"all_gather": dip, "broadcast": climbing})])
    assert a.context["plateau"] == {"from_bytes": 128 * MIB, "to_bytes": 512 * MIB, "levelled": True}
    assert b.context["plateau"] == {"from_bytes": 256 * MIB, "to_bytes": 256 * MIB, "levelled": False}
    assert b.value == pytest.approx(400.0)


def test_each_collective_has_its_own_fraction_of_the_nvlink_rate():
    sizes = [MIB * 2**k for k in range(6, 11)]
    ops = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
    rec = coll({op: rising(400.0, 32 * MIB, sizes) for op in ops})
    sys = ar.system(8)  # H100 SXM: 18 NVLinks x 25 GB/s = 450 GB/s per direction through NVSwitch
    rated = {f.context["op"]: datasheet.expectation(f, sys) for f in figures.figures([rec])}
    assert {op: r.value for op, r in rated.items()} == pytest.approx(
        {"all_reduce": 0.75 * 450, "reduce_scatter": 0.7 * 450, "all_gather": 0.7 * 450, "broadcast": 0.6 * 450,
         "all_to_all": 0.6 * 450})
    assert all(r.rated == 450.0 and "the slowest GPU pair of the 8" in r.source for r in rated.values())
    for f in datasheet.COLLECTIVE_FRACTIONS.values():
        assert 0 < f.value < 1 and f.source.startswith("dlscale's choice")


def test_no_datasheet_expectation_without_nvlink_between_every_pair_or_across_nodes():
    rec = coll({"all_reduce": rising(40.0, 8 * MIB, [MIB * 2**k for k in range(4, 9)])}, world=4)
    sys = ar.system(4)
    sys["accelerators"]["topology"]["gpu_gpu"][0][3] = sys["accelerators"]["topology"]["gpu_gpu"][3][0] = "SYS"
    (f,) = figures.figures([rec])
    assert datasheet.expectation(f, sys) is None
    rec.config["nodes"] = 2
    (f,) = figures.figures([rec])
    assert datasheet.expectation(f, ar.system(4)) is None
