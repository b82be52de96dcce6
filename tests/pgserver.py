"""A throwaway PostgreSQL server for the store tests: ``initdb`` and ``pg_ctl`` on a temporary
directory, reachable only through a Unix socket there (``listen_addresses=''``), stopped and removed
at the end of the session.

As root the server runs as the ``postgres`` user (PostgreSQL refuses root). Local connections are
trusted, except for the role ``alice``, who must give her password (``ALICE_PASSWORD``, checked by
scram-sha-256): that is how the tests see a password in a URL really used and never shown.

Test modules import the fixtures: ``from pgserver import pg_server, pg_url``. Where the server
binaries or psycopg are missing the tests skip and say why, unless ``DLSCALE_REQUIRE_POSTGRES=1``
(CI), where they fail.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE_ENV = "DLSCALE_REQUIRE_POSTGRES"
ALICE_PASSWORD = "pw-Xq7-never-shown"


def bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: next to ``initdb`` on PATH, else Debian's newest."""
    on_path = shutil.which("initdb")
    if on_path:
        d = Path(on_path).resolve().parent
        if (d / "pg_ctl").exists():
            return d
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    """Why no test server can run here, or None."""
    if bin_dir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return None


def need_postgres() -> None:
    from conftest import need_system

    need_system("a PostgreSQL server (Debian's postgresql package)", unavailable_reason(), REQUIRE_ENV)


@dataclass
class PgServer:
    """One running server: ``url(db)`` names a database on it."""

    bindir: Path
    base: Path
    users: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def sock(self) -> Path:
        return self.base / "sock"

    def url(self, dbname: str, user: str = "postgres", password: str | None = None) -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@/{dbname}?host={self.sock}"

    def _run(self, *args: str) -> str:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
        return p.stdout

    def _pg_ctl(self, action: str) -> None:
        opts = f"-c listen_addresses='' -c unix_socket_directories={self.sock} -c fsync=off -c max_connections=60"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "log"), "-w", "-t", "60",
                  "-m", "fast", "-o", opts, action)

    def start(self) -> None:
        self._pg_ctl("start")

    def restart(self) -> None:
        """Stop (fast: connections are cut) and start again, as an administrator's restart does."""
        self._pg_ctl("restart")

    def stop(self) -> None:
        self._pg_ctl("stop")

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as c:
            cur = c.execute(statement)
            return cur.fetchall() if cur.description else []

    def createdb(self, owner: str = "postgres") -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.sql(f"CREATE DATABASE {name} OWNER {owner}")
        return name


def start_server() -> PgServer:
    """initdb a fresh cluster in a new temporary directory and start it."""
    bindir = bin_dir()
    assert bindir is not None
    base = Path(tempfile.mkdtemp(prefix="dlscale-pg-", dir="/tmp" if os.geteuid() == 0 else None))
    server = PgServer(bindir, base)
    server.sock.mkdir()
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        for p in (base, server.sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    server._run("initdb", "-D", str(server.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                "--locale=C", "--no-sync")
    hba = server.data / "pg_hba.conf"
    hba.write_text("local all alice scram-sha-256\nlocal all all trust\n")
    server.start()
    server.sql(f"CREATE ROLE alice LOGIN CREATEDB PASSWORD '{ALICE_PASSWORD}'")
    return server


_SHARED: list[PgServer] = []


@pytest.fixture(scope="session")
def pg_server():
    """The session's server, started on first use; shared by every module importing this fixture."""
    need_postgres()
    if not _SHARED:
        _SHARED.append(start_server())
    server = _SHARED[0]
    server.users += 1
    yield server
    server.users -= 1
    if server.users == 0:
        _SHARED.clear()
        try:
            server.stop()
        finally:
            shutil.rmtree(server.base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server) -> str:
    """A URL of a fresh, empty database on the session's server (no password: trusted local role)."""
    return pg_server.url(pg_server.createdb())
