"""Layout's per-node options: how they are written, checked where the Layout is built, recorded,
carried to the ranks, and shared by every command that takes a layout."""

import json

import pytest

from dlscale.errors import UsageError
from dlscale.layout import Layout


def test_per_node_values_in_every_spelling_are_one_layout():
    want = Layout(emulate_nodes=3, link_bandwidth="1gbit", node_link_bandwidth=((0, "10gbit"), (2, "100mbit")),
                  node_cpu_quota=((1, 0.5),))
    for links, quota in (("2=100mbit,0=10gbit", "1=0.5"), (["2=100mbit", "0=10gbit"], ["1=0.5"]),
                         ({2: "100mbit", "0": "10gbit"}, {1: 0.5}), ([[2, "100mbit"], [0, "10gbit"]], [(1, "0.5")])):
        assert Layout(emulate_nodes=3, link_bandwidth="1gbit", node_link_bandwidth=links, node_cpu_quota=quota) == want
    assert Layout(**json.loads(json.dumps(want.to_dict()))) == want  # the RankSpec's round trip
    assert [want.node_rate(k) for k in range(3)] == ["10gbit", "1gbit", "100mbit"]
    assert want.slowest_link() == "100mbit"
    assert Layout(emulate_nodes=2, node_link_bandwidth="1=10mbit").slowest_link() == "10mbit"
    assert Layout(emulate_nodes=2).slowest_link() is None


@pytest.mark.parametrize("kw, needle", [
    (dict(node_link_bandwidth="1=100mbit"), "--emulate-nodes"),
    (dict(node_cpu_quota="1=0.5"), "--emulate-nodes"),
    (dict(emulate_nodes=2, node_link_bandwidth="2=100mbit"), "node 2"),
    (dict(emulate_nodes=2, node_cpu_quota="-1=0.5"), "NODE=VALUE"),
    (dict(emulate_nodes=2, node_link_bandwidth="1=fast"), "--node-link-bandwidth 'fast'"),
    (dict(emulate_nodes=2, node_cpu_quota="1=0"), "--node-cpu-quota"),
    (dict(emulate_nodes=2, node_cpu_quota="1=inf"), "--node-cpu-quota"),
    (dict(emulate_nodes=2, node_cpu_quota="1=half"), "--node-cpu-quota"),
    (dict(emulate_nodes=2, node_cpu_quota="1:0.5"), "NODE=VALUE"),
    (dict(emulate_nodes=2, node_cpu_quota=["1=0.5", "1=0.25"]), "twice"),
])
def test_bad_per_node_values_are_one_line_usage_errors(kw, needle):
    with pytest.raises(UsageError, match=needle):
        Layout(**kw)


def test_recorded_in_the_config():
    c = Layout(emulate_nodes=3, link_bandwidth="1gbit", node_link_bandwidth="2=100mbit", node_cpu_quota="1=0.5").config()
    assert c["node_link_bandwidth"] == {"2": "100mbit"} and c["node_cpu_quota"] == {"1": 0.5}
    c = Layout(emulate_nodes=2).config()
    assert c["node_link_bandwidth"] is None and c["node_cpu_quota"] is None


def test_every_layout_command_takes_the_options(cli, db_path):
    for cmd in (["train", "tinycnn"], ["tta", "tinycnn"], ["scale", "tinycnn"], ["micro", "collectives"],
                ["micro", "links"]):
        r = cli(*cmd, "--node-cpu-quota", "1=0.5")
        assert r.code == 2 and "--emulate-nodes" in r.stderr, (cmd, r.stderr)
        r = cli(*cmd, "--emulate-nodes", "2", "--node-link-bandwidth", "5=1gbit")
        assert r.code == 2 and "node 5" in r.stderr, (cmd, r.stderr)


def test_scale_sets_a_node_apart_on_the_rungs_that_have_it():
    from dlscale.distributed.ladder import rung_layouts

    todo = [(1, 1), (2, 1), (3, 1)]
    rungs = rung_layouts(todo, emulate_nodes=3, link_bandwidth="1gbit", link_latency=None, backend=None,
                         timeout_s=60, threads_per_rank=1, node_link_bandwidth=["2=100mbit"], node_cpu_quota="1=0.5")
    assert [r.node_link_bandwidth for r in rungs] == [(), (), ((2, "100mbit"),)]
    assert [r.node_cpu_quota for r in rungs] == [(), ((1, 0.5),), ((1, 0.5),)]
    with pytest.raises(UsageError, match="largest layout has 2"):
        rung_layouts([(1, 1), (2, 1)], emulate_nodes=3, link_bandwidth=None, link_latency=None, backend=None,
                     timeout_s=60, threads_per_rank=1, node_cpu_quota="2=0.5")
