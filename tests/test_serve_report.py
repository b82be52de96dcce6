"""Serving runs read back: the Pareto front, the report's sections, results and compare."""

from __future__ import annotations

from dlscale.analysis.serving import front, points_of
from dlscale.record import RunRecord
from dlscale.report.serving_section import serving_sections
from dlscale.store import Store


def test_front_by_hand():
    # (2, 1) is beaten by (2, 2); (1, 1) by everything; None never counts
    assert front([1, 2, 3, 2, 1, None], [3, 2, 1, 1, 1, 5]) == [True, True, True, False, False, False]
    assert front([], []) == []


def _rec(tag: str, scale: float = 1.0) -> RunRecord:
    loads = [1, 2, 4, 8]
    server = [100 * scale, 180 * scale, 300 * scale, 290 * scale]  # 8 in flight is worse on both than 4
    user = [100.0, 90.0, 75.0, 36.0]
    m = {"loads_by_point": loads, "output_throughput_by_point": server, "tokens_per_s_per_user_by_point": user,
         "request_throughput_by_point": [s / 32 for s in server], "ttft_p99_s_by_point": [0.1, 0.2, 0.4, 3.0],
         "tpot_p99_s_by_point": [0.01, 0.012, 0.014, 0.03], "goodput_by_point": [3.0, 5.0, 9.0, 0.0],
         "slo_met_by_point": [True, True, True, False], "max_load_meeting_slo": 4, "slo_binding": "ttft",
         "slo_ttft_s": 2.0, "slo_tpot_s": 0.2, "throughput": 300 * scale, "goodput": 9.0,
         "client_ttft_overhead_s": 0.0003}
    return RunRecord(kind="serving", workload="tiny", tag=tag, system={"hostname": "box"},
                     config={"url": "http://127.0.0.1:8000", "mode": "concurrency", "family": "llm-serving",
                             "sample_unit": "tokens"}, metrics=m, units={"throughput": "tokens/s"})


def test_points_and_sections():
    rec = _rec("a")
    pts = points_of(rec)
    assert [p["front"] for p in pts] == [True, True, True, False]
    secs = serving_sections([rec])
    assert [s.title for s in secs] == ["LLM serving: tokens/s per user against tokens/s per server",
                                       "LLM serving at an SLO"]
    assert secs[0].figure.png.startswith(b"\x89PNG")
    rows = secs[0].tables[0].rows
    assert [r[-2] for r in rows] == ["yes", "yes", "yes", ""] and [r[-1] for r in rows] == ["met"] * 3 + ["missed"]
    assert secs[1].tables[0].rows[0][3:5] == ["4", "ttft"]
    assert serving_sections([RunRecord(kind="train", workload="x", config={})]) == []


def test_report_results_and_compare(cli, db_path, tmp_path):
    with Store.open(str(db_path)) as s:
        s.insert(_rec("after", 1.2))
        s.insert(_rec("before"))
    r = cli("report", "--out", str(tmp_path / "rep"))
    assert r.code == 0, r.stderr
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "LLM serving at an SLO" in html and "tokens/s per user against tokens/s per server" in html
    listed = cli("results", "list", "--kind", "serving")
    assert listed.code == 0 and "tokens/s" in listed.stdout
    cmp = cli("compare", "tag:after", "tag:before", "--format", "json")
    assert cmp.code == 0, cmp.stderr
    import json

    rows = json.loads(cmp.stdout)["rows"]  # one row per load point: a sweep compares point by point
    assert [r["load"] for r in rows] == [1, 2, 4, 8]
    assert [(r["a"], r["b"]) for r in rows] == [(120.0, 100.0), (216.0, 180.0), (360.0, 300.0), (348.0, 290.0)]
    for row in rows:
        assert row["unit"] == "tokens/s" and abs(row["pct_difference"] - 0.2) < 1e-9  # every point 1.2x
