"""Link models for prediction: the alpha-beta fit, the datasheet table, emulated and measured links."""

from __future__ import annotations

import json
import random

import pytest

from dlscale.errors import UsageError
from dlscale.predict.links import (DATASHEET, Link, fit_alpha_beta, find_measured, from_collectives, level_of, link,
                                   ring_allreduce_s)
from dlscale.record import RunRecord
from dlscale.store import Store

SIZES = [65536 * 2 ** i for i in range(11)]  # 64 KiB .. 64 MiB


def ring_times(alpha: float, bandwidth: float, p: int, sizes: list[int] = SIZES) -> list[float]:
    return [2 * (p - 1) * alpha + 2 * (p - 1) / p * s / bandwidth for s in sizes]


def coll_record(alpha: float, bandwidth: float, p: int = 2, *, nodes: int = 1, emulated: bool = False,
                rate: str | None = None, created: str = "2025-01-01T00:00:00.000+00:00",
                ops: tuple[str, ...] = ("all_reduce",), mode: str = "in-place") -> RunRecord:
    """A micro collectives record shaped as coll_worker writes it, its all_reduce times from (alpha, bandwidth)."""
    rows = []
    for op in ops:
        for s, t in zip(SIZES, ring_times(alpha, bandwidth, p)):
            cell = {"time_us": t * 1e6, "algbw": s / t / 1e9, "busbw": s / t / 1e9 * 2 * (p - 1) / p,
                    "wrong": 0, "iters": 20}
            other = "out-of-place" if mode == "in-place" else "in-place"
            rows.append({"op": op, "size": s, "count": s // 4, "type": "float", "redop": "sum", "root": -1,
                         mode: cell, other: None})
    config = {"world_size": p, "nodes": nodes, "devices_per_node": p // nodes, "backend": "gloo",
              "emulated_nodes": emulated, "link_bandwidth": rate, "launcher": "torchrun"}
    return RunRecord(kind="micro", workload="collectives", config=config, raw={"rows": rows}, created_at=created)


# -- the alpha-beta model and its fit ---------------------------------------------------------

def test_ring_allreduce_by_hand():
    # p = 4, alpha 5 us, 10 GB/s, 1 MiB: 6 x 5 us + 6/4 x 1,048,576 / 1e10 s = 30 us + 157.2864 us
    lk = Link("x", 5e-6, 10e9, "hand")
    assert ring_allreduce_s(lk, 1_048_576, 4) == pytest.approx(187.2864e-6, rel=1e-12)
    assert ring_allreduce_s(lk, 1_048_576, 1) == 0.0


def test_fit_by_hand_two_points():
    # p = 2: T = 2 alpha + S / bw. Two points (1e6 B, 1.02 ms), (2e6 B, 2.02 ms): slope 1e-9 s/B,
    # intercept 20 us -> alpha = 20 us / 2 = 10 us, bandwidth = 1 / 1e-9 = 1e9 B/s; a line through 2 points: R^2 1.
    alpha, bw, r2 = fit_alpha_beta([1_000_000, 2_000_000], [1.02e-3, 2.02e-3], 2)
    assert alpha == pytest.approx(10e-6, rel=1e-9)
    assert bw == pytest.approx(1e9, rel=1e-9)
    assert r2 == pytest.approx(1.0)


def test_fit_recovers_exact_alpha_and_bandwidth():
    alpha, bw, r2 = fit_alpha_beta(SIZES, ring_times(5e-6, 10e9, 4), 4)
    assert alpha == pytest.approx(5e-6, rel=1e-9)
    assert bw == pytest.approx(10e9, rel=1e-9)
    assert r2 == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_fit_with_one_percent_noise_within_three_percent(seed):
    rng = random.Random(seed)
    times = [t * (1 + rng.uniform(-0.01, 0.01)) for t in ring_times(5e-6, 10e9, 4)]
    alpha, bw, r2 = fit_alpha_beta(SIZES, times, 4)
    assert alpha == pytest.approx(5e-6, rel=0.03)
    assert bw == pytest.approx(10e9, rel=0.03)
    assert 0.999 < r2 <= 1.0


