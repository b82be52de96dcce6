"""The seed papers' published scaling figures (predict/seeds.py), predicted as a user runs it.

The one-GPU figure is brought in with `dlscale import` (seed 001's reference dataset; for seed 002,
which publishes none, one V100-SXM2 figure), then `dlscale predict resnet50 --from ID --layouts ...
--intra ... --inter ...`; each published case is judged within its tolerance (docs/PERFORMANCE.md).
Seed 001's 2x4 predicted from its one-GPU figure alone (without the published 1x4 to fit the overlap
cost from) and two of seed 002's cases are outside it, each for a reason the papers show and docs/
PERFORMANCE.md gives: they are strict xfails, so a model change that meets them shows as a failure to
look at rather than passing unseen.
"""

from __future__ import annotations

import json

import pytest

from dlscale.predict.seeds import SEED001, SEED001_ONE_GPU, SEED002, judge


def _throughputs(docs: list[dict]) -> dict[str, float]:
    x = {f"{d['config']['nodes']}x{d['config']['devices_per_node']}": d["metrics"]["throughput"] for d in docs}
    x["1x1"] = docs[0]["metrics"]["throughput"] / docs[0]["metrics"]["speedup"]
    return x


def _layouts(seed) -> str:
    return ",".join(f"{n}x{g}" for n, g in seed.layouts)


def test_seed001_through_the_cli_within_five_points(cli, db_path):
    r = cli("import", "--ref", "seed001-scaling", "--format", "json")
    assert r.code == 0, r.stderr
    (one,) = [d for d in json.loads(r.stdout) if d["config"]["system"] == SEED001.system
              and d["config"]["world_size"] == 1]
    r = cli("predict", "resnet50", "--from", one["run_id"], "--layouts", _layouts(SEED001), "--intra", SEED001.intra,
            "--inter", SEED001.inter, "--format", "json")
    assert r.code == 0, r.stderr
    docs = json.loads(r.stdout)
    rows = judge(SEED001, _throughputs(docs))
    assert all(row["within"] for row in rows), rows
    # the 1x4 is the published run the overlap cost was fitted from; 2x4 is predicted from it
    one_by_four = next(row for row in rows if row["case"].endswith("1x4 efficiency"))
    assert one_by_four["error"] == pytest.approx(0.0, abs=0.01)
    cfg = docs[0]["config"]
    assert cfg["from_imported"] and cfg["compute"]["split"].startswith("assumed: forward : backward = 1 : 1.97")
    assert cfg["overlap_fitted_from"] not in (None, one["run_id"])
    notes = docs[1]["raw"]["notes"]
    assert any("is a published figure (C4130-P100-16GB-PCIe: 283 images/s at batch 128" in n for n in notes)
    assert any("fitted, not predicted" in n for n in notes)
    r = cli("predict", "resnet50", "--from", one["run_id"], "--layouts", "2x4", "--intra", SEED001.intra,
            "--inter", SEED001.inter)
    assert r.code == 0 and "published figure" in r.stderr and "2x4" in r.stdout  # the split is said on stderr


def _from_one_gpu(seed, tmp) -> dict[str, dict]:
    """The seed's layouts predicted with the API from its one imported one-GPU figure, in a fresh store."""
    from dlscale import api
    from dlscale.importers import records as imp
    from dlscale.store import Store

    csv = tmp / "one-gpu.csv"
    csv.write_text(seed.csv)
    db = str(tmp / "results.db")
    with Store.open(db) as store:
        (one,) = store.insert_imports([imp.to_record(r, str(csv), "imported", i)
                                       for i, r in enumerate(imp.parse_file(csv))])
    recs = api.predict(one.run_id, list(seed.layouts), model="resnet50", intra=seed.intra, inter=seed.inter, db=db)
    return {row["case"]: row for row in judge(seed, _throughputs([r.to_dict() for r in recs]))}


@pytest.fixture(scope="module")
def seed002(tmp_path_factory):
    """Seed 002's layouts predicted from one imported V100-SXM2 figure (seed 002 publishes none)."""
    return _from_one_gpu(SEED002, tmp_path_factory.mktemp("seed002"))


@pytest.fixture(scope="module")
def seed001_one_gpu(tmp_path_factory):
    """Seed 001's layouts predicted from its one-P100 figure alone (no published 1x4 in the store)."""
    return _from_one_gpu(SEED001_ONE_GPU, tmp_path_factory.mktemp("seed001"))


