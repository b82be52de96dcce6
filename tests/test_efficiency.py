"""Per-joule and per-dollar columns in compare, seed 000's domain table and the report; the ranking."""

from __future__ import annotations

import json
import re

import pytest

from dlscale.analysis import compare as cmp
from dlscale.analysis import domains
from dlscale.analysis.efficiency import ranking
from dlscale.record import RunRecord
from dlscale.store import Store

IMAGES = {"family": "classification", "sample_unit": "images", "image_size": 32, "batch_size": 8, "precision": "fp32"}


def _run(system: str, thr: float, world: int = 1, per_j: float | None = None, per_dollar: float | None = None,
         tag: str = "t", model: str = "tinycnn", price: float | None = None) -> RunRecord:
    m = {"throughput": thr, "world_size": world}
    if per_j is not None:
        m.update(energy_j=1.0, units_per_joule=per_j, energy_per_unit_j=1 / per_j)
    if price is not None:  # one device at PRICE $/h: throughput x 3600 / price per dollar
        per_dollar = thr * 3600 / price
        m.update(price_per_hour=price)
    if per_dollar is not None:
        m.update(units_per_dollar=per_dollar, cost_per_million_units=1e6 / per_dollar)
    return RunRecord(kind="train", workload=model, tag=tag, system={"hostname": system}, config=dict(IMAGES),
                     metrics=m, units={"throughput": "images/s", "units_per_joule": "images/J",
                                       "units_per_dollar": "images/$"},
                     raw={"cost": {"price_per_hour": price, "source": "--price-per-hour", "devices": 1}} if price else {})


def test_ranking_per_kwh_and_per_dollar_by_hand():
    recs = [_run("a", 100, per_j=2.0, per_dollar=50_000), _run("a", 100, per_j=4.0, per_dollar=70_000),
            _run("b", 300, per_j=1.0, per_dollar=90_000), _run("c", 50), _run("d", 10, per_j=5.0)]
    rows = {r["system"]: r for r in ranking(recs)}
    assert set(rows) == {"a", "b", "d"}  # c has neither figure
    assert rows["a"]["units_per_kwh"] == pytest.approx(3.0 * 3.6e6)  # mean 3 images/J = 10.8 M images/kWh
    assert rows["a"]["units_per_dollar"] == pytest.approx(60_000)
    assert [rows[s]["rank_per_kwh"] for s in "abd"] == [2, 3, 1]
    assert [rows[s]["rank_per_dollar"] for s in "abd"] == [2, 1, None]
    assert [r["system"] for r in ranking(recs)] == ["b", "a", "d"]  # most per dollar first, then unranked


def test_ranking_never_mixes_models():
    rows = ranking([_run("a", 1, per_j=1.0), _run("b", 1, per_j=2.0, model="resnet18")])
    assert [(r["model"], r["rank_per_kwh"]) for r in rows] == [("resnet18", 1), ("tinycnn", 1)]


def test_pct_table_carries_each_sides_per_joule_and_per_dollar():
    rows = cmp.pct_table([_run("a", 200, per_j=2.0, per_dollar=10.0)], [_run("b", 100, per_j=1.0)])
    (r,) = rows
    assert (r["units_per_joule_a"], r["units_per_joule_b"]) == (2.0, 1.0)
    assert (r["units_per_dollar_a"], r["units_per_dollar_b"]) == (10.0, None)
    plain = cmp.pct_table([_run("a", 200)], [_run("b", 100)])
    assert not any(k.startswith("units_per") for k in plain[0])  # no columns where no record has them


def test_domain_table_rows_have_per_joule_and_per_dollar():
    (d,) = domains.domain_table([_run("a", 100, per_j=2.0, per_dollar=10.0), _run("a", 180, world=2, per_j=1.5)])
    assert [(r["devices"], r["units_per_joule"], r["units_per_dollar"]) for r in d["rows"]] == [(1, 2.0, 10.0),
                                                                                              (2, 1.5, None)]


def _store(db_path, recs):
    with Store.open(db_path) as s:
        for r in recs:
            s.insert(r)


