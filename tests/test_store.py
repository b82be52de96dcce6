"""The results store on both backends (an SQLite file and a PostgreSQL database): round trip,
filters, schema version and migrations, concurrent writers and importers.

The PostgreSQL cases run against a real server the ``pg_server`` fixture starts (tests/pgserver.py);
where it cannot run they skip and say why (fail under DLSCALE_REQUIRE_POSTGRES=1).
"""

import multiprocessing as mp
import sqlite3

import pytest
from pgserver import pg_server, pg_url  # noqa: F401 - fixtures

from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import MIGRATIONS, PG_MIGRATIONS, SCHEMA_VERSION, Store
from dlscale.stores.schema import COLUMNS, statements, to_row

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path) -> str:
    """A fresh store's location: an SQLite file, or a new database on the test server."""
    if request.param == "sqlite":
        return str(tmp_path / "r.db")
    return request.getfixturevalue("pg_url")


def _rec(i=0, **kw):
    base = dict(kind="train", workload="tinycnn", config={"batch_size": 4, "i": i},
                system={"hostname": "h"}, metrics={"throughput": float(i)}, units={"throughput": "samples/s"},
                raw={"step_times_s": [[0.1, 0.2]]}, tag="a")
    base.update(kw)
    return RunRecord(**base)


def test_round_trip_everything(db):
    with Store.open(db) as s:
        r = _rec(warnings=["w"], error=None, metrics={"throughput": 2.5, "nan": float("nan")})
        s.insert(r)
        back = s.get(r.run_id)
    d, e = back.to_dict(), r.to_dict()
    assert back.metrics["nan"] != back.metrics["nan"]  # NaN survives the trip
    d["metrics"].pop("nan"), e["metrics"].pop("nan")
    assert d == e


def test_filters_and_prefix(db):
    with Store.open(db) as s:
        a = _rec(1, tag="x", created_at="2026-01-01T00:00:01.000+00:00")
        b = _rec(2, tag="y", workload="resnet18", created_at="2026-01-01T00:00:02.000+00:00")
        c = _rec(3, tag="y", status="failed", error="boom", created_at="2026-01-01T00:00:03.000+00:00")
        for r in (a, b, c):
            s.insert(r)
        assert {r.run_id for r in s.query(tag="y")} == {b.run_id, c.run_id}
        assert [r.run_id for r in s.query(workload="resnet18")] == [b.run_id]
        assert [r.run_id for r in s.query(status="failed")] == [c.run_id]
        assert len(s.query(tag=["x", "y"])) == 3
        assert [r.run_id for r in s.query(limit=2)] == [c.run_id, b.run_id]  # newest first
        assert [r.run_id for r in s.query(newest_first=False)] == [a.run_id, b.run_id, c.run_id]
        assert s.query(run_ids=[]) == [] and s.query(imported=True) == []
        assert s.get(c.run_id).error == "boom"
        with pytest.raises(UsageError, match="no run"):
            s.get("nope")
        assert s.count() == 3
        assert a.config_hash in s.finished_config_hashes()
        assert s.finished_config_hashes("micro") == set()


def test_ambiguous_prefix_is_a_usage_error(db):
    with Store.open(db) as s:
        s.insert(_rec(run_id="20260101T000000-aaaa0001"))
        s.insert(_rec(run_id="20260101T000000-aaaa0002"))
        s.insert(_rec(run_id="20260101T000000_abc"))  # "_" is no wildcard in a prefix
        with pytest.raises(UsageError, match="several"):
            s.get("20260101T000000-aaaa")
        assert s.get("20260101T000000-aaaa0002").run_id.endswith("2")
        assert s.get("20260101T000000_").run_id == "20260101T000000_abc"


def test_insert_again_replaces_the_run(db):
    with Store.open(db) as s:
        r = _rec(status="failed", error="first try")
        s.insert(r)
        r.status, r.error = "ok", None
        s.insert(r)
        assert s.count() == 1 and s.get(r.run_id).status == "ok"


def test_schema_version_and_migration_from_empty(db, tmp_path):
    if db.endswith(".db"):
        sqlite3.connect(db).close()  # an empty database at user_version 0
    with Store.open(db) as s:
        assert s.schema_version == SCHEMA_VERSION
        s.insert(_rec())
    with Store.open(db) as s:  # reopening does not migrate again or lose data
        assert s.schema_version == SCHEMA_VERSION and s.count() == 1


