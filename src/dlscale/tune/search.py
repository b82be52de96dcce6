"""The knob search of ``dlscale tune``: one knob at a time, kept only when its gain is clear of the noise.

The search starts from the configuration ``dlscale train MODEL`` runs by default and visits the
knobs in the order of their expected gain (``KNOBS``). For each knob it measures the candidates
(real short tests through a ``TrialRunner``), takes the fastest, and keeps it only when
``decide`` says its gain exceeds the noise of the two measurements. The batch-size knob grows the
batch x2 until it no longer fits (out of memory, or a peak over ``max_memory``) or stops getting
faster, then bisects between the last batch that fitted and the first that did not. Every trial
has a key (a hash of its options and repeat index); trials already in ``done`` (the store, with
``--resume``) are reused instead of run. No trial starts once the budget is spent. The clock and
the runner are injected, so the search runs in tests on a fake device. No torch at import time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.record import RunRecord, config_hash

KNOBS = ("precision", "batch_size", "channels_last", "compile", "threads_per_rank", "workers")
TrialRunner = Callable[[dict[str, Any], str, float], RunRecord]  # (options, key, timeout_s) -> the trial's record


@dataclass
class Result:
    """One trial: its options, whether it fitted, and its throughput with the 95% CI."""

    key: str
    settings: dict[str, Any]
    status: str  # ok | oom | over_memory | failed | skipped (budget spent)
    throughput: float = 0.0
    ci: tuple[float, float] = (0.0, math.inf)  # no interval known: overlaps everything
    peak_memory: int | None = None
    run_id: str | None = None
    error: str | None = None
    reused: bool = False  # found in the store (--resume), not run again

    @property
    def fits(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = [self.ci[0], None if math.isinf(self.ci[1]) else self.ci[1]]
        return d


@dataclass
class Decision:
    keep: bool
    gain: float  # candidate / incumbent throughput (the mean of the pairs' ratios after a repeat)
    reason: str


@dataclass
class Step:
    """One row of the ablation table."""

    knob: str
    value: Any
    tried: list[Any]
    throughput: float
    ci: tuple[float, float]
    gain: float  # over the previous row (1.0 when the knob was not changed)
    cumulative: float  # the product of the gains so far
    kept: bool
    note: str
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = [self.ci[0], None if math.isinf(self.ci[1]) else self.ci[1]]
        return d


@dataclass
class Outcome:
    start: Result
    best: Result
    steps: list[Step]
    trials: list[Result]
    not_searched: list[str]
    budget_spent: bool = False

    @property
    def gain(self) -> float:
        return self.steps[-1].cumulative if self.steps else 1.0


def trial_key(options: dict[str, Any], repeat: int = 0) -> str:
    """The stable name of a trial: its options (tag excluded) and which repeat of them it is."""
    return "tune-" + config_hash({**{k: v for k, v in options.items() if k != "tag"}, "tune_repeat": repeat})


def is_oom(error: str | None) -> bool:
    """A trial that ran out of memory: the harness's message, or the kernel's OOM killer (SIGKILL)."""
    text = (error or "").lower()
    return "out of memory" in text or "sigkill" in text or "can't allocate memory" in text


def result_of(rec: RunRecord, settings: dict[str, Any], key: str, max_memory: int | None,
              reused: bool = False) -> Result:
    """A trial's record as a Result; a peak over ``max_memory`` does not fit."""
    if rec.status != "ok":
        return Result(key, settings, "oom" if is_oom(rec.error) else "failed", run_id=rec.run_id,
                      error=rec.error, reused=reused)
    m = rec.metrics
    thr = float(m.get("throughput") or 0.0)
    ci = m.get("throughput_ci95")
    lo, hi = (ci[0], ci[1]) if ci else (0.0, None)
    res = Result(key, settings, "ok", thr, (float(lo), math.inf if hi is None else float(hi)),
                 m.get("peak_memory_bytes"), rec.run_id, reused=reused)
    if max_memory and res.peak_memory and res.peak_memory > max_memory:
        res.status = "over_memory"
        res.error = f"peak memory {res.peak_memory} B over --max-memory {max_memory} B"
    return res


