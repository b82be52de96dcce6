"""The results store: every run record in one SQLite file.

No torch here: listing and showing results must start fast. Each record is written in one
transaction; WAL mode and a busy timeout let several processes write at once without loss.
The schema version is SQLite's ``user_version``; ``MIGRATIONS[i]`` takes version i to i+1.

Imported runs are stored once: the ``imports`` table holds one row per import key (an imported
record's config hash: its source file or reference dataset, format, row and the overrides given),
and ``insert_imports`` checks and writes those keys and the runs in one ``BEGIN IMMEDIATE``
transaction, so processes importing the same file at once store exactly one copy.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.paths import resolve_db_path
from dlscale.record import RunRecord

_V1 = """
CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    created_at      TEXT NOT NULL,
    finished_at     TEXT,
    kind            TEXT NOT NULL,
    workload        TEXT NOT NULL,
    status          TEXT NOT NULL,
    tag             TEXT,
    hostname        TEXT,
    imported        INTEGER NOT NULL DEFAULT 0,
    config_hash     TEXT NOT NULL,
    dlscale_version TEXT,
    config_json     TEXT NOT NULL,
    system_json     TEXT NOT NULL,
    metrics_json    TEXT NOT NULL,
    units_json      TEXT NOT NULL,
    raw_json        TEXT NOT NULL,
    warnings_json   TEXT NOT NULL DEFAULT '[]',
    error           TEXT
);
CREATE INDEX runs_tag ON runs(tag);
CREATE INDEX runs_workload ON runs(workload);
CREATE INDEX runs_kind ON runs(kind);
CREATE INDEX runs_created ON runs(created_at);
CREATE INDEX runs_config_hash ON runs(config_hash);
"""

# Version 2: the import keys. Existing imported runs register theirs, the oldest run of a key first;
# duplicates stored before version 2 stay (nothing is deleted), but no new copy can be added.
_V2 = """
CREATE TABLE imports (
    import_key TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL
);
INSERT OR IGNORE INTO imports (import_key, run_id)
    SELECT config_hash, run_id FROM runs WHERE imported = 1 ORDER BY created_at, run_id
