"""PostgreSQL as the team's shared results store, against a real server (tests/pgserver.py).

What only a server shows: a password in the URL is never printed, logged, stored or put on a
child's command line; an unreachable server is a one-line usage error (exit 2); a restart in the
middle of a writer's run delays its writes and loses none; ``dlscale results push`` copies a
node's runs once however often it runs; the commands that read the store work on it.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import run_dlscale
from pgserver import ALICE_PASSWORD, pg_server, pg_url  # noqa: F401 - fixtures

from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import Store


@pytest.fixture(autouse=True)
def _own_pgpassword(monkeypatch):
    """Store.open moves a URL's password into PGPASSWORD; undo that after each test."""
    monkeypatch.delenv("PGPASSWORD", raising=False)


def _alice(server) -> str:
    """A URL with a password in it (the role alice must give it), of a fresh database she owns."""
    return server.url(server.createdb(owner="alice"), "alice", ALICE_PASSWORD)


def _rec(i=0, tag="n1", **kw):
    return RunRecord(kind="train", workload="tinycnn", config={"model": "tinycnn", "batch_size": 32, "i": i},
                     metrics={"throughput": 100.0 + i}, units={"throughput": "images/s"}, tag=tag, **kw)


def _stored_text(server, url) -> str:
    """Every stored row as text, read as the superuser straight from the tables."""
    dbname = url.split("@/")[1].split("?")[0]
    return repr(server.sql("SELECT * FROM runs", dbname)) + repr(server.sql("SELECT * FROM imports", dbname))


def test_password_is_never_shown_logged_or_stored(pg_server, cli, caplog):
    caplog.set_level(logging.DEBUG)
    url = _alice(pg_server)
    rec = _rec(system={"argv": ["dlscale", "train", "--db", url]}, error=f"could not write to {url}")
    with Store.open(url) as s:
        assert ALICE_PASSWORD not in str(s.path) + s.location and "alice:***@" in s.location
        s.insert(rec)
        child_url = str(s.path)
    assert os.environ["PGPASSWORD"] == ALICE_PASSWORD  # what the processes a sweep starts use
    stored = _stored_text(pg_server, url)
    assert ALICE_PASSWORD not in stored and "alice:***@" in stored
    with Store.open(url) as s:
        assert s.get(rec.run_id).system["argv"][-1] == url.replace(ALICE_PASSWORD, "***")
    child = run_dlscale("results", "list", "--db", child_url, "--format", "json", timeout=60)
    assert child.code == 0 and [r["run_id"] for r in json.loads(child.stdout)] == [rec.run_id]
    listed = cli("results", "show", rec.run_id, "--db", url, "--format", "json")
    assert listed.code == 0 and rec.run_id in listed.stdout
    wrong = url.replace(ALICE_PASSWORD, "Wr0ng-pass")
    with pytest.raises(UsageError, match="password authentication failed") as e:
        Store.open(wrong)
    assert "Wr0ng-pass" not in str(e.value) and "alice:***@" in str(e.value)
    bad = cli("results", "list", "--db", wrong)
    assert bad.code == 2 and bad.stderr.count("\n") == 1 and "Wr0ng-pass" not in bad.stderr + bad.stdout
    for text in (listed.stdout, listed.stderr, child.stdout, child.stderr, caplog.text):
        assert ALICE_PASSWORD not in text


@pytest.mark.parametrize("url, shown, bare, password", [
    ("postgresql://alice:s3cr@t@db.lab:5432/r?sslmode=require", "postgresql://alice:***@db.lab:5432/r?sslmode=require",
     "postgresql://alice@db.lab:5432/r?sslmode=require", "s3cr@t"),  # "@" in a password: the last one ends it
    ("postgres://bob@/r?host=/run/pg&password=p%26w&options=-crole%3Dteam",
     "postgres://bob@/r?host=/run/pg&password=***&options=-crole%3Dteam",
     "postgres://bob@/r?host=/run/pg&options=-crole%3Dteam", "p&w"),  # the other parameters kept verbatim
    ("postgresql:///r?host=/run/pg", "postgresql:///r?host=/run/pg", "postgresql:///r?host=/run/pg", None),
])
def test_urls_are_shown_and_passed_on_without_their_password(url, shown, bare, password):
    from dlscale.stores.url import redact_text, split_password

    assert redact_text(url) == shown
    assert split_password(url) == (bare, password)
    argv = json.dumps(["dlscale", "--db", url, "https://me:tok@git.lab/x", "a@b"])
    assert redact_text(argv) == json.dumps(["dlscale", "--db", shown, "https://me:***@git.lab/x", "a@b"])


