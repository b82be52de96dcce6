"""Run records: identity, hashing, serialisation."""

from dlscale.record import RunRecord, config_hash


def test_config_hash_is_stable_and_order_independent():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_round_trip_and_key_order():
    r = RunRecord(kind="train", workload="tinycnn", config={"batch_size": 4}, metrics={"throughput": 1.5},
                  units={"throughput": "samples/s"}, raw={"step_times_s": [[0.1, 0.2]]}, tag="t")
    d = r.to_dict()
    assert list(d)[:3] == ["run_id", "status", "error"]
    assert d["config_hash"] == r.config_hash
    back = RunRecord.from_dict(d)
    assert back == r
    r.fail("boom")
    assert r.status == "failed" and r.error == "boom"


def test_run_ids_are_unique():
    assert len({RunRecord(kind="k", workload="w", config={}).run_id for _ in range(200)}) == 200


def test_flatten_nests_with_dots_and_keeps_lists():
    from dlscale.record import flatten

    assert flatten({"a": 1, "b": {"c": [1, 2], "d": {"e": None}}, "f": {}}) == {"a": 1, "b.c": [1, 2], "b.d.e": None}
    assert flatten({}) == {}


def test_flat_row_is_what_results_export_writes():
    from dlscale.cli.results import export_text

    r = RunRecord(kind="train", workload="tinycnn", config={"batch_size": 4, "opt": {"lr": 0.1, "betas": [0.9, 0.99]}},
                  metrics={"throughput": 1.5, "throughput_ci95": [1.0, 2.0]}, system={"hostname": "h"}, tag="t",
                  run_id="20260101T000000-aaaa0001", created_at="2026-01-01T00:00:00.000+00:00")
    row = r.flat()
    assert list(row)[:12] == ["run_id", "created_at", "finished_at", "kind", "workload", "status", "tag", "imported",
                              "error", "dlscale_version", "hostname", "config_hash"]
    assert row["hostname"] == "h" and row["config_hash"] == r.config_hash
    assert {k: v for k, v in row.items() if k.startswith(("config.", "metrics."))} == {
        "config.batch_size": 4, "config.opt.lr": 0.1, "config.opt.betas": [0.9, 0.99],
        "metrics.throughput": 1.5, "metrics.throughput_ci95": [1.0, 2.0]}
    header, line = export_text([r], "csv").splitlines()
    assert header == ",".join(row)
    assert line.endswith(',4,0.1,"[0.9, 0.99]",1.5,"[1.0, 2.0]"')  # lists as JSON text in one cell
