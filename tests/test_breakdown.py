"""Phase shares, rates, cores needed and the verdict; input-bound and synthetic runs end to end."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from dlscale.analysis import breakdown as bd


def test_phase_shares_subtract_exposed_comm_from_backward():
    s = bd.phase_shares({"data_wait": 1.0, "h2d": 1.0, "forward": 2.0, "backward": 5.0, "optimizer": 1.0, "comm": 2.0})
    # backward compute = 5 - 2 = 3; total 1+1+2+3+1+2 = 10
    assert s == pytest.approx({"data_wait": 0.1, "h2d": 0.1, "forward": 0.2, "backward": 0.3, "optimizer": 0.1, "comm": 0.2})
    assert sum(s.values()) == pytest.approx(1.0)


def test_compute_rate_and_cores_needed():
    # 64 images over h2d 0.01 + fwd 0.1 + bwd 0.2 + opt 0.01 = 0.32 s -> 200 images/s; data-wait excluded
    assert bd.compute_rate(64, {"data_wait": 5.0, "h2d": 0.01, "forward": 0.1, "backward": 0.2, "optimizer": 0.01}) == pytest.approx(200.0)
    assert bd.cores_needed(1000.0, 250.0) == pytest.approx(4.0)
    assert bd.cores_needed(None, 250.0) is None
    assert bd.window_wait_share([0.1, 0.2, 0.1], 4.0) == pytest.approx(0.1)


@pytest.mark.parametrize("kw, want", [
    ({"data_wait_share": 0.06}, bd.INPUT_BOUND),
    ({"data_wait_share": 0.04}, bd.COMPUTE_BOUND),
    ({"data_wait_share": 0.01, "loader_rate": 90.0, "compute_rate": 100.0}, bd.INPUT_BOUND),
    ({"data_wait_share": 0.01, "loader_rate": 110.0, "compute_rate": 100.0}, bd.COMPUTE_BOUND),
    ({"data_wait_share": 0.0, "comm_share": 0.384}, bd.COMM_BOUND),  # seed: all-reduce at 38.4% of GPU time
    ({"data_wait_share": 0.0, "comm_share": 0.15}, bd.COMPUTE_BOUND),
    ({"data_wait_share": 0.10, "comm_share": 0.5}, bd.INPUT_BOUND),  # input is checked first
])
def test_verdict_thresholds(kw, want):
    v = bd.verdict(**kw)
    assert v["verdict"] == want and v["reason"]
    assert v["numbers"]["data_wait_share"] == kw["data_wait_share"]


def test_exposed_comm_is_backward_with_sync_minus_without():
    """A fake DDP model whose gradient sync costs 70 ms on top of a 10 ms backward."""
    from contextlib import contextmanager

    from dlscale.train.phases import time_phases

    state = {"sync": True}

    @contextmanager
    def no_sync():
        state["sync"] = False
        yield
        state["sync"] = True

    setup = SimpleNamespace(
        model=SimpleNamespace(no_sync=no_sync), optimizer=SimpleNamespace(zero_grad=lambda set_to_none: None),
        fetch=lambda: (1, 2), to_device=lambda x, y: (x, y), forward_loss=lambda x, y: 0.0,
        backward=lambda loss: time.sleep(0.08 if state["sync"] else 0.01), optimizer_step=lambda: None,
    )
    out = time_phases(setup, 2, SimpleNamespace(type="cpu"))
    assert len(out["comm"]) == 2
    assert all(0 < c < b for c, b in zip(out["comm"], out["backward"]))  # exposed comm is part of backward


def test_top_ops_and_comm_share():
    from dlscale.train.phases import comm_share, top_ops

    ev = [SimpleNamespace(key="aten::convolution", count=10, self_cpu_time_total=600.0),
          SimpleNamespace(key="c10d::allreduce_", count=2, self_cpu_time_total=300.0),
          SimpleNamespace(key="aten::add_", count=5, self_cpu_time_total=100.0)]
    rows = top_ops(ev, on_device=False)
    assert [r["op"] for r in rows] == ["aten::convolution", "c10d::allreduce_", "aten::add_"]
    assert rows[0]["share"] == pytest.approx(0.6) and rows[1]["self_s"] == pytest.approx(300e-6)
    assert comm_share(rows) == pytest.approx(0.3)


@pytest.fixture(scope="module")
def big_jpegs(tmp_path_factory):
    """Large JPEGs for a tiny model: decoding them in the training process is slow on purpose."""
    from dlscale.data.synth import DatasetSpec, make_dataset

    root = tmp_path_factory.mktemp("slow") / "imgs"
    make_dataset(root, DatasetSpec(images=16, classes=2, size=1024))  # ~10x the decode cost of 320 px: a wide margin under load
    return root


@pytest.mark.slow
def test_slow_loader_fast_model_is_input_bound_and_synthetic_is_not(cli, db_path, big_jpegs):
    common = ("--batch-size", "8", "--image-size", "16", "--warmup-steps", "1", "--steps", "4",
              "--breakdown-steps", "2", "--monitor-interval", "0", "--format", "json")
    r = cli("train", "tinycnn", "--data", str(big_jpegs), "--workers", "0", *common)
    assert r.code == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    assert m["verdict"] == bd.INPUT_BOUND, m["verdict_reason"]
    assert m["data_wait_share"] > bd.INPUT_WAIT_SHARE and m["phase_data_wait_share"] > 0.05

    r = cli("train", "tinycnn", *common)
    assert r.code == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    assert m["verdict"] != bd.INPUT_BOUND and m["data_wait_share"] == 0.0
    assert "loader_rate" not in m


@pytest.mark.slow
def test_profile_writes_a_chrome_trace_and_top_ops(cli, db_path, tmp_path):
    r = cli("train", "tinycnn", "--image-size", "16", "--batch-size", "4", "--warmup-steps", "1", "--steps", "2",
            "--breakdown-steps", "0", "--monitor-interval", "0", "--profile", str(tmp_path / "prof"),
            "--profile-steps", "2", "--format", "json")
    assert r.code == 0, r.stderr
    rec = json.loads(r.stdout)
    trace = json.loads(open(rec["metrics"]["profile_trace"]).read())
    assert trace["traceEvents"]
    ops = rec["raw"]["profile_top_ops"]
    assert ops and any("conv" in o["op"] for o in ops) and rec["metrics"]["profile_comm_share"] == 0.0
    assert "breakdown_steps" not in rec["metrics"] and rec["metrics"]["verdict"] == bd.COMPUTE_BOUND