def test_negative_intercept_clamps_alpha_to_zero():
    alpha, bw, _ = fit_alpha_beta([1_000_000, 2_000_000], [0.9e-3, 1.9e-3], 2)
    assert alpha == 0.0 and bw == pytest.approx(1e9)


@pytest.mark.parametrize("sizes, times, ranks, words", [
    ([1024, 1024], [1e-5, 1.1e-5], 2, "2 or more distinct sizes"),
    ([1024, 2048], [1e-5, 2e-5], 1, "2 or more ranks"),
    ([1024, 2048], [2e-5, 1e-5], 2, "times do not grow with size: cannot fit a bandwidth"),
    ([1024, 2048], [1e-5, 1e-5], 2, "times do not grow with size"),
    ([1024, 2048], [1e-5], 2, "one time per size"),
    ([1024, 2048], [0.0, 1e-5], 2, "> 0"),
])
def test_fit_refuses_what_it_cannot_fit(sizes, times, ranks, words):
    with pytest.raises(UsageError, match=words):
        fit_alpha_beta(sizes, times, ranks)


# -- datasheet and emulated links ------------------------------------------------------------

def test_datasheet_figures_and_sources():
    for name, lk in DATASHEET.items():
        assert lk.name == name and lk.source.strip() and lk.bandwidth > 0 and lk.alpha_s > 0
        assert "not a datasheet value" in lk.source  # the latencies are typical figures, said so
        back = Link.from_dict(json.loads(json.dumps(lk.to_dict())))  # as a record stores it
        assert back == lk and back.ring_bandwidth == lk.ring_bandwidth
    assert DATASHEET["pcie-gen4-x16"].bandwidth == pytest.approx(16e9 * 16 / 8 * 128 / 130)
    assert DATASHEET["pcie-gen3-x16"].bandwidth == pytest.approx(15.75e9, rel=1e-3)
    assert DATASHEET["pcie-gen5-x16"].bandwidth == pytest.approx(63.0e9, rel=1e-3)
    assert "128b/130b" in DATASHEET["pcie-gen4-x16"].source and "4.0 (2017)" in DATASHEET["pcie-gen4-x16"].source
    assert DATASHEET["ib-edr"].bandwidth == 12.5e9
    assert DATASHEET["ib-hdr"].bandwidth == 25e9 and DATASHEET["ib-ndr"].bandwidth == 50e9
    assert DATASHEET["nvlink2"].bandwidth == 150e9 and DATASHEET["nvlink3"].bandwidth == 300e9
    assert DATASHEET["nvlink4"].bandwidth == 450e9 and "H100" in DATASHEET["nvlink4"].source
    assert [DATASHEET[f"{g}gbe"].bandwidth for g in (10, 25, 100, 400)] == [1.25e9, 3.125e9, 12.5e9, 50e9]


# three edge-disjoint rings over a DGX-1's eight V100s, each hop one NVLink connection (NVIDIA's "three
# interwoven rings of single NVLink connections"); found by search over DGX1_NVLINKS, written out here
DGX1_THREE_RINGS = ((0, 1, 2, 3, 7, 5, 6, 4), (0, 2, 6, 7, 4, 5, 1, 3), (0, 3, 2, 1, 5, 6, 7, 4))
DGX1_QUAD_RINGS = ((0, 1, 2, 3), (0, 2, 1, 3))  # over GPUs 0-3, each run in both directions


def _fits(rings: tuple[tuple[int, ...], ...], nvlinks: dict) -> bool:
    """Every hop of every ring (each used in both directions, full duplex) is an NVLink, and no pair
    carries more rings than it has connections."""
    used: dict[tuple[int, int], int] = {}
    for ring in rings:
        for a, b in zip(ring, ring[1:] + ring[:1]):
            pair = (min(a, b), max(a, b))
            used[pair] = used.get(pair, 0) + 1
    return all(nvlinks.get(pair, 0) >= n for pair, n in used.items())


