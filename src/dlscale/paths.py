"""Where dlscale keeps its files by default."""

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


def resolve_db_path(db: str | os.PathLike | None) -> Path:
    """An explicit ``--db`` wins over ``$DLSCALE_DB``, which wins over the default."""
    if db:
        return Path(db).expanduser()
    return default_db_path()
