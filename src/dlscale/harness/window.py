"""How long a measured window is: at least a count, and with a target duration as many more units as a
short probe says the target needs. The one place every timed loop sizes its window: training steps and
inference batches (``harness.timing.timed_loop``), a kernel case's timed calls or windows of K calls
(``micro.harness``, ``micro.gputiming``), a collective's iterations (``micro.coll_worker``).

A unit is what the loop repeats (a step, a call, a window of K calls); the probe is the time of one or a
few of them right before the window, after the warm-up, so it runs at the speed the window will:

    count = max(min_count, min(most, ceil(target / probe)))

A probe too short to read (0 s) takes ``most`` (the count asked is never cut; ``MOST`` bounds what a
target adds: a record keeps one time per unit). ``agree`` (a job's ranks) turns each rank's count into
one every rank runs: the largest, so every rank's window reaches the target. ``Window.sizings`` keeps,
per window sized, the target, the probe and the count chosen: the record says the window was long
enough and why it has the length it has (docs/METRICS.md, "How long a measured window is").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dlscale.errors import UsageError

MAX_DURATION_S = 3600.0  # a target past an hour is a slip, not a measurement window
PROBE_STEPS = 3  # a timed loop's probe: its last warm-up steps, at most this many
MOST = 100_000  # the most units a target makes a window hold (a record keeps a time per unit: ~2 MB of JSON)


def check_min_duration(option: str, value: Any) -> None:
    """A target duration is None or a number of seconds in (0, MAX_DURATION_S]; else one-line UsageError."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_DURATION_S:
        raise UsageError(f"{option} must be a number of seconds above 0 and at most {MAX_DURATION_S:g} "
                         f"(the least a measured window lasts), got {value!r}")


def count_for(min_count: int, probe_s: float, target_s: float | None, most: int = MOST) -> int:
    """The units a window holds: ``min_count`` (at least 1), and with ``target_s`` enough more that
    ``count · probe_s`` reaches it, the target adding no more than up to ``most``."""
    count = max(1, min_count)
    if target_s is not None:
        need = math.ceil(target_s / probe_s - 1e-9) if probe_s > 0 else most
        count = max(count, min(need, most))
    return count


class Window:
    """A window's target duration (seconds; None: the count as asked), how the ranks of a job agree on a
    count (``agree``, None: one process) and the most units it may hold. Every ``size`` call is one
    window sized; ``sizings`` keeps each (a run's repeats, an inference sweep's batch sizes)."""

    def __init__(self, target_s: float | None, agree: Callable[[int], int] | None = None, most: int = MOST):
        check_min_duration("min_duration_s", target_s)
        self.target_s, self.agree, self.most = target_s, agree, most
        self.sizings: list[dict[str, Any]] = []

    def size(self, min_count: int, probe_s: float, probe_units: int = 1) -> int:
        """The count of a window of at least ``min_count`` units whose probe took ``probe_s`` per unit
        (timed over ``probe_units`` of them); recorded in ``sizings``."""
        count = count_for(min_count, probe_s, self.target_s, self.most)
        if self.agree is not None:
            count = int(self.agree(count))
        self.sizings.append({"target_s": self.target_s, "min_count": min_count, "probe_s": probe_s,
                             "probe_units": probe_units, "count": count,
                             "expected_s": count * probe_s})
        return count

    @property
    def last(self) -> dict[str, Any] | None:
        return self.sizings[-1] if self.sizings else None