def test_nvlink2_is_a_dgx1_hybrid_cube_mesh_not_nvswitch():
    """A ring over GPUs 0..g-1 of a DGX-1 reaches only the links among them: the row's rate per g is the
    fewest links any of them has to the others (a rank sends no faster), and rings reaching it exist."""
    from dlscale.predict.links import DGX1_NVLINKS, links_within

    assert all(sum(n for pair, n in DGX1_NVLINKS.items() if g in pair) == 6 for g in range(8))  # six per V100
    nv2 = DATASHEET["nvlink2"]
    assert nv2.ring_bandwidth == {2: 25e9, 3: 50e9, 4: 100e9, 8: 150e9}
    assert [links_within(range(g)) for g in (2, 3, 4, 8)] == [1, 2, 4, 6]
    # the bound is reached: 3 single-link rings x 2 directions x 25 GB/s = 150 over eight GPUs
    assert all(len(set(r)) == 8 for r in DGX1_THREE_RINGS) and _fits(DGX1_THREE_RINGS, DGX1_NVLINKS)
    assert _fits(DGX1_QUAD_RINGS, DGX1_NVLINKS) and 2 * 2 * 25e9 == nv2.bandwidth_for(4)
    assert _fits(((0, 1, 2),), DGX1_NVLINKS) and 2 * 25e9 == nv2.bandwidth_for(3)
    # GPU 4 has one neighbour among GPUs 0-4: no ring over five GPUs on NVLink alone
    assert [p for p in DGX1_NVLINKS if 4 in p and set(p) <= set(range(5))] == [(0, 4)]
    with pytest.raises(UsageError, match="2, 3, 4, 8 GPUs per node, not 5"):
        nv2.bandwidth_for(5)
    assert "hybrid cube-mesh" in nv2.source and "NVSwitch" not in nv2.source
    dgx2 = DATASHEET["nvlink2-nvswitch"]  # V100s behind NVSwitch reach every link in any ring
    assert dgx2.bandwidth_for(2) == dgx2.bandwidth_for(8) == 150e9 and "NVSwitch" in dgx2.source
    assert ring_allreduce_s(nv2, 1e9, 2) == pytest.approx(2 * 5e-6 + 1e9 / 25e9)


def test_link_by_name_alias_and_rate():
    assert link("NVLink4") is DATASHEET["nvlink4"]
    assert link("edr") is DATASHEET["ib-edr"] and link(" NDR ") is DATASHEET["ib-ndr"]
    assert link("100gbe") is DATASHEET["100gbe"]
    emu = link("1gbit")
    # a TCP stream carries 1448 of every 1514 bytes tbf counts (MTU 1500 less IPv4, TCP and timestamps; + Ethernet)
    assert emu.bandwidth == pytest.approx(125e6 * 1448 / 1514) and emu.alpha_s == 0.0 and emu.name == "emulated 1gbit"
    assert "tbf" in emu.source
    assert link("100mbit").bandwidth == pytest.approx(12.5e6 * 1448 / 1514)
    assert link("10gbit").bandwidth == pytest.approx(1.25e9 * 1448 / 1514)


def test_unknown_link_lists_the_names():
    with pytest.raises(UsageError) as e:
        link("infiniband-xdr")
    msg = str(e.value)
    assert "\n" not in msg and "'infiniband-xdr'" in msg
    assert all(name in msg for name in DATASHEET) and "1gbit" in msg


def test_link_validates_and_round_trips_a_fit():
    with pytest.raises(UsageError, match="bandwidth"):
        Link("x", 0.0, 0.0, "hand")
    with pytest.raises(UsageError, match="alpha_s"):
        Link("x", -1e-6, 1e9, "hand")
    with pytest.raises(UsageError, match="unknown"):
        Link.from_dict({"name": "x", "alpha_s": 0, "bandwidth": 1, "source": "s", "speed": 2})
    lk = from_collectives(coll_record(20e-6, 1e9))
    back = Link.from_dict(lk.to_dict())
    assert back == lk and back.fit == lk.fit


# -- measured links --------------------------------------------------------------------------

def test_from_collectives_recovers_alpha_and_bandwidth():
    rec = coll_record(50e-6, 125e6, p=2, nodes=2, emulated=True, rate="1gbit")
    lk = from_collectives(rec)
    assert lk.alpha_s == pytest.approx(50e-6, rel=1e-6) and lk.bandwidth == pytest.approx(125e6, rel=1e-9)
    assert lk.name.startswith(f"measured {rec.run_id}") and "2 ranks over emulated 1gbit" in lk.name
    assert rec.run_id in lk.source
    assert {k: lk.fit[k] for k in ("run_id", "ranks", "points", "sizes")} == \
        {"run_id": rec.run_id, "ranks": 2, "points": len(SIZES), "sizes": SIZES}
    assert lk.fit["r2"] == pytest.approx(1.0)
    assert "2 ranks, 1 node" in from_collectives(coll_record(5e-6, 10e9)).name


