"""The local spool: a finished run whose PostgreSQL server went away and stayed away is kept, its
figures printed, the command exits 1 naming the spool, and `results push` delivers it later.

Each test starts a PostgreSQL server of its own (tests/pgserver.py) and stops it in the middle of
a run, as an outage does; the session's shared server is left alone. Without the server binaries
they skip, unless DLSCALE_REQUIRE_POSTGRES=1 (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import marked_ranks, wait_until
from dlscale.errors import UsageError
from dlscale.store import Store
from dlscale.stores import spool
from pgserver import need_postgres, start_server

TINY = ["tinycnn", "--image-size", "32", "--batch-size", "4", "--warmup-steps", "1", "--device", "cpu"]


@pytest.fixture
def own_server():
    """A server this test may stop: not the session's shared one."""
    need_postgres()
    server = start_server()
    yield server
    try:
        server.stop()
    except RuntimeError:
        pass  # stopped by the test already
    shutil.rmtree(server.base, ignore_errors=True)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The dlscale data directory (where the spool lives), and a one-second retry window."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DLSCALE_DB_RETRY_S", "1")
    spool.take_pending()
    yield tmp_path / "home" / "dlscale"
    spool.take_pending()


def _delivered(cli, server, url: str, err_line: str, run_id: str) -> None:
    """Bring the server back, run the push command the error line names, find the run there."""
    server.start()
    push = err_line.split("deliver with `")[1].split("`")[0].split()
    assert push[:5] == ["dlscale", "results", "push", "--db", str(spool.spool_path(url))]
    r = cli(*push[1:5], "--to", url)
    assert r.code == 0 and "pushed 1, already there 0" in r.stdout, r.stderr
    with Store.open(url) as s:
        rec = s.get(run_id)
    assert rec.status == "ok" and rec.raw["spooled"]["for"] == url


def test_a_finished_run_outlives_its_database(own_server, home, cli, monkeypatch):
    from dlscale.train import shorttest

    url = own_server.url(own_server.createdb())
    run_short_test = shorttest.run_short_test

    def then_the_server_goes(*a, **k):  # the run finishes; then the database is gone for good
        out = run_short_test(*a, **k)
        own_server.stop()
        return out

    monkeypatch.setattr(shorttest, "run_short_test", then_the_server_goes)
    r = cli("train", *TINY, "--steps", "3", "--db", url, "--format", "json")
    assert r.code == 1
    rec = json.loads(r.stdout)  # the figures, printed as always
    assert rec["status"] == "ok" and rec["metrics"]["throughput"] > 0
    last = r.stderr.strip().splitlines()[-1]
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [last]  # one error line, the last
    where = spool.spool_path(url)
    assert last == (f"error: run {rec['run_id']} did not reach results database {url}, which stayed unreachable; "
                    f"kept in the local spool {where}: deliver with `dlscale results push --db {where} --to "
                    f"'{url}'` once it is back")
    assert where.parent == home / "spool"
    with Store.open(where) as kept:
        assert kept.get(rec["run_id"]).metrics["throughput"] == rec["metrics"]["throughput"]
    _delivered(cli, own_server, url, last, rec["run_id"])
    assert cli("results", "push", "--db", str(where), "--to", url).stdout.startswith("pushed 0, already there 1")


@pytest.mark.slow
@pytest.mark.long
def test_a_distributed_run_outlives_its_database(own_server, home, cli):
    url = own_server.url(dbname := own_server.createdb())
    env = {**os.environ, "DLSCALE_TEST_MARK": f"spool-{os.getpid()}"}
    p = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", "train", *TINY, "--steps", "400", "--nproc-per-node",
                          "2", "--threads-per-rank", "1", "--db", url, "--format", "json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def rank_0_holds_the_store() -> bool:
            sql = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{dbname}' AND application_name = 'dlscale'"
            return len(marked_ranks(f"DLSCALE_TEST_MARK=spool-{os.getpid()}")) == 2 and own_server.sql(sql)[0][0] >= 1

        assert wait_until(lambda: rank_0_holds_the_store() or p.poll() is not None, 120), "the ranks never started"
        own_server.stop()  # while the ranks train: rank 0 cannot write its record at the end
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1, stderr
    rec = json.loads(stdout)
    assert rec["status"] == "ok" and rec["config"]["world_size"] == 2 and rec["metrics"]["throughput"] > 0
    last = stderr.strip().splitlines()[-1]
    assert [ln for ln in stderr.splitlines() if ln.startswith("error:")] == [last]
    assert last.startswith(f"error: run {rec['run_id']} did not reach results database {url}, which stayed unreachable")
    _delivered(cli, own_server, url, last, rec["run_id"])


