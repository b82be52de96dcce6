"""The local spool: where a record goes when the shared store it was meant for stays away.

A run that finished while its PostgreSQL server went away, and stayed away past the retry window
(``StoreUnavailable``), must not be thrown away with its figures. ``Store.insert`` writes such a
record into a SQLite store under the dlscale data directory, one file per database it was meant
for (``spool_path``: ``spool/<database>-<hash of its URL>.db``), with ``raw.spooled`` saying when,
for which database and why, and notes it here (``note``): this module names and remembers, the
store writes. The command goes on (the CLI prints the figures as always) and then exits 1 with one
line naming the spool and the command that delivers it later, ``dlscale results push --db SPOOL
--to URL`` (by run id: pushing twice adds nothing). A distributed job's rank 0 hands its notes to
the launcher through the job directory (``pending``/``note``). No torch here.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dlscale.paths import data_dir

SPOOL_DIR = "spool"


@dataclass(frozen=True)
class Spooled:
    """One record kept in a spool instead of the store it was meant for."""

    run_id: str
    spool: str  # the spool file
    destination: str  # the store it was meant for: its URL without password (``Store.path``)
    shown: str  # the same as shown in messages (password masked)
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def push_command(self) -> str:
        return f"dlscale results push --db {self.spool} --to '{self.destination}'"


_PENDING: list[Spooled] = []


def spool_path(destination: str) -> Path:
    """The spool file of the store at ``destination`` (its URL without password)."""
    name = Path(urlsplit(destination).path).name or "dlscale"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40]
    return data_dir() / SPOOL_DIR / f"{slug}-{hashlib.sha256(destination.encode()).hexdigest()[:10]}.db"


def note(entry: Spooled | dict[str, Any]) -> None:
    """Remember a spooled record (one this process kept, or a rank of its job did)."""
    entry = entry if isinstance(entry, Spooled) else Spooled(**entry)
    if entry not in _PENDING:
        _PENDING.append(entry)


def pending() -> list[Spooled]:
    """The records spooled so far in this process (and noted from its job's ranks)."""
    return list(_PENDING)


def take_pending() -> list[Spooled]:
    """``pending()``, forgetting them: the CLI says once, at its end, what is waiting for delivery."""
    out = list(_PENDING)
    _PENDING.clear()
    return out


def find(run_id: str) -> Spooled | None:
    """The spooled record of ``run_id`` noted in this process, if any."""
    return next((e for e in _PENDING if e.run_id == run_id), None)


def summary(entries: list[Spooled]) -> str:
    """One line: which runs did not reach which store, where they are, and how to deliver them."""
    first = entries[0]
    runs = f"run {first.run_id}" if len(entries) == 1 else f"{len(entries)} runs ({first.run_id}, ...)"
    spools = sorted({e.spool for e in entries})
    where = spools[0] if len(spools) == 1 else f"{spools[0]} (and {len(spools) - 1} more spool files)"
    return (f"{runs} did not reach results database {first.shown}, which stayed unreachable; kept in the "
            f"local spool {where}: deliver with `{first.push_command()}` once it is back")
