"""torch's first import with Ctrl-C held, so that a Ctrl-C pressed meanwhile is not lost.

While torch's C extension initialises it imports numpy and takes any error of that import for
"numpy is unavailable": a KeyboardInterrupt raised there (Ctrl-C, or a SIGTERM a process turned
into one) is swallowed. The command then goes on as if nothing had been pressed (measured here: a
Ctrl-C half a second into `dlscale train --emulate-nodes 2` launched the job and left it running),
or torch is left half-initialised and the next import of it crashes the process (SIGSEGV, SIGABRT,
"bad call flags").

``install()`` (each of dlscale's entry points calls it first) wraps ``builtins.__import__`` until
torch is imported: an import that brings torch in runs with SIGINT and SIGTERM blocked for the
importing thread (``signal.pthread_sigmask``), so a signal sent meanwhile stays pending; the mask is
restored when that import has returned, and the signal is then delivered as usual: the statement
that imported torch raises KeyboardInterrupt with torch whole in ``sys.modules``. Once torch is in,
the wrapper takes itself out. No torch here.
"""

from __future__ import annotations

import builtins
import signal
import sys
from typing import Any

HELD = {signal.SIGINT, signal.SIGTERM}
PACKAGE = "torch"
_original = builtins.__import__


def _import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    if level or PACKAGE in sys.modules or name.partition(".")[0] != PACKAGE:
        return _original(name, globals, locals, fromlist, level)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        return _original(name, globals, locals, fromlist, level)
    finally:
        if builtins.__import__ is _import and PACKAGE in sys.modules:
            builtins.__import__ = _original  # torch is in: nothing more to guard
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a signal held meanwhile is delivered now


def install() -> bool:
    """Guard torch's first import in this process (False where torch is imported already or the
    platform cannot block signals)."""
    if PACKAGE in sys.modules or not hasattr(signal, "pthread_sigmask"):
        return False
    builtins.__import__ = _import
    return True
