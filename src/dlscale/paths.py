"""Where dlscale keeps its files by default, the one check of a directory it is told to write, and the
one way a command writes a file it is told to write (``--out``, ``--output``, ``--mlperf-log``).

A file a command is told to write never replaces the database the command reads (nor its ``-wal``,
``-shm`` or ``-journal`` companion), whatever it is told, nor any SQLite database; it replaces
another existing file only when the user says so (``--force``); and it is written whole or not at
all: into a temporary file beside it, then renamed over it (``write_atomic``, ``atomic_target``),
so an interrupted command leaves the old file or the new one, never half of either.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
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


SQLITE_MAGIC = b"SQLite format 3\x00"
DB_COMPANIONS = ("", "-wal", "-shm", "-journal")  # SQLite's own files beside a database


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same resolved path, or (both there) the same inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _is_sqlite(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def check_output(path: str | os.PathLike, option: str, *, db: str | os.PathLike | None = None,
                 force: bool = False, append: bool = False) -> Path:
    """A file a command is told to write, checked before any work (the module doc): a UsageError naming
    ``option`` where it is the database ``db`` (``--db``, else ``$DLSCALE_DB``, else the default) or one of
    its companion files, any SQLite database or its companion, a directory, in a missing or unwritable
    directory, or an existing file without ``force`` (``append``: a file the command continues, which may
    exist). The path, expanded."""
    from dlscale.errors import UsageError

    p = Path(path).expanduser()
    if "://" not in str(db or ""):
        base = resolve_db_path(db)
        for suffix in DB_COMPANIONS:
            if _same(p, Path(f"{base}{suffix}")):
                what = f"the {suffix} file of the results database" if suffix else "the results database"
                raise UsageError(f"{option} {p} is {what} this command reads ({base}): dlscale never writes over "
                                 "it; give another path")
    if _is_sqlite(p):
        raise UsageError(f"{option} {p} is an SQLite database: dlscale never writes over a database; give another path")
    for suffix in DB_COMPANIONS[1:]:
        if p.name.endswith(suffix) and _is_sqlite(p.with_name(p.name[: -len(suffix)])):
            raise UsageError(f"{option} {p} belongs to the SQLite database {p.name[: -len(suffix)]}: dlscale never "
                             "writes over a database; give another path")
    check_writable_file(p, option)
    if p.exists() and not (force or append):
        raise UsageError(f"{option} {p} exists: add --force to replace it, or give another path")
    return p


@contextmanager
def atomic_target(path: str | os.PathLike, option: str) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends without an
    error, removed otherwise (an OSError is a UsageError naming ``option``)."""
    import tempfile

    from dlscale.errors import UsageError

    p = Path(path).expanduser()
    try:
        fd, name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".part", dir=p.parent)
        os.close(fd)
    except OSError as e:
        raise UsageError(f"cannot write {option} {p}: {e.strerror}") from None
    tmp = Path(name)
    try:
        yield tmp
        if p.exists():
            os.chmod(tmp, p.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except OSError as e:
        raise UsageError(f"cannot write {option} {p}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: str | bytes, option: str) -> Path:
    """Write ``data`` to ``path`` whole or not at all (``atomic_target``), flushed to disk first."""
    p = Path(path).expanduser()
    with atomic_target(p, option) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    return p
