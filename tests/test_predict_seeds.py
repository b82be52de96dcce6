"""The seed papers' published scaling figures (predict/seeds.py), predicted as a user runs it.

The one-GPU figure is brought in with `dlscale import` (seed 001's reference dataset; for seed 002,
which publishes none, one V100-SXM2 figure), then `dlscale predict resnet50 --from ID --layouts ...
--intra ... --inter ...`; each published case is judged within its tolerance (docs/PERFORMANCE.md).
Two of seed 002's cases are outside it: they are strict xfails, so a model change that meets them
shows as a failure to look at rather than passing unseen.
"""

from __future__ import annotations

import json

import pytest

from dlscale.predict.seeds import SEED001, SEED002, V100_ONE_GPU_CSV, judge


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


@pytest.fixture(scope="module")
def seed002(tmp_path_factory):
    """Seed 002's layouts predicted with the API from one imported V100-SXM2 figure, in a fresh store."""
    from dlscale import api
    from dlscale.importers import records as imp
    from dlscale.store import Store

    tmp = tmp_path_factory.mktemp("seed002")
    csv = tmp / "v100.csv"
    csv.write_text(V100_ONE_GPU_CSV)
    db = str(tmp / "results.db")
    with Store.open(db) as store:
        (one,) = store.insert_imports([imp.to_record(r, str(csv), "imported", i)
                                       for i, r in enumerate(imp.parse_file(csv))])
    recs = api.predict(one.run_id, list(SEED002.layouts), model="resnet50", intra=SEED002.intra,
                       inter=SEED002.inter, db=db)
    return {row["case"]: row for row in judge(SEED002, _throughputs([r.to_dict() for r in recs]))}


OUTSIDE = ("the model puts a flat ring's hop out of each node at one EDR NIC for 2x8 and 4x4 alike, and at "
           "EDR's datasheet rate with a default overlap cost of 0.5 the inter-node stage costs too little: the "
           "published figure needs what the model does not know (docs/PERFORMANCE.md)")


@pytest.mark.parametrize("case", [
    pytest.param("8 -> 16 GPUs (2x8 over 1x8)", marks=pytest.mark.xfail(strict=True, reason=OUTSIDE)),
    pytest.param("2x8 against 4x4", marks=pytest.mark.xfail(strict=True, reason=OUTSIDE)),
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