def test_from_collectives_uses_out_of_place_when_that_is_what_exists():
    lk = from_collectives(coll_record(5e-6, 10e9, p=4, mode="out-of-place"))
    assert lk.bandwidth == pytest.approx(10e9, rel=1e-9) and lk.alpha_s == pytest.approx(5e-6, rel=1e-6)


def test_from_collectives_without_all_reduce_rows():
    rec = coll_record(5e-6, 10e9, ops=("broadcast",))
    with pytest.raises(UsageError, match=f"run {rec.run_id} has no all_reduce.*--ops all_reduce"):
        from_collectives(rec)


def test_level_of():
    assert level_of(coll_record(1e-6, 1e9)) == "intra"
    assert level_of(coll_record(1e-6, 1e9, nodes=2)) == "inter"
    assert level_of(coll_record(1e-6, 1e9, emulated=True, rate="1gbit")) == "inter"


def test_find_measured_picks_the_newest_of_the_level(db_path):
    old_inter = coll_record(30e-6, 125e6, nodes=2, emulated=True, rate="1gbit", created="2025-01-01T00:00:01.000+00:00")
    new_inter = coll_record(40e-6, 120e6, nodes=2, emulated=True, rate="1gbit", created="2025-01-03T00:00:00.000+00:00")
    fast_inter = coll_record(10e-6, 1.2e9, nodes=2, emulated=True, rate="10gbit",
                             created="2025-01-04T00:00:00.000+00:00")
    intra = coll_record(5e-6, 10e9, created="2025-01-02T00:00:00.000+00:00")
    broadcast_only = coll_record(5e-6, 10e9, ops=("broadcast",), created="2025-01-05T00:00:00.000+00:00")
    failed = coll_record(1e-6, 99e9, created="2025-01-06T00:00:00.000+00:00")
    failed.fail("a rank crashed")
    with Store.open(db_path) as store:
        assert find_measured(store, "inter") is None
        for rec in (old_inter, new_inter, fast_inter, intra, broadcast_only, failed):
            store.insert(rec)
        assert find_measured(store, "inter").fit["run_id"] == fast_inter.run_id
        got = find_measured(store, "inter", "1gbit")
        assert got.fit["run_id"] == new_inter.run_id and got.bandwidth == pytest.approx(120e6)
        assert find_measured(store, "inter", "1000mbit").fit["run_id"] == new_inter.run_id
        assert find_measured(store, "intra").fit["run_id"] == intra.run_id
        assert find_measured(store, "inter", "100mbit") is None
        with pytest.raises(UsageError, match="intra, inter"):
            find_measured(store, "node")


def test_find_measured_passes_over_nodes_set_apart(db_path):
    healthy = coll_record(40e-6, 120e6, nodes=2, emulated=True, rate="1gbit", created="2025-01-01T00:00:00.000+00:00")
    slow_node = coll_record(40e-6, 12e6, nodes=2, emulated=True, rate="1gbit", created="2025-01-02T00:00:00.000+00:00")
    slow_node.config["node_link_bandwidth"] = {"1": "100mbit"}
    quota = coll_record(40e-6, 60e6, nodes=2, emulated=True, rate="1gbit", created="2025-01-03T00:00:00.000+00:00")
    quota.config["node_cpu_quota"] = {"1": 0.5}
    with Store.open(db_path) as store:
        for rec in (healthy, slow_node, quota):
            store.insert(rec)
        assert find_measured(store, "inter", "1gbit").fit["run_id"] == healthy.run_id


def test_nvlink5_rows_take_the_generations_per_link_rate():
    assert DATASHEET["nvlink5"].bandwidth == 18 * 50e9 and "B200" in DATASHEET["nvlink5"].source
    assert link("nvlink-b200") is DATASHEET["nvlink5"]
