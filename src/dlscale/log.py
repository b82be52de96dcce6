"""Progress and warnings of a run, on stderr (data never goes here; the CLI prints data on stdout).

The engines below the CLI (``dlscale.api`` and what it calls) say what they are doing through
these two functions, so that a run driven from Python or a notebook shows the same lines as the
command line. ``DLSCALE_QUIET=1`` silences ``info``; warnings always show.
"""

from __future__ import annotations

import os
import sys


def info(msg: str) -> None:
    if os.environ.get("DLSCALE_QUIET"):
        return
    print(msg, file=sys.stderr, flush=True)


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)
