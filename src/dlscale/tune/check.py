"""The closing check of ``dlscale tune``: each kept knob re-tested at the end, then the start and the best side by side.

The search's table is a forward-selection path: a step's gain was measured against the incumbent
of its time, and it is the best of several noisy candidates, so the product of the steps' gains is
biased upward; and a knob kept early may give nothing once later knobs are kept. So after the last
knob:

1. **Re-test.** Each kept knob, in the table's order, is measured once more against the final
   configuration: the final configuration with the keys its step changed put back as they were
   (``without``), beside a fresh trial of the final configuration (``Search.pair``: the final is
   interpolated at the other trial's place). ``retest`` = final / without is the knob's gain at the
   end. A knob whose re-test finds the final configuration no faster with it than without
   (``retest <= 1``) is taken out again (``reverted``), and the later re-tests are against the
   configuration without it. A knob without which the configuration does not fit stays.
2. **Side by side.** The start S and the best B alternate, S, B, S, B, ..., S (``final_pairs``
   pairs, at least 3); each B trial is compared with the start interpolated at its place between
   the S trials before and after it (``reference``), so a load drifting by a constant factor per
   trial cancels. The gain reported is the geometric mean of the pairs' ratios, with a 95%
   t-interval over their logarithms (docs/METRICS.md, "dlscale tune").

These trials run whatever the budget says (the search stopped early enough to leave them room).
No torch at import time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dlscale.tune.search import TIE, Result, Search, Step, reference


@dataclass
class Outcome:
    """The search's result: the start and the best (measured side by side at the end), the table, the trials."""

    start: Result
    best: Result
    steps: list[Step]
    trials: list[Result]
    not_searched: list[str]
    budget_spent: bool = False
    gain: float | None = None  # the closing side-by-side's: the geometric mean of its pairs' ratios
    gain_ci: tuple[float, float] | None = None
    pairs: list[dict[str, Any]] = field(default_factory=list)  # the side-by-side: each best trial against the start
    throughput_start: float = 0.0  # the mean of the start's trials in the side-by-side
    throughput_best: float = 0.0
    best_ci: tuple[float, float] | None = None  # over the best's trials in the side-by-side


def without(settings: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the keys of one step put back as they were (None: the key was not set), and what
    the change takes with it: a compile mode needs compile, prefetching needs loader workers."""
    out = dict(settings)
    for key, value in before.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    if not out.get("compile"):
        out.pop("compile_mode", None)
    if out.get("workers") == 0:
        out.pop("prefetch_factor", None)
    return out


def retest(search: Search, steps: list[Step], best: Result) -> Result:
    """Re-test each kept knob against the final configuration (in order); the final configuration's trial."""
    for step in steps:
        if not step.kept or step.knob == "start" or not step.before:
            continue
        final = best.settings
        if without(final, step.before) == final:  # taken out already with a knob reverted before it
            step.reverted = True
            step.note += "; re-test: taken out with an earlier knob"
            continue
        cand, ref = search.pair(without(final, step.before), final)
        if cand is None or not cand.fits:
            step.note += f"; re-test: without it {cand.status if cand else 'not run'}, kept"
            continue
        if ref is None or cand.throughput <= 0:
            step.note += "; re-test: the final configuration's trial beside it failed"
            continue
        step.retest = ref.throughput / cand.throughput
        if step.retest <= 1.0 + TIE:
            step.reverted = True
            step.note += f"; re-test {step.retest:.2f}x: no faster with it at the end, reverted"
            best = cand
        else:
            step.note += f"; re-test {step.retest:.2f}x at the end"
    return search.latest(best.settings) or best


def side_by_side(search: Search, start: dict[str, Any], best: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                                        list[Result], list[Result]]:
    """S, B, S, B, ..., S: each B against the start interpolated at its place; (pairs, S trials, B trials)."""
    s_trials = [search.fresh(start)]
    b_trials: list[Result] = []
    pairs = []
    for _ in range(search.final_pairs):
        b, s_next = search.fresh(best), search.fresh(start)
        b_trials.append(b)
        s_trials.append(s_next)
        s_prev = s_trials[-2]
        if all(t is not None and t.fits for t in (s_prev, b, s_next)):
            ref = reference(s_prev, s_next, b.seq)
            pairs.append({"start": ref.throughput, "best": b.throughput, "ratio": b.throughput / ref.throughput,
                          "best_run_id": b.run_id, "start_run_ids": [s_prev.run_id, s_next.run_id]})
    return pairs, [t for t in s_trials if t and t.fits], [t for t in b_trials if t and t.fits]


def geometric_gain(ratios: list[float]) -> tuple[float | None, tuple[float, float] | None]:
    """The geometric mean of the ratios and its 95% t-interval (over their logarithms; None below 2 ratios)."""
    from dlscale.stats import mean_ci95

    if not ratios:
        return None, None
    logs = [math.log(r) for r in ratios]
    ci = mean_ci95(logs)
    return math.exp(sum(logs) / len(logs)), (math.exp(ci[0]), math.exp(ci[1])) if ci else None


def close(search: Search, start: Result, best: Result, steps: list[Step]) -> Outcome:
    """The closing check after the search (``Search.select``): re-tests, then the side-by-side that gives
    the gain. From here on the budget no longer stops a trial."""
    from dlscale.stats import mean_ci95

    search.closing = True
    best = retest(search, steps, best)
    out = Outcome(start, best, steps, search.trials, [], search.budget_spent)
    if best.settings == start.settings:  # nothing kept: the best is the start, a gain of 1 by definition
        out.gain, out.throughput_start, out.throughput_best = 1.0, start.throughput, start.throughput
        return out
    out.pairs, s_trials, b_trials = side_by_side(search, start.settings, best.settings)
    out.gain, out.gain_ci = geometric_gain([p["ratio"] for p in out.pairs])
    if s_trials:
        out.throughput_start = sum(t.throughput for t in s_trials) / len(s_trials)
    if b_trials:
        out.throughput_best = sum(t.throughput for t in b_trials) / len(b_trials)
        out.best_ci = mean_ci95([t.throughput for t in b_trials])
    return out
