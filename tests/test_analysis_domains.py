"""Families and sample units in analysis: the domain scaling table (seed 000, Figure 3), units never mixed."""

from __future__ import annotations

import json

import pytest

from dlscale.analysis import compare as cmp
from dlscale.analysis import domains
from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import Store

LLM = {"family": "llm", "sample_unit": "tokens", "seq_len": 128}


def _run(model: str, thr: float, world: int = 1, nodes: int = 1, tag: str = "t", host: str = "box-1",
         **config) -> RunRecord:
    """A train record as the short test writes it (old records: no family/sample_unit in config)."""
    return RunRecord(kind="train", workload=model, tag=tag, system={"hostname": host},
                     config={"batch_size": 8, "precision": "fp32", "nodes": nodes, **config},
                     metrics={"throughput": thr, "world_size": world}, units={"throughput": "samples/s"})


def test_scaling_rows_by_hand():
    rows = domains.scaling_rows({8: 360.0, 2: 100.0, 4: 190.0}, reference=40.0)
    assert [r["devices"] for r in rows] == [2, 4, 8]
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 1.9, 3.6])  # X_N / X_2
    assert [r["device_ratio"] for r in rows] == [1.0, 2.0, 4.0]  # N / 2
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 0.95, 0.9])  # 1.9 / 2, 3.6 / 4
    assert [r["score"] for r in rows] == pytest.approx([2.5, 4.75, 9.0])  # X_N / X_ref
    # times: the speed-up and the score invert (T_n0 / T_N, T_ref / T_N)
    t = domains.scaling_rows({2: 60.0, 4: 32.0, 8: 20.0}, reference=300.0, higher_is_better=False)
    assert [r["speedup"] for r in t] == pytest.approx([1.0, 1.875, 3.0])
    assert [r["efficiency"] for r in t] == pytest.approx([1.0, 0.9375, 0.75])
    assert [r["score"] for r in t] == pytest.approx([5.0, 9.375, 15.0])
    assert domains.scaling_rows({}) == [] and domains.scaling_rows({1: 5.0})[0]["score"] is None


def test_verdict_thresholds():
    def v(eff_last: float, speed_last: float) -> str | None:
        return domains.verdict([{"devices": 1, "speedup": 1.0, "efficiency": 1.0},
                                {"devices": 4, "speedup": speed_last, "efficiency": eff_last}])

    assert v(0.95, 3.8) == "linear" and v(0.90, 3.6) == "linear" and v(1.05, 4.2) == "linear"
    assert v(0.89, 3.56) == "sub-linear" and v(1.06, 4.24) == "super-linear" and v(0.27, 1.09) == "flat"
    assert domains.verdict([{"devices": 2, "speedup": 1.0, "efficiency": 1.0}]) is None


# Seed 000 (Figure 2): single servers with 2 (Precision 5820, GV100), 3 (R740), 4 (T640) and 8 (DSS 8440)
# V100s; Figure 3 scores each as (reference training time on one P100) / (its training time). The tech
# note prints Figure 3 only as a chart, without its values, so these scores are illustrative, shaped as its
# text describes: ResNet-50 and Mask R-CNN scale linearly, NMT "almost ... quadratically", NCF not beyond 2.
SEED000_SERVERS = {2: "Precision-5820", 3: "PE-R740", 4: "PE-T640", 8: "DSS-8440"}
SEED000_SCORES = {  # (family, model): score at 2, 3, 4, 8 GPUs; reference P100 time in minutes
    ("classification", "resnet50"): ((5.0, 7.4, 9.8, 19.2), 8000.0, "linear"),
    ("detection", "mask_rcnn"): ((4.0, 5.9, 7.8, 15.0), 5000.0, "linear"),
    ("translation", "gnmt"): ((3.0, 5.0, 7.0, 14.0), 1900.0, "super-linear"),
    ("recommendation", "ncf"): ((6.0, 6.2, 6.1, 6.3), 45.0, "flat"),
}


def _time_rec(model: str, fam: str, system: str, world: int, minutes: float) -> RunRecord:
    unit = {"translation": "tokens", "recommendation": "samples"}.get(fam, "images")
    return RunRecord(kind="train", workload=model, imported=True, system={"name": system, "imported": True},
                     config={"system": system, "family": fam, "sample_unit": unit, "world_size": world},
                     metrics={"time_to_accuracy": minutes * 60, "world_size": world},
                     units={"time_to_accuracy": "s", "world_size": "ranks"})


