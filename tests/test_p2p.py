"""p2p on a CPU machine: a fake torch.cuda with N devices and a chosen peer-access pattern drives
the peer-access matrix, each pair's path label, the summary and the printout (no copy is made)."""

from __future__ import annotations

import io

import pytest

from dlscale.micro import p2p
from dlscale.micro.base import MicroOptions
from dlscale.record import RunRecord


def fake_cuda(monkeypatch, n: int, peer) -> list[tuple[int, int]]:
    """torch.cuda with ``n`` devices where ``peer(i, j)`` says whether i can access j; returns the
    (i, j) pairs can_device_access_peer was asked about."""
    import torch

    asked: list[tuple[int, int]] = []

    def can_access(i: int, j: int) -> bool:
        asked.append((i, j))
        return bool(peer(i, j))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", can_access)
    return asked


def pair01(i: int, j: int) -> bool:
    return {i, j} == {0, 1}  # GPUs 0 and 1 are peers (say NVLink); GPU 2 is on another root complex


def test_peer_access_is_asked_for_every_ordered_pair(monkeypatch):
    asked = fake_cuda(monkeypatch, 3, pair01)
    assert p2p.peer_access(3) == [[True, True, False], [True, True, False], [False, False, True]]
    assert sorted(asked) == [(i, j) for i in range(3) for j in range(3) if i != j]  # diagonal: 1, not asked


def test_plan_labels_each_pair_with_its_path(monkeypatch):
    import torch

    fake_cuda(monkeypatch, 3, pair01)
    plan = p2p.plan(MicroOptions(), torch.device("cpu"))
    assert len(plan.cases) == 2 * 3 * 9  # mode x test x ordered pairs
    path = {(c.labels["peer_access"], c.labels["test"], c.labels["src"], c.labels["dst"]): c.labels["path"]
            for c in plan.cases}
    assert path["enabled", "unidirectional", 0, 1] == "p2p"
    assert path["enabled", "bidirectional", 1, 0] == "p2p"
    assert path["enabled", "unidirectional", 0, 2] == "host-staged"  # no peer access: not called P2P
    assert path["enabled", "latency", 2, 1] == "host-staged"
    assert path["disabled", "unidirectional", 0, 1] == "host-staged"
    assert path["enabled", "latency", 2, 2] == path["disabled", "unidirectional", 1, 1] == "local"
    assert len(plan.notes) == 1 and "4 of 6 ordered GPU pairs" in plan.notes[0] and "0->2" in plan.notes[0]
    assert "host-staged" in plan.notes[0]


def test_one_way_peer_access_is_not_p2p_both_ways(monkeypatch):
    import torch

    fake_cuda(monkeypatch, 2, lambda i, j: (i, j) == (0, 1))
    labels = [c.labels for c in p2p.plan(MicroOptions(), torch.device("cpu")).cases]
    path = {(x["peer_access"], x["test"], x["src"], x["dst"]): x["path"] for x in labels}
    assert path["enabled", "unidirectional", 0, 1] == "p2p"
    assert path["enabled", "unidirectional", 1, 0] == "host-staged"
    assert path["enabled", "bidirectional", 0, 1] == "host-staged"  # the 1 -> 0 half has no peer access


def test_builds_enable_peer_access_only_where_the_pair_has_it(monkeypatch):
    import torch

    fake_cuda(monkeypatch, 3, pair01)
    built = []
    monkeypatch.setattr(p2p, "build_copy", lambda *a: built.append(a))
    for case in p2p.plan(MicroOptions(mem_mib=1), torch.device("cpu")).cases:
        case.build()
    calls = {(direct, src, dst, both, nbytes): enable for src, dst, nbytes, direct, both, enable in built}
    assert calls[True, 0, 1, False, 2**20] is True  # P2P=Enabled, peers: direct copy, peer access on
    assert calls[True, 0, 2, False, 2**20] is False  # P2P=Enabled, no peer access: direct, driver-staged
    assert calls[False, 0, 1, False, 2**20] is False  # P2P=Disabled: staged by dlscale, never enabled
    assert calls[True, 1, 0, True, 2**20] is True and calls[True, 2, 0, False, 4] is False


def _rows(monkeypatch, n, peer):
    """Rows as the harness writes them: the plan's labels plus made-up figures (p2p 50, staged 10)."""
    import torch

    fake_cuda(monkeypatch, n, peer)
    rows = []
    for c in p2p.plan(MicroOptions(), torch.device("cpu")).cases:
        gbps = {"p2p": 50.0, "host-staged": 10.0, "local": 500.0}[c.labels["path"]]
        rows.append({**c.labels, "gbps": gbps, "time_us": 1000 / gbps})
    return rows


def test_summary_reports_the_peer_matrix_and_p2p_only_means(monkeypatch):
    metrics, units = p2p.summarize(_rows(monkeypatch, 3, pair01))
    assert metrics["peer_access"] == [[True, True, False], [True, True, False], [False, False, True]]
    assert metrics["p2p_pairs"] == 2 and units["peer_access"] == "bool"
    # the P2P=Enabled means cover the two P2P pairs alone (the four driver-staged ones read 10)
    assert metrics["uni_gbps_offdiag_mean_peer_enabled"] == 50.0
    assert metrics["latency_us_offdiag_mean_peer_enabled"] == 20.0
    assert metrics["uni_gbps_offdiag_mean_peer_disabled"] == 10.0


def test_no_peer_access_anywhere_has_no_p2p_figure(monkeypatch):
    metrics, _ = p2p.summarize(_rows(monkeypatch, 2, lambda i, j: False))
    assert metrics["peer_access"] == [[True, False], [False, True]] and metrics["p2p_pairs"] == 0
    assert metrics["uni_gbps_offdiag_mean_peer_enabled"] is None  # not a host-staged figure called P2P
    assert metrics["bi_gbps_offdiag_mean_peer_disabled"] == 10.0


def test_printout_has_the_connectivity_matrix_and_marks_host_staged_pairs(monkeypatch):
    from rich.console import Console

    from dlscale.micro.report import p2p_connectivity_table, print_record

    rows = _rows(monkeypatch, 3, pair01)
    metrics, _ = p2p.summarize(rows)
    rec = RunRecord(kind="micro", workload="p2p", config={"device": "cuda"}, metrics=metrics, raw={"rows": rows})
    buf = io.StringIO()
    print_record(rec, Console(file=buf, width=200, color_system=None))
    text = " ".join(buf.getvalue().split())  # Rich wraps titles to the table's width
    assert "P2P Connectivity Matrix" in text
    conn = p2p_connectivity_table(rec)
    assert [list(col.cells) for col in conn.columns] == [["0", "1", "2"], ["1", "1", "0"], ["1", "1", "0"],
                                                         ["0", "0", "1"]]
    enabled = text[text.index("Unidirectional P2P=Enabled"):text.index("Bidirectional P2P=Disabled")]
    assert "50.00 " in enabled and "10.00*" in enabled and "* host-staged: no peer access" in enabled
    disabled = text[text.index("Unidirectional P2P=Disabled"):text.index("Unidirectional P2P=Enabled")]
    assert "*" not in disabled  # the disabled mode is host-staged by definition: nothing to flag


@pytest.mark.parametrize("n, why", [(0, "this machine has 0"), (1, "this machine has 1"), (2, None)])
def test_unavailable_below_two_gpus(monkeypatch, n, why):
    fake_cuda(monkeypatch, n, lambda i, j: True)
    got = p2p.unavailable()
    assert (got is None) if why is None else (why in got)