def test_the_retry_window_is_read_from_the_environment(monkeypatch):
    from dlscale.stores.postgres import RETRY_ENV, retry_window

    monkeypatch.delenv(RETRY_ENV, raising=False)
    assert retry_window() == 300
    monkeypatch.setenv(RETRY_ENV, "12.5")
    assert retry_window() == 12.5
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(RETRY_ENV, bad)
        with pytest.raises(UsageError, match=f"{RETRY_ENV}='{bad}': give the seconds"):
            retry_window()


def test_each_database_has_its_own_spool_file(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    a = spool.spool_path("postgresql://alice@db.lab/dlscale")
    b = spool.spool_path("postgresql://alice@db2.lab/dlscale")
    assert a.parent == b.parent == tmp_path / "dlscale" / "spool" and a != b and a.name.startswith("dlscale-")


@pytest.mark.slow
def test_a_sweep_stops_when_its_database_stays_away(own_server, home, tmp_path):
    from dlscale import api
    from dlscale.errors import StoreUnavailable

    url = own_server.url(own_server.createdb())
    f = tmp_path / "sweep.yaml"
    f.write_text("name: away\nfixed: {model: tinycnn, image_size: 32, batch_size: 4, warmup_steps: 1, steps: 2, "
                 "device: cpu}\nmatrix:\n  seed: [0, 1]\n")
    done = []

    def after(res):  # the database goes away for good after the first point
        done.append(res)
        own_server.stop()

    with pytest.raises(StoreUnavailable, match="lost results database"):
        api.sweep(str(f), db=url, on_done=after)
    assert [r.status for r in done] == ["ok"]  # the second point is not recorded as rejected, in the spool or anywhere
    assert not spool.spool_path(url).exists() and not spool.pending()


def test_a_sweep_names_the_spool_a_point_kept_its_record_in(home, tmp_path):
    from dlscale.sweep import spec
    from dlscale.sweep.driver import run_point

    f = tmp_path / "sweep.yaml"
    f.write_text("name: kept\nfixed: {model: tinycnn, image_size: 32, steps: 2}\nmatrix:\n  seed: [0]\n")
    (point,) = spec.load(f).points
    printed = {"run_id": "20260101T000000-0000abcd", "status": "ok", "metrics": {"throughput": 1.0}, "units": {},
               "raw": {"spooled": {"at": "2026-01-01T00:00:00.000+00:00", "for": "postgresql://db/x", "reason": "lost"}}}
    as_the_point = [sys.executable, "-c", f"import json, sys; print(json.dumps({printed!r})); sys.exit(1)"]
    with Store.open(tmp_path / "r.db") as store:
        res = run_point(point, store, "kept", launcher=as_the_point)
        (kept,) = spool.pending()
        assert kept.spool == str(spool.spool_path(str(store.path)))
    assert res.status == "ok" and kept.run_id == printed["run_id"] and kept.reason == "lost"


def test_an_acceptance_check_whose_database_went_away_is_judged_from_the_spool(own_server, home, monkeypatch):
    """A check runs in its own process (accept/running/check_process.py): a run it could not store reaches the spool there,
    and the acceptance's process notes it (the command ends naming the spool) and judges it from the spool.
    The check's process is played here in this one (run_check, then the hand-over, then this process's
    notes forgotten as a process's end forgets them), the server going away once the node is counted."""
    from dlscale import system
    from dlscale.accept.running import check_process as bounded
    from dlscale.accept.plan import suite
    from dlscale.accept.plan import spec as specs
    from dlscale.distributed import faults

    url = own_server.url(own_server.createdb())
    sp = specs.builtin(level=1)
    planned = suite.PlannedCheck("inventory", {}, specs.validate(sp, "inventory", {}))
    collect = system.collect_cached

    def counted_then_the_server_goes():
        out = collect()
        own_server.stop()
        return out

    def the_checks_process(cmd, limit_s):
        job = json.loads(open(cmd[-1]).read())
        monkeypatch.setattr(system, "collect_cached", counted_then_the_server_goes)
        try:
            suite.run_check(planned, job["acceptance"], job["db"])
            faults.hand_over_spooled(os.path.dirname(cmd[-1]))
        finally:
            monkeypatch.setattr(system, "collect_cached", collect)
            spool.take_pending()  # gone with the check's process
            own_server.start()
        return 0, None, []

    monkeypatch.setattr(bounded, "_supervise", the_checks_process)
    ran = bounded.run(planned, sp, "accept-outage", url, 120.0)
    assert ran.problem is None, ran.tail
    (rec,) = ran.records
    assert rec.kind == "inventory" and rec.tag == "accept-outage" and rec.metrics["cpus"] == os.cpu_count()
    assert rec.raw["spooled"]["for"] == url
    (kept,) = spool.take_pending()
    assert kept.run_id == rec.run_id and kept.spool == str(spool.spool_path(url))
    with Store.open(url) as s:
        assert s.query(tag="accept-outage") == []  # not there: the push line says how to deliver it
