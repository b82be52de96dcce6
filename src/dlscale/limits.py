"""The largest value of each count and size option, and the one check of an option's number.

A value past its limit is a slip (``--steps 1e20``, ``--image-size 1000000000``, ``--batch-size
99999999999999999999``), not a measurement: the typed configs refuse it where they are built (one
line naming the limit, exit 2), rather than run for ever or record a failed run after starting. The
limits sit far above any run dlscale is for; a batch below ``BATCH`` that does not fit is a
measurement (out of memory, recorded as such), one above it overflowed torch's sizes. ``number`` is
the check every numeric option of every command passes first (the CLI applies it to each int and
float option as it is parsed): a float must be finite (NaN and infinity never run out, never
compare, and turn every figure they touch into NaN), a whole number within its option's limit
(``OPTIONS``), else within int64 (``INTEGER``). ``fields`` applies it to a typed config's fields.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import UsageError

STEPS = 1_000_000  # steps of one run (warm-up, measured, instrumented, profiled); iterations of a measurement
REPEAT = 1_000  # repeats of a short test, runs of a time-to-train test
EPOCHS = 100_000  # epochs of a time-to-train test
IMAGE_SIZE = 16_384  # pixels a side (a 16K image: 268 M pixels per channel)
TOKENS = 1_048_576  # a sequence's tokens (a context of 1 M tokens)
BATCH = 2**31  # samples of one batch: past any memory (a larger batch that does not fit is out of memory, recorded)
REQUESTS = 1_000_000  # requests of one serving load point
INTEGER = 2**63 - 1  # any whole-number option: int64, what torch, numpy and SQLite hold (counts and sizes: lower)

# the options whose limit is one of the above, whichever command takes them (the CLI checks each as it is
# parsed; the typed configs check their own fields against the same limits)
_STEPS, _TOKENS, _BATCH = (STEPS, "steps of one short test"), (TOKENS, "tokens of a sequence"), (BATCH, "samples of one batch")
OPTIONS: dict[str, tuple[int, str]] = {
    "--steps": _STEPS, "--warmup-steps": _STEPS, "--breakdown-steps": _STEPS, "--profile-steps": _STEPS,
    "--repeat": (REPEAT, "repeats of the short test"), "--runs": (REPEAT, "runs of the test"),
    "--max-epochs": (EPOCHS, "epochs of one run"), "--image-size": (IMAGE_SIZE, "pixels a side"),
    "--seq-len": _TOKENS, "--prompt-len": _TOKENS, "--output-len": _TOKENS,
    "--batch-size": _BATCH, "--batch-sizes": _BATCH, "--max-batch": _BATCH,
    "--requests": (REQUESTS, "requests of one load point"),
}


def at_most(option: str, value: Any, limit: int, what: str) -> None:
    """Refuse ``value`` above ``limit`` in one line naming the limit (``what``: what it counts)."""
    if value is not None and not isinstance(value, bool) and value > limit:
        raise UsageError(f"{option} must be <= {limit:,} ({what}), got {value:,}")


# what a float option is, where its own check words it so (any other: "a finite number")
FLOATS: dict[str, str] = {"--price-per-hour": "a finite price per device-hour > 0",
                          "--timeout-per-run": "a number of seconds > 0"}


def finite(option: str, value: Any) -> None:
    """Refuse a float that is NaN or infinite in one line naming the option (None passes: not given)."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{option} must be {FLOATS.get(option, 'a finite number')}, got {value:g}")


def number(option: str, value: Any) -> None:
    """The check of every numeric option (the module doc): a float finite, a whole number within its
    option's limit (``OPTIONS``; any other within +-INTEGER); a list or tuple item by item."""
    if isinstance(value, (list, tuple)):
        for v in value:
            number(option, v)
        return
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, float):
        finite(option, value)
    elif isinstance(value, int):
        if value < -INTEGER:
            raise UsageError(f"{option} must be >= -{INTEGER:,} (the smallest whole number an option takes, int64), "
                             f"got {value:,}")
        limit(option, value)


def limit(option: str, value: Any) -> None:
    """``at_most`` with the option's limit from ``OPTIONS`` (any other option: ``INTEGER``)."""
    most, what = OPTIONS.get(option, (INTEGER, "the largest whole number an option takes, int64"))
    at_most(option, value, most, what)


def fields(config: Any, skip: tuple[str, ...] = ()) -> None:
    """``number`` on every field of a typed config (a dataclass), each named as its option (``batch_size``:
    ``--batch-size``); ``skip``: fields with a meaning of their own for a non-finite value."""
    import dataclasses

    for f in dataclasses.fields(config):
        if f.name not in skip:
            number(f"--{f.name.replace('_', '-')}", getattr(config, f.name))
