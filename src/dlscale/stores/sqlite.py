"""The embedded backend: every record in one SQLite file on this machine.

Each record is written in one ``BEGIN IMMEDIATE`` transaction; WAL mode and a busy timeout let
several processes write at once without loss. The schema version is SQLite's ``user_version``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dlscale.errors import UsageError
from dlscale.stores.schema import COLUMNS, MIGRATIONS, SCHEMA_VERSION, statements

T = TypeVar("T")
_HINT = "pass --db PATH or set DLSCALE_DB to a writable file"


def _check_path(path: Path) -> None:
    """Refuse, as a usage error, a path that cannot hold a database, before SQLite tries."""
    if path.exists() and path.is_dir():
        raise UsageError(f"results database {path} is a directory; {_HINT}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the directory for results database {path}: {e.strerror}; {_HINT}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"results database {path} is not writable; {_HINT}")
    if not path.exists() and not os.access(path.parent, os.W_OK):
        raise UsageError(f"cannot create results database in {path.parent} (not writable); {_HINT}")


class SqliteBackend:
    """One SQLite file: ``path`` reopens it, ``display`` names it in messages."""

    kind = "sqlite"

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self.display = str(path)
        self._conn = conn

    @classmethod
    def open(cls, path: Path, create: bool = True) -> "SqliteBackend":
        """Open (creating, unless ``create`` is false, and migrating if needed) the file; bad paths,
        and with ``create`` false a file that is not there, are UsageErrors."""
        if not create and not path.exists():
            raise UsageError(f"no results database at {path}: check --db (or DLSCALE_DB); a command that "
                             "measures (train, micro, ...) creates it")
        _check_path(path)
        try:
            conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 60000")
            backend = cls(path, conn)
            backend._migrate()
        except sqlite3.DatabaseError as e:
            raise UsageError(f"cannot use results database {path}: {e}; {_HINT}") from None
        return backend

    def close(self) -> None:
        self._conn.close()

    @property
    def schema_version(self) -> int:
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        if self._conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            self._retry(lambda: self._conn.execute("PRAGMA journal_mode=WAL"))
        if self.schema_version >= SCHEMA_VERSION:
            if self.schema_version > SCHEMA_VERSION:
                raise UsageError(
                    f"results database {self.path} has schema version {self.schema_version}, newer than "
                    f"this dlscale ({SCHEMA_VERSION}); upgrade dlscale"
                )
            return

        def migrate(c: sqlite3.Connection, _retrying: bool) -> None:
            # Re-read inside the write lock: another process may have migrated meanwhile.
            for i in range(self.schema_version, SCHEMA_VERSION):
                for stmt in statements(MIGRATIONS[i]):
                    c.execute(stmt)
            c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self.write(migrate)

    # -- transactions -------------------------------------------------------------------
    def _retry(self, fn: Callable[[], T], attempts: int = 50) -> T | None:
        for i in range(attempts):
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e) or i == attempts - 1:
                    raise
                time.sleep(0.05 * (1 + i % 10))
        return None

    def write(self, body: Callable[[sqlite3.Connection, bool], T]) -> T:
        """Run ``body(connection, retrying=False)`` in one transaction under the write lock."""
        self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
        try:
            result = body(self._conn, False)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._retry(lambda: self._conn.execute("COMMIT"))
        return result

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return self._conn.execute(sql, tuple(args)).fetchall()

    # -- dialect ------------------------------------------------------------------------
    @staticmethod
    def insert_run_sql(replace: bool) -> str:
        """Insert one run; ``replace`` overwrites a run of the same id, else the row is left alone."""
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        return f"{verb} INTO runs ({','.join(COLUMNS)}) VALUES ({','.join('?' * len(COLUMNS))})"

    claim_import_sql = "INSERT OR IGNORE INTO imports (import_key, run_id) VALUES (?, ?)"

    @staticmethod
    def text_order(col: str) -> str:
        return col  # SQLite compares text by bytes already
