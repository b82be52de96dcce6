"""The results store: every run record, in an SQLite file (the default) or a shared PostgreSQL database.

No torch here: listing and showing results must start fast. ``Store.open(db)`` picks the backend
from ``db`` (or ``$DLSCALE_DB``): a ``postgresql://`` URL is a PostgreSQL database
(``dlscale.stores.postgres``), anything else a file path (``dlscale.stores.sqlite``). Both hold the
same schema, migrate alike and write each record in one transaction; callers see one API.

A record that cannot be written because a PostgreSQL server went away and stayed away is kept in
a local SQLite spool instead (``dlscale.stores.spool``), to be delivered by ``results push``.

Imported runs are stored once: the ``imports`` table holds one row per import key (an imported
record's config hash: its source file or reference dataset, format, row and the overrides given),
and ``insert_imports`` checks and writes those keys and the runs in one transaction under the
write lock, so processes importing the same file at once store exactly one copy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlscale.errors import StoreUnavailable, UsageError
from dlscale.log import warn
from dlscale.paths import DB_ENV, resolve_db_path
from dlscale.record import RunRecord, utc_now
from dlscale.stores import spool
from dlscale.stores.schema import COLUMNS, MIGRATIONS, PG_MIGRATIONS, SCHEMA_VERSION, to_record, to_row
from dlscale.stores.url import PG_SCHEMES, is_postgres_url, redact_text, url_scheme

__all__ = ["MIGRATIONS", "PG_MIGRATIONS", "SCHEMA_VERSION", "Store", "is_postgres_url"]

_SELECT = f"SELECT {','.join(COLUMNS)} FROM runs"


def _backend(db: str | os.PathLike | None, create: bool = True) -> Any:
    """The backend ``db`` (else ``$DLSCALE_DB``, else the default file) names, opened (a file that is
    not there is created, or with ``create`` false refused)."""
    target = os.fspath(db) if db else os.environ.get(DB_ENV, "")
    scheme = url_scheme(str(target))
    if scheme in PG_SCHEMES:
        from dlscale.stores.postgres import PostgresBackend

        return PostgresBackend.open(str(target))
    if scheme is not None:
        raise UsageError(f"results database {redact_text(str(target))}: unsupported URL scheme {scheme}://; "
                         f"pass a file path or a postgresql:// URL with --db or DLSCALE_DB")
    from dlscale.stores.sqlite import SqliteBackend

    return SqliteBackend.open(resolve_db_path(db), create)


class Store:
    """A handle on one results database. Use ``Store.open(db)``.

    ``db`` is a file path (SQLite) or ``postgresql://[user@]host[:port]/dbname[?options]``
    (PostgreSQL; ``?host=/run/postgresql`` reaches a Unix socket). Keep the password out of the
    URL: libpq reads it from ``PGPASSWORD``, ``~/.pgpass`` or the file ``PGPASSFILE`` names. A
    password that is in the URL anyway is never printed, logged or stored: messages show it as
    ``***``, ``path`` leaves it out, records have it masked, and it moves into this process's
    ``PGPASSWORD`` so the processes a sweep starts reach the same database.

    ``path`` reopens the same store (a file ``Path``, or the URL without its password);
    ``location`` names it in messages.
    """

    def __init__(self, backend: Any):
        self._backend = backend
        self.path: Path | str = backend.path
        self.location: str = backend.display

    # -- opening and schema -------------------------------------------------------------
    @classmethod
    def open(cls, db: str | os.PathLike | None = None, create: bool = True) -> "Store":
        """Open (creating and migrating if needed) the database; bad paths, bad URLs and unreachable
        servers are UsageErrors. ``create=False`` (the commands that only read) refuses a database
        file that is not there, where creating it would list a mistyped path as an empty store."""
        return cls(_backend(db, create))

    @classmethod
    def open_holding(cls, db: str | os.PathLike | None, run_id: str | None) -> "Store":
        """The open store that holds ``run_id``: the local spool where this process kept it there
        (``stores.spool``), else ``db``."""
        kept = spool.find(run_id) if run_id else None
        return cls.open(kept.spool if kept else db)

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._backend.kind

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return self._backend.schema_version

    # -- writing ------------------------------------------------------------------------
    def insert(self, rec: RunRecord) -> None:
        """Write one record (all of it, or nothing) in one transaction; an imported one also claims
        its import key if no run holds it yet. A server that went away and stayed away past its
        retry window does not lose the record: it goes to the local spool (``stores.spool``)."""
        b = self._backend

        def body(c: Any, _retrying: bool) -> None:
            c.execute(b.insert_run_sql(replace=True), to_row(rec))
            if rec.imported:
                c.execute(b.claim_import_sql, (rec.config_hash, rec.run_id))

        try:
            b.write(body)
        except StoreUnavailable as e:
            self._keep_in_spool(rec, str(e))

    def _keep_in_spool(self, rec: RunRecord, reason: str) -> None:
        """Write ``rec`` into this store's local spool (``raw.spooled`` says when, for which store and
        why) and note it, so the command ends saying where it is and how to deliver it."""
        path = spool.spool_path(str(self.path))
        rec.raw["spooled"] = {"at": utc_now(), "for": self.location, "reason": reason}
        with Store.open(path) as kept:
            kept.insert(rec)
        spool.note(spool.Spooled(rec.run_id, str(path), str(self.path), self.location, reason))
        warn(f"{reason}: run {rec.run_id} is kept in the local spool {path}")

    def _claim(self, c: Any, rec: RunRecord, retrying: bool) -> bool:
        """Claim ``rec``'s import key; after a lost connection a key this very run holds counts as
        claimed (the earlier attempt committed)."""
        if c.execute(self._backend.claim_import_sql, (rec.config_hash, rec.run_id)).rowcount:
            return True
        return retrying and c.execute("SELECT run_id FROM imports WHERE import_key = ?",
                                      (rec.config_hash,)).fetchone()[0] == rec.run_id

    def insert_imports(self, recs: Sequence[RunRecord]) -> list[RunRecord]:
        """Write the imported records whose import key (config hash) no run holds yet, and return them.

        The check and the writes are one transaction under the write lock, so of several processes
        importing the same file at once exactly one stores it; the others get an empty list.
        """
        b = self._backend

        def body(c: Any, retrying: bool) -> list[RunRecord]:
            new: list[RunRecord] = []
            for rec in recs:
                if not rec.imported:
                    raise ValueError(f"run {rec.run_id} is not marked imported; use Store.insert")
                if self._claim(c, rec, retrying):
                    c.execute(b.insert_run_sql(replace=True), to_row(rec))
                    new.append(rec)
            return new

        return b.write(body)

    def insert_new(self, recs: Sequence[RunRecord]) -> list[RunRecord]:
        """Copy in the records whose run id this store lacks (``dlscale results push``); returns them.

        Idempotent: a run already here is left as it is, and so is an imported run whose import
        key another run holds (the same file imported elsewhere). One transaction for all of them.
        """
        b = self._backend

        def body(c: Any, _retrying: bool) -> list[RunRecord]:
            new: list[RunRecord] = []
            for rec in recs:
                if rec.imported and c.execute("SELECT run_id FROM imports WHERE import_key = ?",
                                              (rec.config_hash,)).fetchone() not in (None, (rec.run_id,)):
                    continue
                if c.execute(b.insert_run_sql(replace=False), to_row(rec)).rowcount:
                    if rec.imported:
                        c.execute(b.claim_import_sql, (rec.config_hash, rec.run_id))
                    new.append(rec)
            return new

        return b.write(body)

    # -- reading ------------------------------------------------------------------------
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
            if not vals:
                where.append("1 = 0")
                return
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
        sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "")
        order = self._backend.text_order
        sql += f" ORDER BY {order('created_at')} {'DESC' if newest_first else 'ASC'}, {order('run_id')}"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [to_record(r) for r in self._backend.read(sql, args)]

    def get(self, run_id: str) -> RunRecord:
        """One record by its id or an unambiguous prefix of it."""
        rows = self._backend.read(
            f"{_SELECT} WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\' LIMIT 3",
            (run_id, run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"),
        )
        exact = [r for r in rows if r[0] == run_id]
        if exact:
            return to_record(exact[0])
        if not rows:
            raise UsageError(f"no run {run_id!r} in {self.location}; see `dlscale results list`")
        if len(rows) > 1:
            raise UsageError(f"run id prefix {run_id!r} matches several runs; give more characters")
        return to_record(rows[0])

    def count(self) -> int:
        return self._backend.read("SELECT COUNT(*) FROM runs")[0][0]

    def finished_config_hashes(self, kind: str | None = None) -> set[str]:
        """Config hashes of runs that finished (any status), e.g. for resuming a sweep."""
        sql, args = "SELECT DISTINCT config_hash FROM runs", []
        if kind:
            sql += " WHERE kind = ?"
            args.append(kind)
        return {r[0] for r in self._backend.read(sql, args)}
