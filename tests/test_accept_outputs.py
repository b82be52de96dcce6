"""What an acceptance hands over (JSON, JUnit XML, HTML report, records, manifest) and what reads it back
(`dlscale accept verify`, `dlscale accept judge`, `dlscale results history`), on hand-built records in a
fresh store: nothing is measured here."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

import accept_records as ar
from accept_records import recorded
from dlscale.accept.outputs import artifacts as outputs
from dlscale.accept import acceptance as run
from dlscale.accept.plan import spec
from dlscale.store import Store


@pytest.fixture
def acc(db_path, tmp_path):
    a = recorded(db_path, [ar.health(thermal=3), ar.alone(slow_gpu=3), ar.train()])
    a.out_dir = tmp_path / "out"
    a.files = outputs.write(a, str(db_path))
    return a


def test_the_folder_holds_every_record_the_report_junit_and_a_manifest(acc):
    d = acc.out_dir
    assert sorted(p.name for p in d.iterdir()) == ["junit.xml", "manifest.json", "records", "report.html",
                                                  "verdicts.json"]
    assert {p.stem for p in (d / "records").iterdir()} == {r.run_id for r in acc.records} | {acc.record.run_id}
    manifest = json.loads((d / "manifest.json").read_text())
    assert set(manifest["records"]) == {r.run_id for r in acc.records} | {acc.record.run_id}
    assert manifest["report"]["report.html"] == outputs.sha256(d / "report.html")
    doc = json.loads((d / "verdicts.json").read_text())
    assert doc["outcome"] == "FAIL" and doc["exit_code"] == 1 and doc["counts"]["FAIL"] == 2
    assert doc["not_run"] == [{"check": "p2p", "why": "needs at least 2 GPUs"}]


def test_verify_finds_a_changed_a_missing_and_an_extra_file(acc):
    d = acc.out_dir
    good, problems = outputs.verify(d)
    assert problems == [] and good == len(json.loads((d / "manifest.json").read_text())["files"])
    rec = next((d / "records").iterdir())
    rec.write_text(rec.read_text().replace('"status": "ok"', '"status": "ok" '))
    (d / "junit.xml").unlink()
    (d / "records" / "20990101T000000-00000000.json").write_text("{}")
    _, problems = outputs.verify(d)
    assert sorted(p.split(":")[0] for p in problems) == sorted(["junit.xml", "records/20990101T000000-00000000.json",
                                                                f"records/{rec.name}"])
    assert any("changed" in p for p in problems) and any("missing" in p for p in problems)


def test_junit_xml_has_a_case_per_verdict(acc):
    root = ET.fromstring((acc.out_dir / "junit.xml").read_text())
    suite = root.find("testsuite")
    assert int(suite.get("tests")) == len(acc.verdicts)
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert sorted(c.get("classname") for c in failed) == ["dlscale.accept.health", "dlscale.accept.train_alone"]
    skipped = [c for c in suite.iter("testcase") if c.find("skipped") is not None]
    # no expectation: the throughput on all eight, and its data-parallel efficiency (no published 1x8 figure)
    assert sorted((c.get("classname"), c.get("name").split(" on ")[0]) for c in skipped) == [
        ("dlscale.accept.train", "dp efficiency"), ("dlscale.accept.train", "throughput")]


def test_the_report_puts_the_verdict_table_first_and_links_checks_and_runs(acc):
    html = (acc.out_dir / "report.html").read_text()
    first_check = html.index('id="check-')
    assert html.index('id="verdicts"') < first_check
    assert 'href="#check-train_alone"' in html
    for r in acc.records:
        assert f'href="records/{r.run_id}.json"' in html
    assert "data:image/png;base64" in html[first_check:]  # each check's history plot
    assert "GPU 3 reports hw_thermal_slowdown" in html


def test_cli_verify_exit_codes(acc, cli):
    r = cli("accept", "verify", str(acc.out_dir))
    assert r.code == 0 and "file(s) match the manifest" in r.stdout
    (acc.out_dir / "report.html").write_text("<html>edited</html>")
    r = cli("accept", "verify", str(acc.out_dir), "--format", "json")
    doc = json.loads(r.stdout)
    assert r.code == 1 and doc["ok"] is False and doc["problems"][0].startswith("report.html: changed")
    r = cli("accept", "verify", str(acc.out_dir / "nowhere"))
    assert r.code == 2 and "no manifest.json" in r.stderr


def test_judge_again_with_stricter_thresholds(db_path, tmp_path, cli):
    a = recorded(db_path, [ar.alone(slow_gpu=1, slow=0.07, n=4)])  # 7% below its peers: WARN
    assert a.outcome == "WARN" and a.exit_code == 0
    strict = tmp_path / "strict.yaml"
    strict.write_text("checks: {train_alone: {}}\npeers: {warn: 0.02, fail: 0.05}\n")
    r = cli("accept", "judge", a.id, "--spec", str(strict), "--format", "json")
    doc = json.loads(r.stdout)
    assert r.code == 1 and doc["outcome"] == "FAIL"
    assert [v["subject"] for v in doc["verdicts"] if v["status"] == "FAIL"] == ["GPU 1"]
    r = cli("accept", "judge", a.id)  # the thresholds it was judged with
    assert r.code == 0 and "WARN" in r.stdout


def test_bad_input_exits_2(cli, db_path):
    Store.open(db_path).close()  # an empty database: judging reads it
    assert cli("accept", "verify").code == 2
    assert cli("accept", "frobnicate", "x").code == 2
    r = cli("accept", "judge", "accept-nothing")
    assert r.code == 2 and "no run" in r.stderr


def test_the_next_acceptance_takes_the_last_passed_figures_as_its_baseline(db_path):
    first = recorded(db_path, [ar.train(step=0.100)], when="2026-11-01T10:00:00.000+00:00")
    assert first.verdicts[0].status == "NO EXPECTATION"
    second = recorded(db_path, [ar.train(step=0.101)], when="2026-11-02T10:00:00.000+00:00")
    assert second.verdicts[0].status == "PASS" and first.id in second.verdicts[0].source
    # 40% slower than the two accepted runs (their spread is below the floor, 0.10): FAIL
    third = recorded(db_path, [ar.train(step=0.170)], when="2026-11-03T10:00:00.000+00:00")
    assert third.verdicts[0].status == "FAIL" and second.id in third.verdicts[0].source
    assert first.id in third.verdicts[0].source and third.verdicts[0].test["runs"] == 2
    fourth = recorded(db_path, [ar.train(step=0.102)], when="2026-11-04T10:00:00.000+00:00")
    assert second.id in fourth.verdicts[0].source  # a FAIL never becomes the baseline
    assert third.id not in fourth.verdicts[0].source and fourth.verdicts[0].test["runs"] == 2


def test_results_history_shows_each_figure_over_the_acceptances(db_path, cli):
    for day, step in ((1, 0.100), (2, 0.101), (3, 0.170)):
        recorded(db_path, [ar.train(step=step)], when=f"2026-11-0{day}T10:00:00.000+00:00")
    r = cli("results", "history", "kind:accept", "--format", "json")
    (s,) = json.loads(r.stdout)
    assert (s["check"], s["figure"]) == ("train", "throughput")
    assert [p["status"] for p in s["points"]] == ["NO EXPECTATION", "PASS", "FAIL"]
    assert s["points"][0]["value"] == pytest.approx(128 * 8 / 0.100, rel=1e-3)
    r = cli("results", "history", "kind:accept")
    assert r.code == 0 and "throughput" in r.stdout and " F" in r.stdout
    assert cli("results", "history", "kind:train").code == 2


def test_a_warn_inside_the_noise_joins_the_baseline_and_a_proven_shortfall_does_not(db_path):
    first = recorded(db_path, [ar.alone(n=4), ar.train(step=0.100)], when="2026-11-01T10:00:00.000+00:00")
    second = recorded(db_path, [ar.alone(n=4, slow_gpu=1, slow=0.07), ar.train(step=0.120)],
                      when="2026-11-02T10:00:00.000+00:00")
    # training on all: 16.7% below one run, inside the between-run noise (p = 0.1): a WARN not proven
    t2 = next(v for v in second.verdicts if v.check == "train")
    assert t2.status == "WARN" and not t2.significant
    # GPU 1 alone: 7% below its peers in the same run, steps 1% apart: a proven (significant) WARN
    g1 = next(v for v in second.verdicts if v.subject == "GPU 1" and v.expectation == "peers")
    assert g1.status == "WARN" and g1.significant
    third = recorded(db_path, [ar.alone(n=4), ar.train(step=0.110)], when="2026-11-03T10:00:00.000+00:00")
    t3 = next(v for v in third.verdicts if v.check == "train")
    assert t3.test["runs"] == 2 and second.id in t3.source and first.id in t3.source
    gpu1 = next(v for v in third.verdicts if v.subject == "GPU 1" and v.expectation == "baseline")
    assert gpu1.test["runs"] == 1 and first.id in gpu1.source and second.id not in gpu1.source
