"""A file a command is told to write (``paths.check_output``, ``paths.write_atomic``): never the database it
reads (nor its -wal/-shm/-journal files, by any path to them), never a database, an existing file only with
--force, and whole or not at all. No torch."""

from __future__ import annotations

import csv
import io
import os
import sqlite3

import pytest

from dlscale import paths
from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import Store


@pytest.fixture
def one_run(db_path):
    with Store.open(db_path) as s:
        s.insert(RunRecord(kind="train", workload="tinycnn", config={"batch_size": 8}, metrics={"throughput": 1.0},
                           tag="t"))
    return db_path


def _runs(db) -> int:
    with sqlite3.connect(db) as c:
        return c.execute("select count(*) from runs").fetchone()[0]


def _error(r) -> str:
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return line


def test_export_never_writes_over_the_database_it_reads(cli, one_run, tmp_path):
    db = one_run
    (tmp_path / "link.db").symlink_to(db)
    os.link(db, tmp_path / "hard.db")
    cases = [("--db", str(db), "--out", str(db)),  # the case: exit 0 and a CSV where the database was
             ("--db", str(db), "--out", str(db), "--force"),
             ("--out", str(db), "--force"),  # the default database ($DLSCALE_DB)
             ("--db", str(db), "--out", f"{db}-wal", "--force"),
             ("--db", str(db), "--out", f"{db}-shm"),
             ("--db", str(db), "--out", str(tmp_path / "link.db"), "--force"),
             ("--db", str(db), "--out", str(tmp_path / "hard.db"), "--force"),
             ("--db", str(db), "--format", "parquet", "--out", str(db), "--force")]
    for args in cases:
        r = cli("results", "export", *args)
        assert r.code == 2 and "the results database" in _error(r) and "never writes over it" in _error(r), (args, r.stderr)
    assert _runs(db) == 1  # still the database, every run in it


def test_export_replaces_another_file_only_with_force_and_never_a_database(cli, one_run, tmp_path):
    other = tmp_path / "other.db"
    with Store.open(other) as s:
        s.insert(RunRecord(kind="train", workload="x", config={}, metrics={}))
    r = cli("results", "export", "--out", str(other), "--force")
    assert r.code == 2 and "is an SQLite database" in _error(r) and _runs(other) == 1
    out = tmp_path / "runs.csv"
    out.write_text("keep me\n")
    r = cli("results", "export", "--out", str(out))
    assert r.code == 2 and _error(r) == f"error: --out {out} exists: add --force to replace it, or give another path"
    assert out.read_text() == "keep me\n"
    assert cli("results", "export", "--out", str(out), "--force").code == 0
    (row,) = list(csv.DictReader(io.StringIO(out.read_text())))
    assert row["workload"] == "tinycnn"
    new = tmp_path / "new.json"
    assert cli("results", "export", "--format", "json", "--out", str(new)).code == 0 and '"tinycnn"' in new.read_text()
    assert cli("results", "export", "--force").code == 2  # --force without --out says so
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_an_interrupted_write_leaves_the_old_file_and_no_part(tmp_path):
    target = tmp_path / "runs.csv"
    target.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        with paths.atomic_target(target, "--out") as tmp:
            tmp.write_text("half of the ne")
            raise KeyboardInterrupt
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv"]
    paths.write_atomic(target, "new\n", "--out")
    assert target.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv"]


def test_the_other_commands_that_write_a_file_use_the_same_check(cli, one_run, tmp_path, monkeypatch):
    db = str(one_run)
    # tune --output: refused before any trial runs
    from dlscale.tune.trials import tune as run_tune

    def no_trial(*_a, **_k):
        raise AssertionError("a trial ran")

    for out, words in ((db, "the results database"), (f"{db}-journal", "the -journal file")):
        with pytest.raises(UsageError, match=words):
            run_tune("tinycnn", db=db, device="cpu", runner=no_trial, output=out, force=True, max_memory="64G")
    kept = tmp_path / "best.yaml"
    kept.write_text("batch_size: 8\n")
    with pytest.raises(UsageError, match="exists: add --force"):
        run_tune("tinycnn", db=db, device="cpu", runner=no_trial, output=str(kept), max_memory="64G")
    # report --out DIR: its files
    rep = tmp_path / "rep"
    assert cli("report", "--out", str(rep)).code == 0
    r = cli("report", "--out", str(rep))
    assert r.code == 2 and "report.html exists: add --force" in _error(r)
    assert cli("report", "--out", str(rep), "--force").code == 0
    # accept refs export --out
    r = cli("accept", "refs", "export", "--from", "kind:accept", "--out", db, "--force")
    assert r.code == 2 and "the results database" in _error(r)
    assert cli("accept", "--force").code == 2  # --force belongs to refs export
    # tta --mlperf-log: the database, or an existing log without --force
    from dlscale.tta.config import TTAConfig
    from dlscale.tta.repeats import check_logs

    with pytest.raises(UsageError, match="the results database"):
        check_logs(TTAConfig(model="ppo_mlp", mlperf_log=db, force=True), db)
    with pytest.raises(UsageError, match="exists: add --force"):
        check_logs(TTAConfig(model="ppo_mlp", mlperf_log=str(kept)), db)
    check_logs(TTAConfig(model="ppo_mlp", mlperf_log=str(kept), force=True), db)
    assert _runs(db) == 1
