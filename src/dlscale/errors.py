"""The kinds of failure dlscale reports, and the exit codes they map to.

A ``UsageError`` is bad input found before any work starts (exit code 2).
A ``RunFailure`` is a run that started and failed (exit code 1); the harness
records it in the store with status ``failed`` before the CLI exits.
A ``StoreUnavailable`` is a results database that was reached and then lost for longer than its
retry window (exit code 1: nothing was wrong with the input); a record that could not be written
then is kept in the local spool (``dlscale.stores.spool``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class DlscaleError(Exception):
    """Base class: the message is one line that names the problem and the fix."""

    exit_code = EXIT_FAILURE


class UsageError(DlscaleError):
    """Bad input: an unknown name, an out-of-range value, an unwritable path."""

    exit_code = EXIT_USAGE


class RunFailure(DlscaleError):
    """A run started and failed (out of memory, NaN loss, a crashed rank)."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, run_id: str | None = None, records: list | None = None):
        super().__init__(message)
        self.run_id = run_id
        self.records = records or []  # what a command of several runs recorded before it failed


def json_problem(e: Any, line: bool = False) -> str:
    """A ``json.JSONDecodeError`` as one phrase with where it is: "Expecting ',' delimiter at column 7",
    "Unterminated string starting at column 10" (Python's message may already end in "at")."""
    where = f"line {e.lineno}, column {e.colno}" if line else f"column {e.colno}"
    return f"{e.msg} {where}" if e.msg.endswith(" at") else f"{e.msg} at {where}"


class StoreUnavailable(DlscaleError):
    """The results database went away during the command and did not come back in time."""

    exit_code = EXIT_FAILURE


_NOTE: list[str] = []  # the note of the interrupt under way (the CLI takes it: typer turns Ctrl-C into exit 130)


@contextmanager
def on_interrupt(note: Callable[[], str]) -> Iterator[None]:
    """While the block runs, a Ctrl-C (KeyboardInterrupt) leaves ``note()``: what the command kept and how
    to go on (resume, judge, run again), which the CLI prints on its one line (``take_interrupt_note``).
    The innermost block's note wins; a note that cannot be made leaves the interrupt as it was."""
    try:
        yield
    except KeyboardInterrupt as e:
        if not getattr(e, "dlscale_noted", False):
            e.dlscale_noted = True  # type: ignore[attr-defined]
            _NOTE.clear()
            try:
                _NOTE.append(note())
            except Exception:  # noqa: BLE001 - an interrupt is never turned into another error
                pass
        raise


def take_interrupt_note() -> str:
    """What the interrupted command kept and how to go on ('' when it said nothing); said once."""
    note = " ".join(_NOTE)
    _NOTE.clear()
    return note