def _sql(db, *stmts, rows=()):
    """Run statements (and insert ``rows`` of runs) on ``db`` directly, as another program would."""
    if db.endswith(".db"):
        c = sqlite3.connect(db, isolation_level=None)
        ph = "?"
    else:
        import psycopg

        c = psycopg.connect(db, autocommit=True)
        ph = "%s"
    for stmt in stmts:
        c.execute(stmt)
    for r in rows:
        c.execute(f"INSERT INTO runs ({','.join(COLUMNS)}) VALUES ({','.join([ph] * len(COLUMNS))})", to_row(r))
    c.close()


def _set_version(db, version):
    if db.endswith(".db"):
        return (f"PRAGMA user_version = {version}",)
    return ("CREATE TABLE IF NOT EXISTS dlscale_schema (version INTEGER NOT NULL)", "DELETE FROM dlscale_schema",
            f"INSERT INTO dlscale_schema VALUES ({version})")


def test_newer_schema_is_refused(db):
    Store.open(db).close()
    _sql(db, *_set_version(db, SCHEMA_VERSION + 1))
    with pytest.raises(UsageError, match="newer"):
        Store.open(db)


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


def test_only_postgresql_urls_are_taken_for_servers(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match=r"unsupported URL scheme mysql://") as e:
        Store.open("mysql://bob:hunter2@db/x")
    assert "hunter2" not in str(e.value)
    monkeypatch.setenv("DLSCALE_DB", str(tmp_path / "env.db"))
    with Store.open() as s:  # $DLSCALE_DB when --db is not given
        assert s.backend == "sqlite" and s.path == tmp_path / "env.db"


def _writer(path, worker, n):
    with Store.open(path) as s:
        for i in range(n):
            s.insert(_rec(i, tag=f"w{worker}"))


@pytest.mark.slow
def test_eight_processes_fifty_inserts_each_lose_nothing(db):
    """Eight writers on a store none has opened yet (so they also race to create its schema)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(db, w, 50)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    with Store.open(db) as s:
        assert s.count() == 400
        recs = s.query()
        assert len({r.run_id for r in recs}) == 400
        for w in range(8):
            assert sorted(r.config["i"] for r in recs if r.tag == f"w{w}") == list(range(50))


def _imported(source="f.csv", index=0, **kw):
    return _rec(imported=True, config={"source": source, "source_index": index}, **kw)


def test_imports_are_stored_once_per_key(db):
    with Store.open(db) as s:
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


def test_insert_new_copies_each_run_once(db):
    with Store.open(db) as s:
        runs = [_rec(i) for i in range(3)]
        assert s.insert_new(runs[:2]) == runs[:2]
        assert s.insert_new(runs) == [runs[2]]
        assert s.insert_new(runs) == []
        held = _imported(index=5)
        s.insert(held)
        same_import_elsewhere = _imported(index=5)  # another run id, the same import key
        assert s.insert_new([same_import_elsewhere, held]) == []
        fresh = _imported(index=6)
        assert s.insert_new([fresh]) == [fresh] and s.insert_imports([_imported(index=6)]) == []
        assert s.count() == 5


def test_version_1_database_migrates_and_keeps_its_runs(db):
    first = _imported(run_id="20250101T000000-00000001", created_at="2025-01-01T00:00:00.000+00:00")
    dup = _imported(run_id="20250102T000000-00000002", created_at="2025-01-02T00:00:00.000+00:00")  # the race's copy
    other = _imported(index=1)
    measured = _rec()
    v1 = (MIGRATIONS if db.endswith(".db") else PG_MIGRATIONS)[0]
    _sql(db, *statements(v1), *_set_version(db, 1), rows=[dup, first, other, measured])
    with Store.open(db) as s:
        assert s.schema_version == SCHEMA_VERSION == 2
        assert s.count() == 4  # nothing deleted
        keys = dict(s._backend.read("SELECT import_key, run_id FROM imports"))
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
def test_six_processes_importing_at_once_store_one_copy(db):
    Store.open(db).close()  # created and migrated before the race
    ctx = mp.get_context("spawn")
    go, counts = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in range(6)]
    procs = [ctx.Process(target=_import_worker, args=(db, r, go, counts)) for r in readies]
    for p in procs:
        p.start()
    assert all(r.wait(60) for r in readies)
    go.set()
    got = sorted(counts.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert got == [0, 0, 0, 0, 0, 3]
    with Store.open(db) as s:
        assert s.count() == 3 and len(s.query(imported=True)) == 3