def test_seed_000_scores_speedups_and_verdicts():
    runs, ref = [], []
    for (fam, model), (scores, t_ref, _) in SEED000_SCORES.items():
        ref.append(_time_rec(model, fam, "P100-reference", 1, t_ref))
        runs += [_time_rec(model, fam, SEED000_SERVERS[n], n, t_ref / s) for n, s in zip((2, 3, 4, 8), scores)]
    assert cmp.higher_is_better(runs, "time_to_accuracy") is False
    table = domains.domain_table(runs, ref, metric="time_to_accuracy", higher_is_better=False, across_systems=True)
    assert [d["family"] for d in table] == ["classification", "detection", "translation", "recommendation"]
    for d in table:
        scores, _, said = SEED000_SCORES[(d["family"], d["model"])]
        assert d["base_devices"] == 2 and d["reference"]["devices"] == 1 and d["unit"] == "s"
        assert [r["systems"] for r in d["rows"]] == [[SEED000_SERVERS[n]] for n in (2, 3, 4, 8)]
        # the score is T_ref / T_N: Figure 3's own figure comes back
        assert [r["score"] for r in d["rows"]] == pytest.approx(scores)
        # speed-up over 2 GPUs = T_2 / T_N = s_N / s_2 (the reference cancels); efficiency / (N / 2)
        assert [r["speedup"] for r in d["rows"]] == pytest.approx([s / scores[0] for s in scores])
        assert [r["efficiency"] for r in d["rows"]] == pytest.approx(
            [s / scores[0] / (n / 2) for s, n in zip(scores, (2, 3, 4, 8))])
        assert d["verdict"] == said, d["model"]
    resnet = table[0]["rows"]
    assert resnet[-1]["speedup"] == pytest.approx(3.84) and resnet[-1]["efficiency"] == pytest.approx(0.96)
    gnmt = table[2]["rows"]
    assert gnmt[-1]["efficiency"] == pytest.approx(14 / 3 / 4)  # 116.7%: super-linear
    assert table[3]["rows"][-1]["speedup"] == pytest.approx(1.05)  # 6.3 / 6.0: flat
    # per system (the default), each of seed 000's servers is its own one-point domain
    assert all(len(d["rows"]) == 1 for d in domains.domain_table(runs, metric="time_to_accuracy",
                                                                  higher_is_better=False))


@pytest.fixture
def mixed_store(db_path):
    """Classification runs (old records: no family) and LLM runs (tokens) on one host, plus references."""
    with Store.open(db_path) as s:
        for rec in [_run("tinycnn", 100.0), _run("tinycnn", 180.0, world=2), _run("tinycnn", 200.0, world=2),
                    _run("tinycnn", 360.0, world=4), _run("tinycnn", 300.0, world=4, nodes=2),
                    _run("llama-tiny", 1000.0, world=2, **LLM), _run("llama-tiny", 1800.0, world=4, **LLM),
                    _run("tinycnn", 50.0, tag="ref", host="ref-box"),
                    _run("llama-tiny", 400.0, tag="ref", host="ref-box", **{**LLM, "seq_len": 256})]:
            s.insert(rec)
    return db_path


def test_domain_table_from_stored_records_by_hand(mixed_store):
    with Store.open(mixed_store) as s:
        runs, ref = s.query(tag=["t"]), s.query(tag=["ref"])
    cnn, llm = domains.domain_table(runs, ref)
    assert (cnn["family"], cnn["unit"], cnn["system"]) == ("classification", "images/s", "box-1")  # no family: its model's
    assert [(r["devices"], r["layout"], r["runs"]) for r in cnn["rows"]] == [(1, "1x1", 1), (2, "1x2", 2), (4, "1x4", 1)]
    assert [r["value"] for r in cnn["rows"]] == pytest.approx([100.0, 190.0, 360.0])  # 2x2 scale-out run left out
    assert [r["speedup"] for r in cnn["rows"]] == pytest.approx([1.0, 1.9, 3.6])
    assert [r["efficiency"] for r in cnn["rows"]] == pytest.approx([1.0, 0.95, 0.9])
    assert [r["score"] for r in cnn["rows"]] == pytest.approx([2.0, 3.8, 7.2])  # over ref-box's 50 images/s
    assert cnn["verdict"] == "linear" and cnn["reference"]["systems"] == ["ref-box"]
    assert (llm["family"], llm["unit"], llm["base_devices"]) == ("llm", "tokens/s", 2)
    assert [r["speedup"] for r in llm["rows"]] == pytest.approx([1.0, 1.8])  # 1800 / 1000
    assert [r["efficiency"] for r in llm["rows"]] == pytest.approx([1.0, 0.9])  # 1.8 / (4 / 2)
    assert llm["reference"] is None and all(r["score"] is None for r in llm["rows"])  # seq 256 is another shape
    assert domains.describe(llm) == "llama-tiny on box-1, batch 8/device, seq 128, fp32"