ONE_GPU_2X4 = ("from one P100's figure the model has no measure of this stack's multi-node cost: the published 2x4 "
               "step is 27.6 ms longer than the 1x4's, nearly twice the 14.3 ms a ring needs to move all of "
               "ResNet-50's gradients over EDR at its datasheet rate with nothing hidden, and the paper's own runs "
               "change between 1x4 and 2x4 what a one-GPU figure cannot carry: TensorFlow's replicated NCCL "
               "all-reduce on one node, Horovod across nodes (its section 7.4.1 commands), and its Tables 5 and 6 "
               "put the same 2x4 V100s on the same EDR at 4500 and 5904 images/s with another host CPU, host link "
               "and NCCL (docs/PERFORMANCE.md)")


@pytest.mark.parametrize("case", [
    "C4130 1x4 efficiency",
    pytest.param("C4130 2x4 efficiency", marks=pytest.mark.xfail(strict=True, reason=ONE_GPU_2X4)),
])
def test_seed001_from_the_one_gpu_figure_alone(seed001_one_gpu, case):
    row = seed001_one_gpu[case]
    assert row["within"], row


def test_seed001_one_gpu_predictions_are_the_documented_ones(seed001_one_gpu):
    """The figures docs/PERFORMANCE.md quotes (default overlap cost 0.5, datasheet PCIe Gen3 and EDR)."""
    assert seed001_one_gpu["C4130 1x4 efficiency"]["predicted"] == pytest.approx(0.9882, abs=0.0005)
    assert seed001_one_gpu["C4130 2x4 efficiency"]["predicted"] == pytest.approx(0.9825, abs=0.0005)


EIGHT_TO_SIXTEEN = ("the published 1.70x makes a 2x8 step 36 ms longer than the predicted 1x8's; a flat ring moves 2 x 15/16 of ResNet-50's "
                    "102 MB per step, 15.3 ms at EDR's datasheet rate with nothing hidden, so the figure needs the hop "
                    "out of a node at about 42% of EDR; the article names no NCCL version, GPUDirect RDMA or NIC count, "
                    "and NCCL of that time staged network sends through host memory on all but NVSwitch Volta systems "
                    "(docs/PERFORMANCE.md)")
TWO_BY_EIGHT = ("in a flat ring (and within 1.1% hierarchically) 2x8 and 4x4 move the same bytes per hop; what differs "
                "is per host: 8 against 4 V100s decoding the real data the article trained on on one host's CPUs "
                "(seed 001's Tables 5 and 6: the same GPUs and EDR 31% apart with another host CPU), and no loader "
                "rate is published (docs/PERFORMANCE.md)")


@pytest.mark.parametrize("case", [
    pytest.param("8 -> 16 GPUs (2x8 over 1x8)", marks=pytest.mark.xfail(strict=True, reason=EIGHT_TO_SIXTEEN)),
    pytest.param("2x8 against 4x4", marks=pytest.mark.xfail(strict=True, reason=TWO_BY_EIGHT)),
    "1x4 against 2x2",
])
def test_seed002_cases(seed002, case):
    row = seed002[case]
    assert row["within"], row


def test_seed002_predictions_are_the_documented_ones(seed002):
    """The figures docs/PERFORMANCE.md quotes, so that a change to the model shows there."""
    assert seed002["8 -> 16 GPUs (2x8 over 1x8)"]["predicted"] == pytest.approx(1.925, abs=0.005)
    assert seed002["2x8 against 4x4"]["predicted"] == pytest.approx(0.0, abs=0.002)
    assert seed002["1x4 against 2x2"]["predicted"] == pytest.approx(0.0286, abs=0.002)


def test_judge_by_hand():
    x = {"1x1": 100.0, "1x4": 380.0, "2x4": 700.0}
    rows = judge(SEED001, x)
    assert [r["predicted"] for r in rows] == pytest.approx([0.95, 0.875])
    assert rows[0]["error"] == pytest.approx((0.95 - 1099 / 1132) * 100) and rows[0]["within"]
    assert rows[1]["error"] == pytest.approx((0.875 - 2075 / 2264) * 100) and rows[1]["within"]
    far = judge(SEED002, {"1x4": 400.0, "2x2": 300.0, "1x8": 800.0, "2x8": 1000.0, "4x4": 1000.0})
    assert [r["within"] for r in far] == [False, False, False]
    assert far[0]["error"] == pytest.approx(1.25 - 1.70) and far[2]["predicted"] == pytest.approx(1 / 3)
