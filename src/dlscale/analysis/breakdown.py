"""Where a training step's time goes, and the verdict: input-, communication- or compute-bound.

Pure functions over numbers a run already recorded (no torch): the per-phase times of the
instrumented steps, the data-wait inside the measured window, the loader-only rate and the
decode rate per core. Derivations and thresholds are in docs/METRICS.md ("Step breakdown").
"""

from __future__ import annotations

import math
from typing import Any

PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer", "comm")
INPUT_WAIT_SHARE = 0.05  # data-wait above 5% of step time: the input pipeline holds training back
COMM_SHARE = 0.20  # exposed communication above 20% of step time: communication-bound

INPUT_BOUND = "input-bound"
COMM_BOUND = "communication-bound"
COMPUTE_BOUND = "compute-bound"


def phase_shares(phase_seconds: dict[str, float]) -> dict[str, float]:
    """Each phase's share of the instrumented step: ``t_phase / Σ t``.

    ``backward`` here includes the communication DDP overlaps with it; ``comm`` is the exposed
    part (backward with gradient sync minus backward without), so it is subtracted from
    ``backward`` for the shares to add up to 1.
    """
    t = {p: max(0.0, phase_seconds.get(p, 0.0)) for p in PHASES}
    t["backward"] = max(0.0, t["backward"] - t["comm"])
    total = sum(t.values())
    return {p: (t[p] / total if total > 0 else 0.0) for p in PHASES}


def compute_rate(samples_per_step: float, phase_seconds: dict[str, float]) -> float | None:
    """Samples/s the device side sustains with the input taken away: B / (h2d + fwd + bwd + opt)."""
    t = sum(max(0.0, phase_seconds.get(p, 0.0)) for p in ("h2d", "forward", "backward", "optimizer"))
    return samples_per_step / t if t > 0 else None


def cores_needed(target_rate: float | None, rate_per_core: float | None) -> float | None:
    """Cores of decode+augment needed to feed ``target_rate`` samples/s: target / (images/s per core)."""
    if not target_rate or not rate_per_core:
        return None
    return target_rate / rate_per_core


def verdict(
    *,
    data_wait_share: float | None,
    comm_share: float | None = None,
    loader_rate: float | None = None,
    compute_rate: float | None = None,
) -> dict[str, Any]:
    """The bottleneck, with the numbers that decided it and the rule that fired.

    In order: input-bound when the training process waited for data more than 5% of the
    measured window, or when the loader alone delivers fewer samples/s than the device consumes;
    communication-bound when exposed communication exceeds 20% of the step; else compute-bound.
    """
    numbers = {"data_wait_share": data_wait_share, "comm_share": comm_share,
               "loader_rate": loader_rate, "compute_rate": compute_rate}
    if data_wait_share is not None and data_wait_share > INPUT_WAIT_SHARE:
        return {"verdict": INPUT_BOUND, "numbers": numbers,
                "reason": f"data-wait is {data_wait_share:.1%} of step time (> {INPUT_WAIT_SHARE:.0%})"}
    if loader_rate is not None and compute_rate is not None and loader_rate < compute_rate:
        return {"verdict": INPUT_BOUND, "numbers": numbers,
                "reason": f"the loader alone delivers {loader_rate:.4g} samples/s, below the compute rate "
                          f"{compute_rate:.4g} samples/s"}
    if comm_share is not None and comm_share > COMM_SHARE:
        return {"verdict": COMM_BOUND, "numbers": numbers,
                "reason": f"exposed communication is {comm_share:.1%} of step time (> {COMM_SHARE:.0%})"}
    parts = []
    if data_wait_share is not None:
        parts.append(f"data-wait {data_wait_share:.1%} (<= {INPUT_WAIT_SHARE:.0%})")
    if loader_rate is not None and compute_rate is not None:
        parts.append(f"loader {loader_rate:.4g} >= compute {compute_rate:.4g} samples/s")
    if comm_share is not None:
        parts.append(f"exposed communication {comm_share:.1%} (<= {COMM_SHARE:.0%})")
    return {"verdict": COMPUTE_BOUND, "numbers": numbers, "reason": "; ".join(parts) or "no input or communication phase"}


def window_wait_share(waits: list[float], window_seconds: float) -> float | None:
    """Σ data-wait over the measured steps / the measured window's length."""
    if window_seconds <= 0 or math.isnan(window_seconds):
        return None
    return min(1.0, sum(waits) / window_seconds)
