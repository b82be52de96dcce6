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
