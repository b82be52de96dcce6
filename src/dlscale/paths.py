"""Where dlscale keeps its files by default, and the one check of a directory it is told to write."""

from __future__ import annotations

import os
from pathlib import Path

DB_ENV = "DLSCALE_DB"


def data_dir() -> Path:
    """The user's data directory for dlscale (XDG_DATA_HOME, else ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "dlscale"


def default_db_path() -> Path:
    """``$DLSCALE_DB`` if set, else ``<data dir>/results.db``."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    return data_dir() / "results.db"


def beside_db(db_path: str | os.PathLike, what: str) -> Path:
    """dlscale's folder ``what`` beside a file database (``<its dir>/WHAT``: the default one's is in the
    data directory); for a server database (postgresql://...), in the data directory."""
    path = str(db_path)
    if "://" not in path:
        return Path(path).expanduser().resolve().parent / what
    return data_dir() / what


def make_dir(path: str | os.PathLike) -> Path:
    """``path`` as a directory, made if missing (with its parents); a UsageError naming it when it is a
    file or cannot be made."""
    from dlscale.errors import UsageError

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{p} is a file, not a directory: give a directory to write into (new or existing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create {p}: {e.strerror}; give a directory you can write to") from None
    return p


def check_writable_file(path: str | os.PathLike, option: str) -> None:
    """A file a run will write when it is done or as it goes (made, or appended to): a UsageError
    naming ``option`` now, before any work, where it is a directory, its directory is missing, or
    either cannot be written."""
    from dlscale.errors import UsageError

    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {p} is a directory: give a file to write (e.g. {p / 'mlperf.log'})")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {p}: no directory {parent}; create it or give another path")
    if p.exists() and not os.access(p, os.W_OK) or not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {p}: {'the file' if p.exists() else f'the directory {parent}'} is not writable; "
                         "give a path you can write")


def resolve_db_path(db: str | os.PathLike | None) -> Path:
    """An explicit ``--db`` wins over ``$DLSCALE_DB``, which wins over the default."""
    if db:
        return Path(db).expanduser()
    return default_db_path()
