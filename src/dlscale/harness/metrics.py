"""From raw step times to the reported figures (derived in docs/METRICS.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale import stats

CV_WARN = 0.02  # the seed papers' stability criterion: under 2% variation between iterations
NO_CI = "one measured step: no confidence interval; use --steps >= 2"

STEP_UNITS = {
    "throughput": "samples/s",
    "throughput_ci95": "samples/s",
    "repeat_throughputs": "samples/s",
    "step_time_mean": "s",
    "step_time_min": "s",
    "step_time_max": "s",
    "step_time_p50": "s",
    "step_time_p90": "s",
    "step_time_p99": "s",
    "cv": "fraction",
    "cv_repeats": "fraction",
    "samples_per_step": "samples",
    "measured_steps": "steps",
    "window_seconds": "s",
}


def summarize_steps(samples_per_step: float, repeats: Sequence[Sequence[float]]) -> tuple[dict[str, Any], list[str]]:
    """Throughput, its 95% CI, percentiles and CV over one or more repeats of timed steps.

    One repeat: throughput over the window, CI mapped from the mean step time's t-interval
    (None, with a warning, for a single measured step: one sample has no interval).
    N >= 2 repeats: throughput is the mean of the repeats' throughputs, CI the t-interval over
    them (repeats are independent; steps within a repeat are not). ``cv`` is the step-time CV of
    each repeat, the largest one. Returns the metrics and the warnings they raise.
    """
    if not repeats or any(len(r) == 0 for r in repeats):
        raise ValueError("every repeat needs at least one timed step")
    per_repeat = [stats.throughput(samples_per_step, r) for r in repeats]
    pooled = [t for r in repeats for t in r]
    if len(repeats) == 1:
        thr = per_repeat[0]
        ci = stats.throughput_ci95_from_steps(samples_per_step, repeats[0])
        ci_method = "steps" if ci is not None else None
    else:
        thr = stats.mean(per_repeat)
        ci = stats.throughput_ci95_from_repeats(per_repeat)
        ci_method = "repeats"
    cvs = [stats.cv(r) for r in repeats]
    m: dict[str, Any] = {
        "throughput": thr,
        "throughput_ci95": list(ci) if ci is not None else None,
        "throughput_ci_method": ci_method,
        "repeat_throughputs": per_repeat,
        "step_time_mean": stats.mean(pooled),
        "step_time_min": min(pooled),
        "step_time_max": max(pooled),
        "step_time_p50": stats.percentile(pooled, 50),
        "step_time_p90": stats.percentile(pooled, 90),
        "step_time_p99": stats.percentile(pooled, 99),
        "cv": max(cvs),
        "cv_repeats": stats.cv(per_repeat) if len(per_repeat) > 1 else None,
        "stable": max(cvs) <= CV_WARN,
        "samples_per_step": samples_per_step,
        "measured_steps": len(pooled),
        "window_seconds": sum(sum(r) for r in repeats),
    }
    warnings = [] if ci is not None else [NO_CI]
    if m["cv"] > CV_WARN:
        warnings.append(
            f"step times vary by {m['cv']:.1%} (CV), above the {CV_WARN:.0%} stability criterion: "
            "the figure is noisy; use more --steps, more --warmup-steps or a quieter machine"
        )
    return m, warnings


def mfu(achieved_flops: float | None, peak_flops: float | None) -> float | None:
    """Achieved / peak FLOP/s, or None where either is unknown."""
    if not achieved_flops or not peak_flops:
        return None
    return achieved_flops / peak_flops
