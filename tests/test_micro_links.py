"""micro links: the pair figures by hand, why every pair is measured (a star's pair runs at its
slower link, so only each node's fastest pair isolates its own link), the record's shape, and
three emulated nodes with one link 10x slower: the run names that node."""

from __future__ import annotations

import json

import pytest

from dlscale.errors import UsageError
from dlscale.micro.links import (LinkOptions, all_pairs, node_links, pair_row, shaped_rates, summarize,
                                 two_node_warning)

MIB2 = 2 * 2**20


def test_pair_row_by_hand():
    # 2 MiB each way in 0.02 s and 0.04 s: samples 2097152 / t / 1e9 = 0.1048576 and 0.0524288 GB/s;
    # algbw from the mean time 0.03 s: 0.0699050667 GB/s; busbw = algbw (send/recv, factor 1)
    row = pair_row(0, 2, MIB2, [0.02, 0.04], wrong=0)
    assert row["samples"] == pytest.approx([0.1048576, 0.0524288])
    assert row["algbw_gbps"] == pytest.approx(0.0699050667) and row["busbw_gbps"] == row["algbw_gbps"]
    assert row["time_us"] == pytest.approx(30_000) and row["iters"] == 2
    assert (row["src_node"], row["dst_node"], row["size"]) == (0, 2, MIB2)


def test_every_pair_in_order():
    assert all_pairs(2) == [(0, 1)]
    assert all_pairs(3) == [(0, 1), (0, 2), (1, 2)]
    assert len(all_pairs(8)) == 28  # K(K-1)/2


def _star(rates: list[float], size: int = MIB2) -> list[dict]:
    """Rows of a star: pair (i, j) runs at the slower of link i and link j (GB/s), one time per row."""
    return [pair_row(i, j, size, [size / min(rates[i], rates[j]) / 1e9]) for i, j in all_pairs(len(rates))]


@pytest.mark.parametrize("slow", [0, 1, 2, 3])
def test_each_node_shows_its_own_link_and_the_slow_one_is_named(slow):
    rates = [1.0] * 4
    rates[slow] = 0.1
    links = node_links(_star(rates), 4)
    assert [e["src_node"] for e in links] == [0, 1, 2, 3]
    assert [e["busbw_gbps"] for e in links] == pytest.approx(rates)  # each node's own rate, node 0 too
    m = summarize(links, _star(rates), 4)
    assert m["slowest_link_src_node"] == slow
    assert (m["link_busbw_min"], m["link_busbw_median"], m["link_busbw_max"]) == pytest.approx((0.1, 1.0, 1.0))
    assert m["slowest_link_fraction"] == pytest.approx(0.1) and m["pairs"] == 6 and m["nodes"] == 4


def test_why_not_node_0_to_each_or_a_ring():
    # Node 0 slow: "node 0 with each other node" gives 0-1, 0-2 both slow (the median is slow, no
    # outlier); a ring of three gives 0-1, 1-2, 2-0 with two slow (the median is slow, the healthy
    # pair looks like the outlier). Every pair with each node's fastest isolates node 0.
    rates = [0.1, 1.0, 1.0]
    rows = _star(rates)
    star_from_0 = sorted(r["busbw_gbps"] for r in rows if r["src_node"] == 0)
    assert star_from_0 == pytest.approx([0.1, 0.1])
    ring = sorted(r["busbw_gbps"] for r in rows)
    assert ring[1] == pytest.approx(0.1)  # the median of the ring's three pairs is a slow one
    links = node_links(rows, 3)
    assert [e["busbw_gbps"] for e in links] == pytest.approx([0.1, 1.0, 1.0])
    assert [(e["src_node"], e["dst_node"]) for e in links] == [(0, 1), (1, 2), (2, 1)]


def test_entries_carry_the_largest_size_and_its_samples():
    rows = [pair_row(0, 1, 1024, [1e-3, 1e-3]), pair_row(0, 1, MIB2, [0.01, 0.03])]
    (e0, e1) = node_links(rows, 2)
    assert e0["size"] == MIB2 and e0["samples"] == pytest.approx([0.2097152, 0.0699050667])
    assert (e0["src_node"], e0["dst_node"], e1["src_node"], e1["dst_node"]) == (0, 1, 1, 0)
    assert set(e0) >= {"src_node", "dst_node", "algbw_gbps", "busbw_gbps", "samples"}
    assert two_node_warning(2) and not two_node_warning(3)


