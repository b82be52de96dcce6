"""The results schema, in both SQL dialects, and the mapping between a row and a ``RunRecord``.

Both backends hold the same tables and columns (JSON parts as text, so NaN survives the trip) and
number their schema versions alike: ``MIGRATIONS[i]`` (SQLite) and ``PG_MIGRATIONS[i]``
(PostgreSQL) take version i to i + 1. A new version adds one entry to each tuple.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dlscale.record import RunRecord
from dlscale.stores.url import redact_text

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

# The same version 2 in PostgreSQL: one row per key chosen explicitly (the oldest run), byte order.
_PG_V2 = """
CREATE TABLE imports (
    import_key TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL
);
INSERT INTO imports (import_key, run_id)
    SELECT DISTINCT ON (config_hash) config_hash, run_id FROM runs WHERE imported = 1
    ORDER BY config_hash, created_at COLLATE "C", run_id COLLATE "C"
    ON CONFLICT DO NOTHING
"""

# MIGRATIONS[i] moves a database from schema version i to i + 1.
MIGRATIONS: tuple[str, ...] = (_V1, _V2)
PG_MIGRATIONS: tuple[str, ...] = (_V1, _PG_V2)
SCHEMA_VERSION = len(MIGRATIONS)
assert len(PG_MIGRATIONS) == SCHEMA_VERSION, "every schema version needs both dialects"

COLUMNS = (
    "run_id", "created_at", "finished_at", "kind", "workload", "status", "tag", "hostname",
    "imported", "config_hash", "dlscale_version", "config_json", "system_json", "metrics_json",
    "units_json", "raw_json", "warnings_json", "error",
)


def statements(migration: str) -> list[str]:
    """The statements of one migration script (they hold no ``;`` inside)."""
    return [s.strip() for s in migration.split(";") if s.strip()]


def _dumps(x: Any) -> str:
    return redact_text(json.dumps(x, separators=(",", ":"), default=str, allow_nan=True))


def to_row(rec: RunRecord) -> tuple[Any, ...]:
    """The row of ``rec`` in ``COLUMNS`` order. A database URL's password anywhere in the record
    (e.g. the command line in ``system.argv``) is stored as ``***``: records are shared."""
    return (
        rec.run_id, rec.created_at, rec.finished_at, rec.kind, rec.workload, rec.status,
        rec.tag, rec.hostname, int(rec.imported), rec.config_hash, rec.dlscale_version,
        _dumps(rec.config), _dumps(rec.system), _dumps(rec.metrics), _dumps(rec.units),
        _dumps(rec.raw), _dumps(rec.warnings), None if rec.error is None else redact_text(rec.error),
    )


def to_record(row: Sequence[Any]) -> RunRecord:
    """The record of a row read in ``COLUMNS`` order."""
    d = dict(zip(COLUMNS, row))
    return RunRecord(
        run_id=d["run_id"], created_at=d["created_at"], finished_at=d["finished_at"],
        kind=d["kind"], workload=d["workload"], status=d["status"], tag=d["tag"],
        imported=bool(d["imported"]), dlscale_version=d["dlscale_version"],
        config=json.loads(d["config_json"]), system=json.loads(d["system_json"]),
        metrics=json.loads(d["metrics_json"]), units=json.loads(d["units_json"]),
        raw=json.loads(d["raw_json"]), warnings=json.loads(d["warnings_json"]), error=d["error"],
    )
