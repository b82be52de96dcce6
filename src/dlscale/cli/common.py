"""Option types declared once and reused, and the two output streams.

Data goes to stdout (``out``); logs, progress, warnings and errors go to stderr (``err``).
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

def _console(stderr: bool) -> Console:
    c = Console(stderr=stderr, highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(stderr=stderr, highlight=False, width=200)  # pipes and files: do not wrap at 80
    return c


out = _console(stderr=False)
err = _console(stderr=True)


class Format(str, Enum):
    human = "human"
    json = "json"


DbOpt = Annotated[
    Optional[str],
    typer.Option("--db", help="Results database: an SQLite file or a postgresql:// URL (password in PGPASSWORD or ~/.pgpass, "
                         "not the URL). Default: $DLSCALE_DB, else ~/.local/share/dlscale/results.db. A command "
                         "that measures creates the file; one that only reads refuses a file that is not there.",
                 show_default=False),
]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="human: tables; json: one JSON document on stdout.")]
TagOpt = Annotated[Optional[str], typer.Option("--tag", help="Label stored with the run, for filtering and comparing.")]
MinDurationOpt = Annotated[Optional[float], typer.Option(
    "--min-duration", help="Seconds each measured window lasts at least: its steps (or iterations) are counted from a "
    "short probe after the warm-up, never fewer than asked; the record keeps the target, the probe and the count.",
    show_default=False)]


def print_json(obj: Any) -> None:
    """Machine output: one JSON document on stdout, NaN/inf written as null."""
    sys.stdout.write(json.dumps(_clean(obj), indent=2, default=str) + "\n")
    sys.stdout.flush()


def _clean(x: Any) -> Any:
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def emit(rec: Any, fmt: "Format", tables: Any) -> None:
    """A run's warnings on stderr; on stdout its record as JSON, or the tables ``tables(rec)`` makes."""
    for w in rec.warnings:
        warn(w)
    if fmt == Format.json:
        print_json(rec.to_dict())
        return
    for t in tables(rec):
        out.print(t)


def config_options(cls: type, given: dict[str, Any], *extra: str) -> dict[str, Any]:
    """The command's parameters that are fields of the config dataclass ``cls`` (plus ``extra`` names).

    ``given`` is the command's ``locals()`` taken first thing, so every option named as a field
    reaches the config (nothing is left out by hand)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)} | set(extra)
    return {k: v for k, v in given.items() if k in names}


def warn(msg: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {msg}", markup=True, highlight=False)


def info(msg: str) -> None:
    err.print(msg, markup=False, highlight=False)


def info_done_elsewhere(layout: Any) -> None:
    """The end line of a process whose job's run another rank records (``job.done_elsewhere``)."""
    from dlscale.distributed.job import done_elsewhere

    info(done_elsewhere(layout))


def interactive() -> bool:
    """Progress bars only for humans: stderr must be a terminal."""
    return err.is_terminal
