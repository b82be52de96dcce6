"""The shared backend: a PostgreSQL database a team (or a cluster's nodes) writes into.

Same tables and schema versions as SQLite (the version lives in the one-row table
``dlscale_schema``; migrations run under an advisory lock, so processes opening a fresh database
at once migrate it once). Each record is one transaction. A server that goes away after it was
reached (a restart, a failover) delays reads and writes: the connection is reopened with
exponential backoff for up to ``retry_s`` seconds (``DLSCALE_DB_RETRY_S``, default 300; said once
when it begins, at doubling times into it and when it ends: ``_Outage``) and the
whole transaction runs again, which is safe because every write is idempotent by run id and import
key; past that a ``StoreUnavailable`` is raised (``Store.insert`` then keeps the record in the local
spool). A server that cannot be reached when the store is opened is a one-line ``UsageError`` at
once (a wrong URL should not wait).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dlscale.errors import StoreUnavailable, UsageError
from dlscale.stores.schema import COLUMNS, PG_MIGRATIONS, SCHEMA_VERSION, statements
from dlscale.stores.url import redact_text, split_password

T = TypeVar("T")
log = logging.getLogger("dlscale.store")

RETRY_ENV = "DLSCALE_DB_RETRY_S"
DEFAULT_RETRY_S = 300.0
_LOCK_KEY = 0x646C7363616C65  # "dlscale": the advisory lock migrations take
# Messages of a server that is there but not accepting connections for a moment.
_TRANSIENT = ("starting up", "shutting down", "in recovery mode", "not yet accepting connections")
# SQLSTATE classes worth running a transaction again for: connection lost, rolled back by the
# server (serialization, deadlock), operator intervention (shutdown, restart).
_RETRY_STATES = ("08", "40", "57P")
_HINT = ("check the URL and that the server runs; put a password in PGPASSWORD or a password file "
         "(~/.pgpass, PGPASSFILE), not in the URL")


def retry_window() -> float:
    """Seconds a server lost after it was reached is waited for: ``$DLSCALE_DB_RETRY_S``, else 300."""
    text = os.environ.get(RETRY_ENV, "").strip()
    if not text:
        return DEFAULT_RETRY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UsageError(f"{RETRY_ENV}={text!r}: give the seconds a lost results database is waited for (>= 0)")
    return value


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


class _Outage:
    """What a wait for the server says on stderr: the loss once, with how long it is waited for; then a
    line at doubling times into it (``FIRST_NOTE_S``, twice that, ...), not one per retry (a retry every
    5 s for 5 minutes would be 60 identical lines); and that it is back, if it was said to be away."""

    FIRST_NOTE_S = 10.0

    def __init__(self, what: str, window_s: float):
        self.what, self.window_s = what, window_s
        self.start: float | None = None
        self.next_note = self.FIRST_NOTE_S

    def retrying(self, msg: str) -> None:
        now = time.monotonic()
        if self.start is None:
            self.start = now
            log.warning("%s (%s); retrying for up to %g s", self.what, msg, self.window_s)
        elif now - self.start >= self.next_note:
            log.warning("%s: still away after %.0f s (%s); retrying for up to %g s", self.what, now - self.start,
                        msg, self.window_s)
            while self.next_note <= now - self.start:
                self.next_note *= 2

    def over(self) -> None:
        if self.start is not None:
            log.warning("%s: back after %.0f s", self.what, time.monotonic() - self.start)
            self.start, self.next_note = None, self.FIRST_NOTE_S


class _Tx:
    """A connection inside a transaction, taking the store's ``?`` placeholders."""

    def __init__(self, conn: Any):
        self._conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self._conn.execute(sql.replace("?", "%s"), tuple(args) or None)