def decide(inc: Result, cand: Result, rerun: Callable[[], tuple[Result | None, Result | None]] | None) -> Decision:
    """Whether ``cand`` is clearly faster than the incumbent ``inc`` (docs/METRICS.md, "dlscale tune").

    Kept when the candidate's CI lies wholly above the incumbent's. Rejected when it does not fit,
    when its throughput is not above the incumbent's, or when its CI lies wholly below. Otherwise
    (the intervals overlap) both are measured once more (``rerun``) and the candidate is kept only
    when it is faster in both pairs and the mean of the two ratios exceeds 1 by more than the ratios
    differ (the gain is larger than its own run-to-run spread).
    """
    if not cand.fits:
        return Decision(False, 0.0, f"{cand.status}")
    ratio = cand.throughput / inc.throughput if inc.throughput > 0 else math.inf
    if cand.ci[0] > inc.ci[1]:
        return Decision(True, ratio, f"{ratio:.2f}x, CIs apart")
    if ratio <= 1.0 or cand.ci[1] < inc.ci[0]:
        return Decision(False, ratio, f"{ratio:.2f}x, no gain")
    again = rerun() if rerun is not None else (None, None)
    if again[0] is None or again[1] is None or not (again[0].fits and again[1].fits):
        return Decision(False, ratio, f"{ratio:.2f}x, CIs overlap and no repeat could run")
    r2 = again[1].throughput / again[0].throughput
    mean = (ratio + r2) / 2
    keep = min(ratio, r2) > 1.0 and mean - 1.0 > abs(ratio - r2)
    word = "kept" if keep else "within noise"
    return Decision(keep, mean, f"{mean:.2f}x ({ratio:.2f}x, repeat {r2:.2f}x: CIs overlapped), {word}")