def test_compare_shows_the_columns_and_the_ranking(cli, db_path):
    _store(db_path, [_run("box-a", 200, per_j=2.0, per_dollar=40_000, tag="a"),
                     _run("box-b", 100, per_j=3.0, per_dollar=20_000, tag="b")])
    res = cli("compare", "tag:a", "tag:b")
    assert res.code == 0, res.stderr
    assert "A per J" in res.stdout and "B per $" in res.stdout and "ranking: sample units per kWh" in res.stdout
    doc = json.loads(cli("compare", "tag:a", "tag:b", "--format", "json").stdout)
    assert doc["rows"][0]["units_per_joule_a"] == 2.0
    assert {r["system"]: r["rank_per_kwh"] for r in doc["ranking"]} == {"box-a": 2, "box-b": 1}
    assert {r["system"]: r["rank_per_dollar"] for r in doc["ranking"]} == {"box-a": 1, "box-b": 2}
    dom = cli("compare", "tag:a", "--domains")
    assert "images per J" in dom.stdout and "images per $" in dom.stdout


def test_compare_without_figures_has_no_extra_columns(cli, db_path):
    _store(db_path, [_run("box-a", 200, tag="a"), _run("box-b", 100, tag="b")])
    res = cli("compare", "tag:a", "tag:b")
    assert res.code == 0 and "per J" not in res.stdout and "ranking" not in res.stdout


def test_report_has_the_energy_and_cost_section_and_domain_columns(cli, db_path, tmp_path):
    _store(db_path, [_run("box-a", 100, per_j=2.0, per_dollar=40_000), _run("box-a", 190, world=2, per_j=1.9),
                     _run("box-b", 90, per_j=2.5, per_dollar=30_000)])
    r = cli("report", "--out", str(tmp_path / "rep"), "--tag", "t", "--format", "html")
    assert r.code == 0, r.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    sections = {m.group(1): m.group(2) for m in re.finditer(r"<h2>([^<]*)</h2>(.*?)</section>", page, re.S)}
    eff = sections["Energy and cost per result"]
    assert "<th>images per kWh</th>" in eff and "<th>rank ($)</th>" in eff and "9,000,000" in eff  # 2.5 x 3.6e6
    dom = sections["Domain scaling by device count (seed 000, Figure 3)"]
    assert "<th>images per J</th>" in dom and "<th>images per $</th>" in dom


def test_one_machine_at_two_prices_is_two_ranked_rows_and_every_per_dollar_shows_its_price(cli, db_path):
    """The same host priced as rented (2.50 $/h) and as owned (1.00 $/h): 100 images/s is 144,000 images/$
    at 2.50 and 360,000 at 1.00 -- two rows, never a mean of both under one name."""
    rented = [_run("box", 100, price=2.5, tag="rented"), _run("box", 100, price=2.5, tag="rented")]
    owned = [_run("box", 100, price=1.0, tag="owned")]
    rows = ranking([*rented, *owned])
    assert [(r["system"], r["price_per_hour"], r["units_per_dollar"], r["rank_per_dollar"], r["runs"]) for r in rows] \
        == [("box", 1.0, pytest.approx(360_000), 1, 1), ("box", 2.5, pytest.approx(144_000), 2, 2)]
    (r,) = cmp.pct_table(rented, owned)
    assert (r["prices_a"], r["prices_b"]) == ([2.5], [1.0])
    assert cmp.pct_table([*rented, *owned], owned)[0]["prices_a"] == [1.0, 2.5]  # a mean over two prices says so
    _store(db_path, [*rented, *owned])
    res = cli("compare", "tag:rented", "tag:owned")
    text = " ".join(res.stdout.replace("│", " ").replace("┃", " ").split())
    assert res.code == 0 and "A at $/device-h B at $/device-h" in text
    assert "144,000.0 360,000.0 2.50 1.00" in text  # A per $, B per $, then the price of each
    assert "box 100.0 - - 360,000.0 1.00 1 1" in text and "box 100.0 - - 144,000.0 2.50 2 2" in text
    (d,) = domains.domain_table(rented)
    assert d["rows"][0]["prices"] == [2.5]
    assert "at $/device-h" in cli("compare", "tag:rented", "--domains").stdout