class PostgresBackend:
    """One PostgreSQL database named by a ``postgresql://`` URL.

    ``path`` is the URL without any password (it reopens the store: sweeps hand it to the
    processes they start, whose command lines anyone on the machine can read); ``display`` is the
    URL with the password shown as ``***``. A password given in the URL is taken out of it and put
    into this process's ``PGPASSWORD``, which child processes inherit.
    """

    kind = "postgresql"
    open_retry_s = 30.0  # how long a server that is starting up or shutting down is waited for at open

    def __init__(self, url: str):
        self.path, self._password = split_password(url)
        self.display = redact_text(url)
        self._conn: Any = None
        self.retry_s = retry_window()  # how long a server lost in the middle of a run is waited for

    @classmethod
    def open(cls, url: str) -> "PostgresBackend":
        """Connect, create or migrate the schema; an unreachable server or a bad URL is a UsageError."""
        backend = cls(url)
        backend._conn = backend._connect_at_open()
        if backend._password is not None:  # it works: the processes this one starts use it too
            os.environ["PGPASSWORD"] = backend._password
        backend._migrate()
        return backend

    # -- connections --------------------------------------------------------------------
    def _connect_once(self) -> Any:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(self.path)
        extra: dict[str, Any] = {}
        if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
            extra["connect_timeout"] = 10  # an unroutable host fails in seconds, not minutes
        if "application_name" not in given and not os.environ.get("PGAPPNAME"):
            extra["application_name"] = "dlscale"
        if self._password is not None:
            extra["password"] = self._password
        return psycopg.connect(self.path, autocommit=True, **extra)

    def _message(self, e: BaseException) -> str:
        """The error's text on one line, without the password and without the quoted statement."""
        text = _one_line(redact_text(str(e).split("\nLINE ")[0]) or type(e).__name__)
        return text.replace(self._password, "***") if self._password else text

    def _connect_at_open(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise UsageError(f"results database {self.display} is PostgreSQL, which needs psycopg: "
                             f"pip install 'psycopg[binary]'") from None
        deadline, delay = time.monotonic() + self.open_retry_s, 0.1
        outage = _Outage(f"results database {self.display} is not ready", self.open_retry_s)
        while True:
            try:
                conn = self._connect_once()
                outage.over()
                return conn
            except psycopg.Error as e:
                msg = self._message(e)
                if not any(t in msg for t in _TRANSIENT) or time.monotonic() + delay > deadline:
                    raise UsageError(f"cannot use results database {self.display}: {msg}; {_HINT}") from None
                outage.retrying(msg)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- transactions -------------------------------------------------------------------
    def _retryable(self, e: BaseException) -> bool:
        state = getattr(e, "sqlstate", None) or ""
        lost = self._conn is None or self._conn.closed or self._conn.broken
        return lost or state.startswith(_RETRY_STATES)

    def _run(self, fn: Callable[[Any, bool], T]) -> T:
        """``fn(connection, retrying)``, run again on a fresh connection while the server is away."""
        import psycopg

        deadline, delay, retrying = None, 0.1, False
        outage = _Outage(f"lost results database {self.display}", self.retry_s)
        while True:
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = self._connect_once()
                out = fn(self._conn, retrying)
                outage.over()
                return out
            except psycopg.Error as e:
                msg = self._message(e)
                if not self._retryable(e):
                    raise UsageError(f"results database {self.display}: {msg}") from None
                deadline = deadline or time.monotonic() + self.retry_s
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(f"lost results database {self.display} and could not get it back in "
                                           f"{self.retry_s:g} s: {msg}") from None
                outage.retrying(msg)
                time.sleep(delay)
                delay, retrying = min(delay * 2, 5.0), True

    def write(self, body: Callable[[_Tx, bool], T]) -> T:
        """Run ``body(tx, retrying)`` in one transaction; after a lost connection it runs again from
        the start (``retrying`` True: the earlier attempt may have committed before the loss)."""

        def attempt(conn: Any, retrying: bool) -> T:
            with conn.transaction():
                return body(_Tx(conn), retrying)

        return self._run(attempt)

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return self._run(lambda conn, _: _Tx(conn).execute(sql, args).fetchall())

    # -- schema -------------------------------------------------------------------------
    @staticmethod
    def _version(tx: _Tx) -> int:
        if tx.execute("SELECT to_regclass('dlscale_schema')").fetchone()[0] is None:
            return 0
        return tx.execute("SELECT COALESCE(MAX(version), 0) FROM dlscale_schema").fetchone()[0]

    @property
    def schema_version(self) -> int:
        return self._run(lambda conn, _: self._version(_Tx(conn)))

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise UsageError(f"results database {self.display} has schema version {version}, newer than "
                             f"this dlscale ({SCHEMA_VERSION}); upgrade dlscale")
        if version == SCHEMA_VERSION:
            return

        def migrate(conn: Any, _retrying: bool) -> None:
            # A session lock taken before the transaction: a transaction begun after another
            # process's migration committed sees its tables (inside one, cached names could be stale).
            conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
            try:
                with conn.transaction():
                    tx = _Tx(conn)
                    for i in range(self._version(tx), SCHEMA_VERSION):  # re-read under the lock
                        for stmt in statements(PG_MIGRATIONS[i]):
                            tx.execute(stmt)
                        tx.execute("CREATE TABLE IF NOT EXISTS dlscale_schema (version INTEGER NOT NULL)")
                        tx.execute("DELETE FROM dlscale_schema")
                        tx.execute("INSERT INTO dlscale_schema (version) VALUES (?)", (i + 1,))
            finally:
                if not conn.broken:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))

        self._run(migrate)

    # -- dialect ------------------------------------------------------------------------
    @staticmethod
    def insert_run_sql(replace: bool) -> str:
        """Insert one run; ``replace`` overwrites a run of the same id, else the row is left alone."""
        head = f"INSERT INTO runs ({','.join(COLUMNS)}) VALUES ({','.join('?' * len(COLUMNS))}) ON CONFLICT (run_id) DO "
        if not replace:
            return head + "NOTHING"
        return head + "UPDATE SET " + ",".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS[1:])

    claim_import_sql = "INSERT INTO imports (import_key, run_id) VALUES (?, ?) ON CONFLICT DO NOTHING"

    @staticmethod
    def text_order(col: str) -> str:
        return f'{col} COLLATE "C"'  # byte order, as in SQLite, whatever the database's locale
