"""The results store: round trip, filters, schema version and migrations, concurrent writers."""

import multiprocessing as mp
import sqlite3

import pytest

from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import SCHEMA_VERSION, Store


def _rec(i=0, **kw):
    base = dict(kind="train", workload="tinycnn", config={"batch_size": 4, "i": i},
                system={"hostname": "h"}, metrics={"throughput": float(i)}, units={"throughput": "samples/s"},
                raw={"step_times_s": [[0.1, 0.2]]}, tag="a")
    base.update(kw)
    return RunRecord(**base)


def test_round_trip_everything(tmp_path):
    with Store.open(tmp_path / "r.db") as s:
        r = _rec(warnings=["w"], error=None)
        s.insert(r)
        back = s.get(r.run_id)
    assert back.to_dict() == r.to_dict()


def test_filters_and_prefix(tmp_path):
    with Store.open(tmp_path / "r.db") as s:
        a = _rec(1, tag="x")
        b = _rec(2, tag="y", workload="resnet18")
        c = _rec(3, tag="y", status="failed", error="boom")
        for r in (a, b, c):
            s.insert(r)
        assert {r.run_id for r in s.query(tag="y")} == {b.run_id, c.run_id}
        assert [r.run_id for r in s.query(workload="resnet18")] == [b.run_id]
        assert [r.run_id for r in s.query(status="failed")] == [c.run_id]
        assert len(s.query(tag=["x", "y"])) == 3
        assert len(s.query(limit=2)) == 2
        assert s.get(c.run_id).error == "boom"
        with pytest.raises(UsageError, match="no run"):
            s.get("nope")
        assert s.count() == 3
        assert a.config_hash in s.finished_config_hashes()


def test_ambiguous_prefix_is_a_usage_error(tmp_path):
    with Store.open(tmp_path / "r.db") as s:
        s.insert(_rec(run_id="20260101T000000-aaaa0001"))
        s.insert(_rec(run_id="20260101T000000-aaaa0002"))
        with pytest.raises(UsageError, match="several"):
            s.get("20260101T000000-aaaa")
        assert s.get("20260101T000000-aaaa0002").run_id.endswith("2")


def test_schema_version_and_migration_from_empty(tmp_path):
    p = tmp_path / "old.db"
    sqlite3.connect(p).close()  # an empty database at user_version 0
    with Store.open(p) as s:
        assert s.schema_version == SCHEMA_VERSION
        s.insert(_rec())
    with Store.open(p) as s:  # reopening does not migrate again or lose data
        assert s.schema_version == SCHEMA_VERSION and s.count() == 1


def test_newer_schema_is_refused(tmp_path):
    p = tmp_path / "new.db"
    c = sqlite3.connect(p)
    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    c.close()
    with pytest.raises(UsageError, match="newer"):
        Store.open(p)


def test_unwritable_paths_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="directory"):
        Store.open(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError):
        Store.open(blocker / "sub" / "r.db")
    bad = tmp_path / "notadb.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UsageError, match="cannot use"):
        Store.open(bad)


def _writer(path, worker, n):
    with Store.open(path) as s:
        for i in range(n):
            s.insert(_rec(i, tag=f"w{worker}"))


@pytest.mark.slow
def test_eight_processes_fifty_inserts_each_lose_nothing(tmp_path):
    path = str(tmp_path / "c.db")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 50)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    with Store.open(path) as s:
        assert s.count() == 400
        for w in range(8):
            assert len(s.query(tag=f"w{w}")) == 50


def _imported(source="f.csv", index=0, **kw):
    return _rec(imported=True, config={"source": source, "source_index": index}, **kw)


def test_imports_are_stored_once_per_key(tmp_path):
    with Store.open(tmp_path / "r.db") as s:
        a, b = _imported(index=0), _imported(index=1)
        assert s.insert_imports([a, b]) == [a, b]
        again = [_imported(index=0), _imported(index=1), _imported(index=2)]
        assert [r.config["source_index"] for r in s.insert_imports(again)] == [2]  # only the new row
        s.insert(_imported(index=3))  # a plain insert of an imported run claims its key too
        assert s.insert_imports([_imported(index=3)]) == []
        assert s.count() == 4
        with pytest.raises(ValueError, match="not marked imported"):
            s.insert_imports([_imported(index=9), _rec()])
        assert s.count() == 4  # all or nothing


def _version_1_database(path, recs):
    """A database as dlscale wrote it before the import keys (schema version 1)."""
    from dlscale.store import MIGRATIONS

    c = sqlite3.connect(path, isolation_level=None)
    for stmt in filter(None, (s.strip() for s in MIGRATIONS[0].split(";"))):
        c.execute(stmt)
    for r in recs:
        Store._write(c, r)
    c.execute("PRAGMA user_version = 1")
    c.close()


def test_version_1_database_migrates_and_keeps_its_runs(tmp_path):
    p = tmp_path / "v1.db"
    first = _imported(run_id="20250101T000000-00000001", created_at="2025-01-01T00:00:00.000+00:00")
    dup = _imported(run_id="20250102T000000-00000002", created_at="2025-01-02T00:00:00.000+00:00")  # the race's copy
    other = _imported(index=1)
    measured = _rec()
    _version_1_database(p, [first, dup, other, measured])
    with Store.open(p) as s:
        assert s.schema_version == SCHEMA_VERSION == 2
        assert s.count() == 4  # nothing deleted
        keys = dict(s._conn.execute("SELECT import_key, run_id FROM imports"))
        assert keys == {first.config_hash: first.run_id, other.config_hash: other.run_id}  # the oldest copy holds it
        assert s.insert_imports([_imported(), _imported(index=1)]) == []  # imported before
        assert len(s.insert_imports([_imported(index=2)])) == 1
        assert s.count() == 5


def _import_worker(path, ready, go, counts):
    with Store.open(path) as s:
        ready.set()
        go.wait(60)
        counts.put(len(s.insert_imports([_imported(index=i) for i in range(3)])))


@pytest.mark.slow
def test_six_processes_importing_at_once_store_one_copy(tmp_path):
    path = str(tmp_path / "c.db")
    Store.open(path).close()  # created and migrated before the race
    ctx = mp.get_context("spawn")
    go, counts = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in range(6)]
    procs = [ctx.Process(target=_import_worker, args=(path, r, go, counts)) for r in readies]
    for p in procs:
        p.start()
    assert all(r.wait(60) for r in readies)
    go.set()
    got = sorted(counts.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert got == [0, 0, 0, 0, 0, 3]
    with Store.open(path) as s:
        assert s.count() == 3 and len(s.query(imported=True)) == 3
