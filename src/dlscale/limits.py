"""The largest value of each count and size option, and the one check of an option against it.

A value past its limit is a slip (``--steps 1e20``, ``--image-size 1000000000``), not a
measurement: the typed configs refuse it where they are built (one line naming the limit, exit 2),
rather than run for ever or record a failed run after starting. The limits sit far above any run
dlscale is for; a batch size has none (the largest batch that fits is a measurement: out of memory
is recorded as such).
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import UsageError

STEPS = 1_000_000  # steps of one run (warm-up, measured, instrumented, profiled); iterations of a measurement
REPEAT = 1_000  # repeats of a short test, runs of a time-to-train test
EPOCHS = 100_000  # epochs of a time-to-train test
IMAGE_SIZE = 16_384  # pixels a side (a 16K image: 268 M pixels per channel)
TOKENS = 1_048_576  # a sequence's tokens (a context of 1 M tokens)


def at_most(option: str, value: Any, limit: int, what: str) -> None:
    """Refuse ``value`` above ``limit`` in one line naming the limit (``what``: what it counts)."""
    if value is not None and not isinstance(value, bool) and value > limit:
        raise UsageError(f"{option} must be <= {limit:,} ({what}), got {value:,}")