def test_a_password_file_serves_a_url_without_password(pg_server, tmp_path, monkeypatch):
    url = _alice(pg_server)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:alice:{ALICE_PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with Store.open(url.replace(f":{ALICE_PASSWORD}", "")) as s:
        assert s.count() == 0 and "PGPASSWORD" not in os.environ


def test_unreachable_server_is_a_one_line_usage_error(tmp_path, cli, monkeypatch):
    url = f"postgresql://bob:s3cret-x@/dlscale?host={tmp_path}"  # no server listens there
    t0 = time.monotonic()
    with pytest.raises(UsageError) as e:
        Store.open(url)
    msg = str(e.value)
    assert time.monotonic() - t0 < 5 and "\n" not in msg
    assert msg.startswith("cannot use results database postgresql://bob:***@/dlscale") and "s3cret-x" not in msg
    monkeypatch.setenv("DLSCALE_DB", url)  # the environment's URL, as a sweep's nodes would get it
    r = cli("results", "list")
    assert r.code == 2 and r.stderr.startswith("error: cannot use results database postgresql://bob:***@")
    assert r.stderr.count("\n") == 1 and "s3cret-x" not in r.stderr


_WRITER = textwrap.dedent("""
    import sys, time
    from dlscale.record import RunRecord
    from dlscale.store import Store
    with Store.open(sys.argv[1]) as s:
        for i in range(int(sys.argv[2])):
            s.insert(RunRecord(kind="train", workload="w", config={"i": i}, tag="restart"))
            time.sleep(0.02)
""")


def _wait_for(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_server_restart_delays_writes_and_loses_none(pg_server):
    url, n = _alice(pg_server), 120
    dbname = url.split("@/")[1].split("?")[0]
    reader = Store.open(url)  # also held open across the restarts: its next read reconnects

    def count() -> int:
        return pg_server.sql("SELECT COUNT(*) FROM runs", dbname)[0][0]

    writer = subprocess.Popen([sys.executable, "-c", _WRITER, url, str(n)], stderr=subprocess.PIPE, text=True)
    try:
        for at in (10, 50):  # two restarts while the writer is writing
            _wait_for(lambda: count() >= at)
            pg_server.restart()
        _, stderr = writer.communicate(timeout=60)
    finally:
        writer.kill()
    assert writer.returncode == 0, stderr
    assert "retrying" in stderr and ALICE_PASSWORD not in stderr  # it waited, and said so without the password
    recs = reader.query(tag="restart")
    reader.close()
    assert sorted(r.config["i"] for r in recs) == list(range(n))  # none lost, none twice
    assert count() == n


def test_push_copies_runs_once_and_either_way(pg_url, tmp_path, cli):
    node = str(tmp_path / "node.db")
    with Store.open(node) as s:
        for i in range(5):
            s.insert(_rec(i))
        for i in range(2):
            s.insert(_rec(10 + i, tag="other"))
    first = cli("results", "push", "--db", node, "--to", pg_url, "--tag", "n1")
    assert first.code == 0 and first.stdout.startswith("pushed 5, already there 0")
    again = cli("results", "push", "--db", node, "--to", pg_url, "--tag", "n1")
    assert again.stdout.startswith("pushed 0, already there 5")
    rest = cli("results", "push", "--db", node, "--to", pg_url, "--format", "json")
    assert json.loads(rest.stdout)["pushed"] == 2 and json.loads(rest.stdout)["already_there"] == 5
    back = str(tmp_path / "laptop.db")  # and the other way: the shared store into a laptop's file
    assert cli("results", "push", "--db", pg_url, "--to", back).stdout.startswith("pushed 7, already there 0")
    with Store.open(node) as a, Store.open(pg_url) as b, Store.open(back) as c:
        assert b.count() == c.count() == 7
        assert [r.to_dict() for r in a.query()] == [r.to_dict() for r in b.query()] == [r.to_dict() for r in c.query()]


def test_reading_commands_work_on_postgresql(pg_url, cli, monkeypatch):
    with Store.open(pg_url) as s:
        s.insert(_rec(0, tag="before", created_at="2026-01-01T00:00:01.000+00:00"))
        s.insert(_rec(25, tag="after", created_at="2026-01-01T00:00:02.000+00:00"))
    r = cli("compare", "tag:after", "tag:before", "--db", pg_url, "--format", "json")
    assert r.code == 0, r.stderr
    row = json.loads(r.stdout)["rows"][0]
    assert (row["a"], row["b"], row["pct_difference"]) == (125.0, 100.0, 0.25)  # (125 - 100) / 100
    monkeypatch.setenv("DLSCALE_DB", pg_url)
    listed = cli("results", "list", "--format", "json")
    assert [x["tag"] for x in json.loads(listed.stdout)] == ["after", "before"]


@pytest.mark.slow
def test_a_real_run_records_into_postgresql_without_the_password(pg_server):
    """``dlscale train --db URL-with-password`` in a fresh interpreter: the run lands in the
    database, and its record (whose system part keeps the command line) holds no password."""
    url = _alice(pg_server)
    r = run_dlscale("train", "tinycnn", "--steps", "2", "--warmup-steps", "1", "--batch-size", "4",
                    "--image-size", "16", "--db", url, "--format", "json", timeout=120)
    assert r.code == 0, r.stderr
    assert ALICE_PASSWORD not in r.stdout + r.stderr
    run_id = json.loads(r.stdout)["run_id"]
    with Store.open(url) as s:
        rec = s.get(run_id)
    assert rec.status == "ok" and url.replace(ALICE_PASSWORD, "***") in rec.system["argv"]
    assert ALICE_PASSWORD not in _stored_text(pg_server, url)


def test_a_long_outage_is_said_once_then_at_doubling_times_not_every_retry(monkeypatch, caplog):
    """A server away for 290 s of a 300 s window (a retry every 5 s): the loss, then the first retry past 10, 20,
    40, 80 and 160 s into it, then back: 7 lines where one per retry made 60. A fake clock: nothing waits."""
    import psycopg

    from dlscale.stores import postgres

    now = [0.0]
    monkeypatch.setattr(postgres, "time", type("Clock", (), {
        "monotonic": staticmethod(lambda: now[0]), "sleep": staticmethod(lambda s: now.__setitem__(0, now[0] + s))}))

    class Conn:
        closed = broken = False

    def connect():
        if now[0] < 290:
            raise psycopg.OperationalError("connection refused")
        return Conn()

    b = postgres.PostgresBackend.__new__(postgres.PostgresBackend)
    b.display, b._password, b._conn, b.retry_s = "postgresql://db.lab/dlscale", None, None, 300.0
    monkeypatch.setattr(b, "_connect_once", connect)
    with caplog.at_level(logging.WARNING, logger="dlscale.store"):
        assert b._run(lambda conn, retrying: retrying) is True
    lines = [r.getMessage() for r in caplog.records]
    head = "lost results database postgresql://db.lab/dlscale"
    assert lines[0] == f"{head} (connection refused); retrying for up to 300 s"
    said = [float(ln.split("still away after ")[1].split(" s")[0]) for ln in lines[1:-1]]
    assert len(said) == 5 and all(at <= t < at + 5 for t, at in zip(said, (10, 20, 40, 80, 160)))  # retries 5 s apart
    assert lines[-1].startswith(f"{head}: back after 29") and len(lines) == 7
