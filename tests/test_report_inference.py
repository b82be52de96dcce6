"""The report's inference sections: throughput and latency by batch size per unit, LoadGen scenarios."""

from __future__ import annotations

from dlscale.record import RunRecord
from dlscale.report.inference_section import batch_rows, inference_sections, scenario_rows
from dlscale.store import Store

SYSTEM = {"hostname": "box-1"}


def _inf(model: str, unit: str, **metrics) -> RunRecord:
    return RunRecord(kind="inference", workload=model, tag="inf", system=SYSTEM,
                     config={"runtime": "torch", "precision": "fp32", "sample_unit": unit, "family": "x"},
                     metrics={"batch_sizes": [1, 4], "throughput_by_batch": [100.0, 320.0],
                              "throughput_ci95_by_batch": [[95.0, 105.0], [300.0, 340.0]],
                              "latency_p50_by_batch": [0.01, 0.0125], "latency_p90_by_batch": [0.011, 0.013],
                              "latency_p99_by_batch": [0.012, 0.014], "latency_max_by_batch": [0.02, 0.03],
                              "throughput": 320.0, **metrics},
                     units={"throughput": f"{unit}/s", "scenario_metric": "s"})


def test_batch_rows_carry_each_batch_with_its_percentiles():
    rows = batch_rows(_inf("tinycnn", "images"))
    assert [r[4] for r in rows] == ["1", "4"]
    assert rows[1][5] == "320.0" and rows[1][6] == "300.0 - 340.0"
    assert rows[0][7] == "10.00 ms" and rows[1][9] == "14.00 ms"


def test_one_section_per_unit_and_a_scenario_table():
    recs = [_inf("tinycnn", "images"), _inf("llama_tiny", "tokens"),
            _inf("tinycnn", "images", scenario="single-stream", scenario_metric=0.0123,
                 scenario_metric_name="90th percentile latency", valid=False)]
    secs = inference_sections(recs)
    titles = [s.title for s in secs]
    assert titles == ["Inference throughput and latency by batch size: images/s",
                      "Inference throughput and latency by batch size: tokens/s", "MLPerf LoadGen scenarios"]
    assert all(r[0] == "tinycnn" for r in secs[0].tables[0].rows)  # tokens never in the images table
    assert secs[0].figure is not None and secs[0].tables[0].columns[5] == "throughput (images/s)"
    (row,) = scenario_rows(recs)
    assert row[2:7] == ["single-stream", "90th percentile latency", "12.30 ms", "INVALID", "-"]  # a record from before samples_on
    pinned = _inf("tinycnn", "images", scenario="offline", scenario_metric=900.0, samples_on="host")
    (host,) = scenario_rows([pinned])
    assert host[6:] == ["host", pinned.run_id]


def test_report_command_includes_inference(cli, db_path, tmp_path):
    with Store.open(db_path) as s:
        s.insert(_inf("tinycnn", "images"))
    r = cli("report", "--out", str(tmp_path / "rep"), "--format", "md")
    assert r.code == 0, r.stderr
    text = next((tmp_path / "rep").glob("*.md")).read_text()
    assert "Inference throughput and latency by batch size: images/s" in text


def test_tune_section_shows_the_ablation_table():
    from dlscale.report.tune_section import tune_section

    rec = RunRecord(kind="tune", workload="resnet50", tag="t", system=SYSTEM, config={},
                    metrics={"gain": 2.0}, units={"throughput_best": "images/s"},
                    raw={"ablation": [{"knob": "start", "value": "fp32", "throughput": 10.0, "ci": [9.5, 10.5],
                                       "gain": 1.0, "cumulative": 1.0, "kept": True, "note": ""},
                                      {"knob": "precision", "value": "bf16", "throughput": 20.0, "ci": [19.0, None],
                                       "gain": 2.0, "cumulative": 2.0, "kept": True, "note": ""}],
                         "config_file": "/tmp/best.yaml", "not_searched": ["compile modes: needs a field"]})
    sec = tune_section([rec])
    (table,) = sec.tables
    assert table.columns[2] == "throughput (images/s)"
    # a record made before the closing check: no re-test; its gain named as the product of the steps
    assert table.rows[1][:7] == ["precision", "bf16", "20.0", ">= 19.0 (no upper bound)", "x2.00", "-", "kept"]
    assert "x2.00 over the starting configuration as the product of its steps' gains" in table.caption
    assert sec.notes == ["resnet50: not searched: compile modes: needs a field"]
    assert tune_section([]) is None
    rec.metrics = {"gain": 1.8, "gain_ci95": [1.6, 2.0], "gain_pairs": 3}
    rec.raw["ablation"][1].update(retest=1.9, reverted=False)
    rec.raw["ablation"].append({"knob": "compile", "value": True, "throughput": 21.0, "ci": [20.0, 22.0], "gain": 1.05,
                                "kept": True, "retest": 0.99, "reverted": True, "note": ""})
    (table,) = tune_section([rec]).tables
    assert table.rows[1][4:7] == ["x2.00", "x1.90", "kept"] and table.rows[2][4:7] == ["x1.05", "x0.99", "reverted"]
    assert "1.80x (95% CI 1.60x - 2.00x) over the starting configuration, measured side by side (3 pairs)" in table.caption