def test_shaped_rate_is_the_slower_of_the_two_links():
    links = node_links(_star([0.125, 0.125, 0.0125]), 3)
    rates = {0: "1gbit", 1: "1gbit", 2: "100mbit"}
    shaped_rates(links, rates.get)
    assert [e["shaped_gbps"] for e in links] == pytest.approx([0.125, 0.125, 0.0125])
    shaped_rates(links, lambda k: None)
    assert [e["shaped_gbps"] for e in links] == [None, None, None]


def test_each_node_is_measured_by_its_lowest_rank():
    from dlscale.micro.link_worker import leaders, node_hosts

    assert leaders([(0, 0, "a"), (1, 0, "a"), (2, 1, "b"), (3, 1, "b")]) == {0: 0, 1: 2}
    assert leaders([(3, 0, "a"), (1, 1, "b"), (0, 1, "b"), (2, 0, "a")]) == {0: 2, 1: 0}  # any rank order (srun, mpirun)
    assert node_hosts([(3, 0, "gpu07"), (1, 1, "gpu08"), (0, 1, "gpu08"), (2, 0, "gpu07")]) == {"0": "gpu07", "1": "gpu08"}
    assert node_hosts([(0, 0, "vm"), (1, 1, "vm")]) == {}  # emulated nodes share the host: named by their index


def test_gloo_exchanges_cpu_tensors():
    from dlscale.micro.links import device_for

    assert device_for("auto", "gloo") == "cpu"  # emulated nodes on a GPU machine still measure the link
    assert device_for("auto", None) == "auto" and device_for("cuda", "nccl") == "cuda"
    with pytest.raises(UsageError, match="--backend nccl"):
        device_for("cuda", "gloo")


def test_options_are_checked():
    for bad in (dict(sizes="1,2"), dict(iters=0), dict(budget=0), dict(device="tpu")):
        with pytest.raises(UsageError):
            LinkOptions(**bad)


def test_one_node_is_a_usage_error(cli, db_path):
    r = cli("micro", "links", "--sizes", "1M")
    assert r.code == 2 and "between nodes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert cli("micro", "links", "--precision", "fp32").code == 2  # an option links does not take


def test_report_names_the_slowest_link():
    from rich.console import Console

    from dlscale.micro.report import print_record
    from dlscale.record import RunRecord

    rows = _star([0.125, 0.125, 0.0125])
    links = node_links(rows, 3)
    rec = RunRecord(kind="micro", workload="links", config={"backend": "gloo"},
                    metrics=summarize(links, rows, 3), raw={"rows": rows, "links": links})
    console = Console(record=True, width=160)
    print_record(rec, console)
    text = console.export_text()
    assert "slowest link: node 2's" in text and "10.00% of the median" in text


@pytest.mark.slow
@pytest.mark.long
def test_three_emulated_nodes_with_one_link_10x_slower_name_it(cli, db_path):
    from conftest import namespaces_left, need_system
    from dlscale.distributed import netns

    need_system("network namespaces (root, iproute2)", netns.unavailable_reason(), "DLSCALE_REQUIRE_NETNS")
    before = set(netns.list_namespaces())
    r = cli("micro", "links", "--emulate-nodes", "3", "--link-bandwidth", "1gbit", "--node-link-bandwidth",
            "2=100mbit", "--sizes", "256K,2M", "--iters", "3", "--timeout", "120", "--format", "json")
    assert r.code == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    m, c, links = doc["metrics"], doc["config"], doc["links"]
    assert (c["nodes"], c["emulated_nodes"], c["node_link_bandwidth"]) == (3, True, {"2": "100mbit"})
    assert m["slowest_link_src_node"] == 2 and m["wrong"] == 0 and m["pairs"] == 3
    by_node = {e["src_node"]: e for e in links}
    assert sorted(by_node) == [0, 1, 2] and by_node[2]["dst_node"] in (0, 1)
    assert {by_node[0]["dst_node"], by_node[1]["dst_node"]} == {0, 1}  # the healthy nodes measure each other
    for k in (0, 1):  # a healthy link is many times the slow one (shaped 10x)
        assert by_node[k]["busbw_gbps"] > 4 * by_node[2]["busbw_gbps"]
        assert by_node[k]["busbw_gbps"] < 0.125 * 1.5
    assert m["slowest_link_fraction"] < 0.25
    assert len(by_node[2]["samples"]) == by_node[2]["iters"] >= 1
    assert namespaces_left(before) == []  # no namespace of the run left behind