@dataclass
class Search:
    """The search's state: where it starts, what it may touch, how it measures, what it found."""

    start: dict[str, Any]  # trial options of the starting configuration
    candidates: dict[str, list[Any]]  # knob -> values to try (batch_size: ignored, grown instead)
    runner: TrialRunner
    clock: Callable[[], float]
    budget_s: float | None = None
    max_memory: int | None = None
    max_batch: int = 1024
    bisect_steps: int = 3
    done: dict[str, RunRecord] = field(default_factory=dict)  # trial key -> record (resume)
    fixed: dict[str, Any] = field(default_factory=dict)
    trial_timeout_s: float = 1800.0
    unit: str = "samples/s"
    trials: list[Result] = field(default_factory=list)
    budget_spent: bool = False

    def __post_init__(self) -> None:
        self.deadline = None if self.budget_s is None else self.clock() + self.budget_s

    def measure(self, settings: dict[str, Any], repeat: int = 0) -> Result | None:
        """The trial of ``settings`` (from the store when done before); None once the budget is spent."""
        key = trial_key(settings, repeat)
        for t in self.trials:
            if t.key == key:
                return t
        if key in self.done:
            res = result_of(self.done[key], settings, key, self.max_memory, reused=True)
        else:
            left = None if self.deadline is None else self.deadline - self.clock()
            if left is not None and left <= 0:
                self.budget_spent = True
                return None
            timeout = self.trial_timeout_s if left is None else min(self.trial_timeout_s, max(left, 60.0))
            res = result_of(self.runner(dict(settings), key, timeout), settings, key, self.max_memory)
        self.trials.append(res)
        return res

    def rerun(self, inc: Result, cand: Result) -> Callable[[], tuple[Result | None, Result | None]]:
        """Measure the incumbent and the candidate once more, each as a fresh trial (its next repeat index)."""
        def again(settings: dict[str, Any]) -> Result | None:
            return self.measure(settings, sum(1 for t in self.trials if t.settings == settings))

        return lambda: (again(inc.settings), again(cand.settings))

    def run(self) -> Outcome:
        """Every knob in order; the ablation table; what was left out."""
        start = self.measure(self.start)
        if start is None or not start.fits:
            from dlscale.errors import RunFailure

            why = "the budget was spent before it ran" if start is None else f"{start.status}: {start.error}"
            raise RunFailure(f"the starting configuration failed ({why}); lower --batch-size or fix the model options",
                             run_id=start.run_id if start else None)
        inc, steps, cumulative = start, [], 1.0
        steps.append(Step("start", None, [], start.throughput, start.ci, 1.0, 1.0, True, "the default", start.run_id))
        for knob in KNOBS:
            if knob in self.fixed:
                steps.append(Step(knob, self.fixed[knob], [], inc.throughput, inc.ci, 1.0, cumulative, False,
                                  "fixed by --fix", inc.run_id))
                continue
            if knob not in self.candidates:
                continue
            inc, step = self.knob(knob, inc, cumulative)
            cumulative = step.cumulative
            steps.append(step)
        return Outcome(start, inc, steps, self.trials, [], self.budget_spent)

    def knob(self, knob: str, inc: Result, cumulative: float) -> tuple[Result, Step]:
        """Try one knob's candidates against the incumbent; the new incumbent and the table row."""
        if knob == "batch_size":
            tried, measured = self.grow_batch(inc)
        else:
            values = [v for v in self.candidates[knob] if v != inc.settings.get(knob)]
            tried, measured = values, [self.measure({**inc.settings, knob: v}) for v in values]
        fitting = [r for r in measured if r is not None and r.fits and r.key != inc.key]
        same = inc.settings.get(knob)
        ran = [v for v, r in zip(tried, measured) if r is not None]  # the table shows what was measured
        if not fitting:
            if not tried:
                why = "no other value applies"
            elif any(r is None for r in measured):
                why = "budget spent"
            else:
                why = "; ".join(f"{v}: {r.status}" for v, r in zip(tried, measured) if not r.fits) or "no change"
            return inc, Step(knob, same, ran, inc.throughput, inc.ci, 1.0, cumulative, False, why, inc.run_id)
        cand = max(fitting, key=lambda r: r.throughput)
        d = decide(inc, cand, self.rerun(inc, cand))
        if not d.keep:
            return inc, Step(knob, same, ran, inc.throughput, inc.ci, 1.0, cumulative, False,
                             f"best {cand.settings.get(knob)}: {d.reason}", inc.run_id)
        return cand, Step(knob, cand.settings.get(knob), ran, cand.throughput, cand.ci, d.gain,
                          cumulative * d.gain, True, d.reason, cand.run_id)

    def grow_batch(self, inc: Result) -> tuple[list[Any], list[Result | None]]:
        """Batch x2 while it fits and gets faster, then bisect towards the first batch that ran out of memory."""
        lo, hi, best = inc.settings["batch_size"], None, inc
        tried, measured = [], []
        while lo * 2 <= self.max_batch:
            r = self.measure({**inc.settings, "batch_size": lo * 2})
            tried.append(lo * 2)
            measured.append(r)
            if r is None:
                return tried, measured
            if not r.fits:
                hi = lo * 2 if r.status in ("oom", "over_memory") else None  # a crash or timeout: no bisection
                break
            lo = lo * 2
            if r.throughput <= best.throughput:
                return tried, measured  # no longer faster: a larger batch costs memory and time for nothing
            best = r
        for _ in range(self.bisect_steps if hi is not None else 0):
            mid = (lo + hi) // 2
            if mid <= lo or hi - lo <= max(1, lo // 8):
                break
            r = self.measure({**inc.settings, "batch_size": mid})
            tried.append(mid)
            measured.append(r)
            if r is None:
                break
            lo, hi = (mid, hi) if r.fits else (lo, mid)
        return tried, measured