def test_reference_must_be_unambiguous_and_systems_not_merged_at_one_count():
    runs = [_run("m", 100.0), _run("m", 190.0, world=2)]
    refs = [_run("m", 40.0, host="ref-a"), _run("m", 60.0, host="ref-b")]
    (d,) = domains.domain_table(runs, refs)
    assert d["reference"]["value"] is None and "ambiguous" in d["reference"]["note"]
    (d,) = domains.domain_table(runs, refs[:1] + [_run("m", 10.0, host="ref-b", batch_size=64)])
    assert d["reference"]["value"] == 40.0  # the one with the same batch size and precision is preferred
    two = [*runs, _run("m", 120.0, host="box-2")]
    with pytest.raises(UsageError, match="box-1, box-2"):
        domains.domain_table(two, across_systems=True)
    assert len(domains.domain_table(two)) == 2  # per system: two domains


def test_units_are_never_mixed_in_compare(mixed_store, cli):
    with Store.open(mixed_store) as s:
        cnn, llm = s.query(workload=["tinycnn"], tag=["t"]), s.query(workload=["llama-tiny"], tag=["t"])
    with pytest.raises(UsageError, match="A is in images/s and B in tokens/s"):
        cmp.pct_table(cnn, llm, ["world_size"])
    rows = cmp.pct_table([*cnn, *llm], [*cnn, *llm], ["world_size"])  # both sides mixed: separate groups
    assert {(r["world_size"], r["unit"]) for r in rows} == {(1, "images/s"), (2, "images/s"), (4, "images/s"),
                                                             (2, "tokens/s"), (4, "tokens/s")}
    two = next(r for r in rows if r["world_size"] == 2 and r["unit"] == "tokens/s")
    assert two["a"] == 1000.0 and two["n_a"] == 1  # never averaged with the 190 images/s
    assert cmp.pct_table(cnn, llm, ["world_size"], metric="cv") == []  # unitless metric: not refused
    r = cli("compare", "model:tinycnn", "model:llama-tiny", "--by", "world_size")
    assert r.code == 2 and "images/s" in r.stderr and "tokens/s" in r.stderr
    r = cli("compare", "tag:t", "tag:t", "--by", "family,world_size", "--format", "json")
    assert r.code == 0, r.stderr
    assert {(x["family"], x["unit"]) for x in json.loads(r.stdout)["rows"]} == {("classification", "images/s"),
                                                                                 ("llm", "tokens/s")}


def test_cli_compare_domains(mixed_store, cli):
    r = cli("compare", "tag:t", "--domains", "--reference", "tag:ref", "--format", "json")
    assert r.code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["speedup"] == "X_N / X_n0" and doc["score"] == "X_N / X_ref"
    cnn, llm = doc["selections"][0]["domains"]
    assert [x["score"] for x in cnn["rows"]] == pytest.approx([2.0, 3.8, 7.2]) and llm["unit"] == "tokens/s"
    human = cli("compare", "tag:t", "--domains", "--reference", "tag:ref")
    assert human.code == 0 and "3.60x" in human.stdout and "90.0%" in human.stdout and "tokens/s" in human.stdout
    assert cli("compare", "tag:t").code == 2  # no B and no --domains
    assert cli("compare", "tag:t", "tag:t", "--across-systems").code == 2


def test_old_records_without_family_group_as_their_model(db_path):
    old = _run("resnet50", 283.0)
    assert "family" not in old.config and domains.family(old) == "classification"
    assert domains.sample_unit(old) == "images" and cmp.key_value(old, "unit") == "images/s"
    new = _run("llama-tiny", 10.0, **LLM)
    assert list(domains.by_unit([new, old])) == ["images", "tokens"]
    assert list(domains.by_family([new, old])) == ["classification", "llm"]