"""

# MIGRATIONS[i] moves a database from schema version i to i + 1.
MIGRATIONS: tuple[str, ...] = (_V1, _V2)
SCHEMA_VERSION = len(MIGRATIONS)

_COLUMNS = (
    "run_id", "created_at", "finished_at", "kind", "workload", "status", "tag", "hostname",
    "imported", "config_hash", "dlscale_version", "config_json", "system_json", "metrics_json",
    "units_json", "raw_json", "warnings_json", "error",
)


def _dumps(x: Any) -> str:
    return json.dumps(x, separators=(",", ":"), default=str, allow_nan=True)


class Store:
    """A handle on one results database. Use ``Store.open(path)``."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self._conn = conn

    # -- opening and schema -------------------------------------------------------------
    @classmethod
    def open(cls, db: str | os.PathLike | None = None) -> "Store":
        """Open (creating and migrating if needed) the database; bad paths are UsageErrors."""
        path = resolve_db_path(db)
        hint = "pass --db PATH or set DLSCALE_DB to a writable file"
        if path.exists() and path.is_dir():
            raise UsageError(f"results database {path} is a directory; {hint}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create the directory for results database {path}: {e.strerror}; {hint}") from None
        if path.exists() and not os.access(path, os.W_OK):
            raise UsageError(f"results database {path} is not writable; {hint}")
        if not path.exists() and not os.access(path.parent, os.W_OK):
            raise UsageError(f"cannot create results database in {path.parent} (not writable); {hint}")
        try:
            conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 60000")
            store = cls(path, conn)
            store._migrate()
        except sqlite3.DatabaseError as e:
            raise UsageError(f"cannot use results database {path}: {e}; {hint}") from None
        return store

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        with self._transaction():
            # Re-read inside the write lock: another process may have migrated meanwhile.
            version = self.schema_version
            for i in range(version, SCHEMA_VERSION):
                for stmt in filter(None, (s.strip() for s in MIGRATIONS[i].split(";"))):
                    self._conn.execute(stmt)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- transactions -------------------------------------------------------------------
    def _retry(self, fn, attempts: int = 50):
        for i in range(attempts):
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e) or i == attempts - 1:
                    raise
                time.sleep(0.05 * (1 + i % 10))
        return None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._retry(lambda: self._conn.execute("COMMIT"))

    # -- writing ------------------------------------------------------------------------
    @staticmethod
    def _write(c: sqlite3.Connection, rec: RunRecord) -> None:
        row = (
            rec.run_id, rec.created_at, rec.finished_at, rec.kind, rec.workload, rec.status,
            rec.tag, rec.hostname, int(rec.imported), rec.config_hash, rec.dlscale_version,
            _dumps(rec.config), _dumps(rec.system), _dumps(rec.metrics), _dumps(rec.units),
            _dumps(rec.raw), _dumps(rec.warnings), rec.error,
        )
        placeholders = ",".join("?" * len(_COLUMNS))
        c.execute(f"INSERT OR REPLACE INTO runs ({','.join(_COLUMNS)}) VALUES ({placeholders})", row)

    def insert(self, rec: RunRecord) -> None:
        """Write one record (all of it, or nothing) in one transaction; an imported one also claims
        its import key if no run holds it yet."""
        with self._transaction() as c:
            self._write(c, rec)
            if rec.imported:
                c.execute("INSERT OR IGNORE INTO imports (import_key, run_id) VALUES (?, ?)",
                          (rec.config_hash, rec.run_id))

    def insert_imports(self, recs: Sequence[RunRecord]) -> list[RunRecord]:
        """Write the imported records whose import key (config hash) no run holds yet, and return them.

        The check and the writes are one transaction under the write lock, so of several processes
        importing the same file at once exactly one stores it; the others get an empty list.
        """
        new: list[RunRecord] = []
        with self._transaction() as c:
            for rec in recs:
                if not rec.imported:
                    raise ValueError(f"run {rec.run_id} is not marked imported; use Store.insert")
                claimed = c.execute("INSERT OR IGNORE INTO imports (import_key, run_id) VALUES (?, ?)",
                                    (rec.config_hash, rec.run_id)).rowcount
                if claimed:
                    self._write(c, rec)
                    new.append(rec)
        return new

    # -- reading ------------------------------------------------------------------------
    @staticmethod
    def _to_record(row: sqlite3.Row | Sequence[Any]) -> RunRecord:
        d = dict(zip(_COLUMNS, row))
        return RunRecord(
            run_id=d["run_id"], created_at=d["created_at"], finished_at=d["finished_at"],
            kind=d["kind"], workload=d["workload"], status=d["status"], tag=d["tag"],
            imported=bool(d["imported"]), dlscale_version=d["dlscale_version"],
            config=json.loads(d["config_json"]), system=json.loads(d["system_json"]),
            metrics=json.loads(d["metrics_json"]), units=json.loads(d["units_json"]),
            raw=json.loads(d["raw_json"]), warnings=json.loads(d["warnings_json"]), error=d["error"],
        )

    def query(
        self,
        *,
        tag: str | Sequence[str] | None = None,
        workload: str | Sequence[str] | None = None,
        kind: str | Sequence[str] | None = None,
        status: str | None = None,
        run_ids: Sequence[str] | None = None,
        imported: bool | None = None,
        limit: int | None = None,
        newest_first: bool = True,
    ) -> list[RunRecord]:
        """Records matching every filter given (a list means any of its values)."""
        where: list[str] = []
        args: list[Any] = []

        def any_of(col: str, val: str | Sequence[str] | None) -> None:
            if val is None:
                return
            vals = [val] if isinstance(val, str) else list(val)
            where.append(f"{col} IN ({','.join('?' * len(vals))})")
            args.extend(vals)

        any_of("tag", tag)
        any_of("workload", workload)
        any_of("kind", kind)
        any_of("status", status)
        any_of("run_id", run_ids)
        if imported is not None:
            where.append("imported = ?")
            args.append(int(imported))
        sql = f"SELECT {','.join(_COLUMNS)} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY created_at {'DESC' if newest_first else 'ASC'}, run_id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [self._to_record(r) for r in self._conn.execute(sql, args)]

    def get(self, run_id: str) -> RunRecord:
        """One record by its id or an unambiguous prefix of it."""
        rows = self._conn.execute(
            f"SELECT {','.join(_COLUMNS)} FROM runs WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\' LIMIT 3",
            (run_id, run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"),
        ).fetchall()
        exact = [r for r in rows if r[0] == run_id]
        if exact:
            return self._to_record(exact[0])
        if not rows:
            raise UsageError(f"no run {run_id!r} in {self.path}; see `dlscale results list`")
        if len(rows) > 1:
            raise UsageError(f"run id prefix {run_id!r} matches several runs; give more characters")
        return self._to_record(rows[0])

    def count(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    def finished_config_hashes(self, kind: str | None = None) -> set[str]:
        """Config hashes of runs that finished (any status), e.g. for resuming a sweep."""
        sql, args = "SELECT DISTINCT config_hash FROM runs", []
        if kind:
            sql += " WHERE kind = ?"
            args.append(kind)
        return {r[0] for r in self._conn.execute(sql, args)}
