"""The knob search of ``dlscale tune``: one knob at a time, kept only when its gain is clear of the noise.

The search starts from the configuration ``dlscale train MODEL`` runs by default and visits the
knobs in the order of their expected gain (``KNOBS``). Every candidate is measured beside the
incumbent (A/B alternation): each candidate trial is followed at once by a fresh trial of the
incumbent, and the candidate is compared with the incumbent *as it would have measured at the
candidate's place in the sequence*, interpolated log-linearly between the incumbent's trials just
before and just after it (``reference``). A load that drifts slowly (the machine getting busier or
quieter over minutes) then scales both sides alike and cancels from the ratio. On top of that,
``decide`` keeps the fastest candidate only when its gain exceeds the noise of the two
measurements (CIs apart, or a consistent repeat pair). The batch-size knob grows the batch x2 until
it no longer fits (out of memory, or a peak over ``max_memory``) or stops getting faster, then
bisects between the last batch that fitted and the first that did not; the incumbent is measured
again after the growth. Every trial has a key (a hash of its options and repeat index); trials
already in ``done`` (the store, with ``--resume``) are reused instead of run, in the same order, so
a resumed search makes the same decisions. After the last knob (``Search.select``) comes the closing
check (``tune.check.close``): each kept knob re-tested against the final configuration, then the start
and the best side by side; the gain reported is that side-by-side's, not the product of the steps' gains
(each the best of several noisy candidates, so biased upward). No trial of the search starts once
the budget, less the time the closing check is expected to take, is spent; the closing check always
runs. The clock and the runner are injected, so the search runs in tests on a fake device. No torch
at import time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.record import RunRecord, config_hash

# compile_mode after threads and workers: max-autotune compiles for minutes and gains less on CPU.
KNOBS = ("precision", "batch_size", "channels_last", "compile", "threads_per_rank", "workers", "compile_mode",
         "optimizer_impl", "pin_memory", "prefetch_factor")
TIE = 1e-9  # ratios within this of 1 are equal (floating-point rounding of the drift correction)
FINAL_PAIRS = 3  # pairs of the closing side-by-side of the start and the best
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
    seq: int = -1  # its place in the search's sequence of trials (the drift correction interpolates on it)
    seconds: float | None = None  # how long the trial took (None: reused and not known)

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
    """One row of the ablation table: a step of the forward selection, and its re-test at the end."""

    knob: str
    value: Any
    tried: list[Any]
    throughput: float
    ci: tuple[float, float]
    gain: float  # at its step: over the incumbent of that time (1.0 when the knob was not changed)
    kept: bool  # kept at its step
    note: str
    run_id: str | None = None
    retest: float | None = None  # kept rows: final / final without this knob, side by side at the end
    reverted: bool = False  # its re-test found the final configuration no faster with it: taken out again
    before: dict[str, Any] = field(default_factory=dict)  # kept rows: the keys its step changed, as they were

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("before")
        d["ci"] = [self.ci[0], None if math.isinf(self.ci[1]) else self.ci[1]]
        return d


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


def reference(before: Result, after: Result, at: int) -> Result:
    """The incumbent as it would have measured at place ``at`` of the sequence: its throughput and CI
    bounds interpolated log-linearly between its trials ``before`` and ``after`` (a load drifting by a
    constant factor per trial cancels exactly; ``before`` and ``after`` at one place: their geometric mean)."""
    span = after.seq - before.seq
    f = (at - before.seq) / span if span > 0 else 0.5

    def mix(a: float, b: float) -> float:
        if math.isinf(a) or math.isinf(b):
            return math.inf
        if a <= 0 or b <= 0:
            return a + (b - a) * f  # a zero lower bound has no logarithm: linear
        return a * (b / a) ** f

    return Result(after.key, after.settings, "ok", mix(before.throughput, after.throughput),
                  (mix(before.ci[0], after.ci[0]), mix(before.ci[1], after.ci[1])), run_id=after.run_id, seq=at)


def decide(inc: Result, cand: Result, rerun: Callable[[], tuple[Result | None, Result | None]] | None) -> Decision:
    """Whether ``cand`` is clearly faster than the incumbent ``inc`` (docs/METRICS.md, "dlscale tune").

    ``inc`` is the incumbent measured beside the candidate (``reference``). Kept when the candidate's
    CI lies wholly above the incumbent's. Rejected when it does not fit, when its throughput is not
    above the incumbent's, or when its CI lies wholly below. Otherwise (the intervals overlap) both
    are measured once more, side by side (``rerun``: the incumbent reference and the candidate), and
    the candidate is kept only when it is faster in both pairs and the mean of the two ratios exceeds
    1 by more than the ratios differ (the gain is larger than its own run-to-run spread).
    """
    if not cand.fits:
        return Decision(False, 0.0, f"{cand.status}")
    ratio = cand.throughput / inc.throughput if inc.throughput > 0 else math.inf
    if cand.ci[0] > inc.ci[1]:
        return Decision(True, ratio, f"{ratio:.2f}x, CIs apart")
    if ratio <= 1.0 + TIE or cand.ci[1] < inc.ci[0]:
        return Decision(False, ratio, f"{ratio:.2f}x, no gain")
    again = rerun() if rerun is not None else (None, None)
    if again[0] is None or again[1] is None or not (again[0].fits and again[1].fits):
        return Decision(False, ratio, f"{ratio:.2f}x, CIs overlap and no repeat could run")
    r2 = again[1].throughput / again[0].throughput
    mean = (ratio + r2) / 2
    keep = min(ratio, r2) > 1.0 + TIE and mean - 1.0 > abs(ratio - r2)
    word = "kept" if keep else "within noise"
    return Decision(keep, mean, f"{mean:.2f}x ({ratio:.2f}x, repeat {r2:.2f}x: CIs overlapped), {word}")


def changes(knob: str, value: Any) -> dict[str, Any]:
    """The option changes that set ``knob`` to ``value`` (a compile mode also turns compile on)."""
    return {knob: value, "compile": True} if knob == "compile_mode" else {knob: value}


def applies(knob: str, settings: dict[str, Any]) -> bool:
    """Whether the knob can be tried from these settings (prefetch needs loader workers)."""
    return not (knob == "prefetch_factor" and settings.get("workers") == 0)


Pair = tuple[Any, Result | None, Result | None]  # (value, candidate trial, incumbent reference beside it)


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
    final_pairs: int = FINAL_PAIRS
    knobs: tuple[str, ...] = KNOBS  # the order they are visited in
    trials: list[Result] = field(default_factory=list)
    budget_spent: bool = False
    closing: bool = False  # the closing check runs: the budget no longer stops a trial
    kept: int = 0  # knobs kept so far
    incumbent: dict[str, Any] = field(default_factory=dict)  # the settings kept so far

    def __post_init__(self) -> None:
        self.deadline = None if self.budget_s is None else self.clock() + self.budget_s
        self.incumbent = dict(self.start)
        if self.final_pairs < FINAL_PAIRS:
            raise ValueError(f"the closing side-by-side needs at least {FINAL_PAIRS} pairs, got {self.final_pairs}")

    def measure(self, settings: dict[str, Any], repeat: int = 0) -> Result | None:
        """The trial of ``settings`` (from the store when done before); None once the search's budget is spent."""
        key = trial_key(settings, repeat)
        for t in self.trials:
            if t.key == key:
                return t
        if key in self.done:
            res = result_of(self.done[key], settings, key, self.max_memory, reused=True)
            res.seconds = self.done[key].seconds
        else:
            timeout = self.trial_timeout_s
            if not self.closing and self.deadline is not None:
                left = self.deadline - self.clock() - self.closing_seconds()
                if left <= 0:
                    self.budget_spent = True
                    return None
                timeout = min(self.trial_timeout_s, max(left, 60.0))
            t0 = self.clock()
            res = result_of(self.runner(dict(settings), key, timeout), settings, key, self.max_memory)
            res.seconds = self.clock() - t0
        res.seq = len(self.trials)
        self.trials.append(res)
        return res

    def fresh(self, settings: dict[str, Any]) -> Result | None:
        """A new trial of ``settings`` (its next repeat index), never an earlier one reused."""
        return self.measure(settings, sum(1 for t in self.trials if t.settings == settings))

    def latest(self, settings: dict[str, Any]) -> Result | None:
        """The newest trial of ``settings`` that ran fine."""
        return next((t for t in reversed(self.trials) if t.settings == settings and t.fits), None)

    def seconds_of(self, settings: dict[str, Any]) -> float:
        """How long a trial of ``settings`` takes: the mean of its own trials, else of every trial (0: none known)."""
        own = [t.seconds for t in self.trials if t.settings == settings and t.seconds is not None]
        every = [t.seconds for t in self.trials if t.seconds is not None]
        known = own or every
        return sum(known) / len(known) if known else 0.0

    def closing_seconds(self) -> float:
        """The seconds the closing check would take if the search stopped now with one knob more kept: per
        kept knob a trial without it and one of the final configuration, then ``final_pairs`` pairs of the
        start and the best and one more start trial. No trial starts past the budget less this."""
        t_s, t_b = self.seconds_of(self.start), self.seconds_of(self.incumbent)
        return (self.kept + 1) * (t_b + max(t_s, t_b)) + self.final_pairs * (t_s + t_b) + t_s

    def pair(self, settings: dict[str, Any], inc: dict[str, Any]) -> tuple[Result | None, Result | None]:
        """Measure ``settings``, then the incumbent ``inc`` right after it: the candidate's trial and the
        incumbent's reference at its place (None when the candidate did not fit or the incumbent could not run)."""
        before = self.latest(inc)
        cand = self.fresh(settings)
        if cand is None or not cand.fits or before is None:
            return cand, None
        after = self.fresh(inc)
        if after is None or not after.fits:
            return cand, None
        return cand, reference(before, after, cand.seq)

    def select(self) -> tuple[Result, Result, list[Step]]:
        """Every knob in order: the start's trial, the incumbent after the last knob, the table's steps.
        The closing check (``tune.check.close``) comes next."""
        start = self.fresh(self.start)
        if start is None or not start.fits:
            from dlscale.errors import RunFailure

            why = "the budget was spent before it ran" if start is None else f"{start.status}: {start.error}"
            raise RunFailure(f"the starting configuration failed ({why}); lower --batch-size or fix the model options",
                             run_id=start.run_id if start else None)
        inc, steps = start, []
        steps.append(Step("start", None, [], start.throughput, start.ci, 1.0, True, "the default", start.run_id))
        for knob in self.knobs:
            if knob in self.fixed:
                steps.append(Step(knob, self.fixed[knob], [], inc.throughput, inc.ci, 1.0, False, "fixed by --fix",
                                  inc.run_id))
                continue
            if knob not in self.candidates:
                continue
            inc, step = self.knob(knob, inc)
            steps.append(step)
            if step.kept:
                self.kept += 1
                self.incumbent = dict(inc.settings)
        return start, inc, steps

    def knob(self, knob: str, inc: Result) -> tuple[Result, Step]:
        """Try one knob's candidates, each beside the incumbent; the new incumbent and the table row."""
        pairs = self.batch_pairs(inc) if knob == "batch_size" else self.value_pairs(knob, inc)
        same = inc.settings.get(knob)
        ran = [v for v, c, _ in pairs if c is not None]  # the table shows what was measured
        judged = [(c, ref) for _, c, ref in pairs if c is not None and c.fits and ref is not None]
        if not judged:
            return inc, Step(knob, same, ran, inc.throughput, inc.ci, 1.0, False, why_none(pairs, self.budget_spent),
                             inc.run_id)
        cand, ref = max(judged, key=lambda p: p[0].throughput / p[1].throughput if p[1].throughput > 0 else math.inf)
        d = decide(ref, cand, lambda: self.again(cand.settings, inc.settings))
        if not d.keep:
            return inc, Step(knob, same, ran, inc.throughput, inc.ci, 1.0, False,
                             f"best {cand.settings.get(knob)}: {d.reason}", inc.run_id)
        before = {k: inc.settings.get(k) for k in set(cand.settings) | set(inc.settings)
                  if cand.settings.get(k) != inc.settings.get(k)}
        return cand, Step(knob, cand.settings.get(knob), ran, cand.throughput, cand.ci, d.gain, True, d.reason,
                          cand.run_id, before=before)

    def again(self, cand: dict[str, Any], inc: dict[str, Any]) -> tuple[Result | None, Result | None]:
        """The repeat of ``decide``: the candidate and the incumbent once more, side by side (reference, candidate)."""
        c, ref = self.pair(cand, inc)
        return ref, c

    def value_pairs(self, knob: str, inc: Result) -> list[Pair]:
        """Each other value of the knob, measured and followed by the incumbent; stops once the budget is spent."""
        pairs: list[Pair] = []
        if not applies(knob, inc.settings):
            return pairs
        for v in (v for v in self.candidates[knob] if v != inc.settings.get(knob)):
            c, ref = self.pair({**inc.settings, **changes(knob, v)}, inc.settings)
            pairs.append((v, c, ref))
            if c is None:
                break
        return pairs

    def batch_pairs(self, inc: Result) -> list[Pair]:
        """The batch sizes of ``grow_batch``, then the incumbent once more: each fitting batch against
        the incumbent interpolated at its place between the trials before and after the growth."""
        before = self.latest(inc.settings)
        tried, measured = self.grow_batch(inc)
        after = self.fresh(inc.settings) if any(r is not None and r.fits for r in measured) else None
        ok = before is not None and after is not None and after.fits
        return [(v, r, reference(before, after, r.seq) if ok and r is not None and r.fits else None)
                for v, r in zip(tried, measured)]

    def grow_batch(self, inc: Result) -> tuple[list[Any], list[Result | None]]:
        """Batch x2 while it fits and gets faster, then bisect towards the first batch that ran out of memory.
        (Whether to go on compares neighbouring trials; the kept batch is judged against the incumbent.)"""
        lo, hi, best = inc.settings["batch_size"], None, self.latest(inc.settings) or inc
        tried, measured = [], []
        while lo * 2 <= self.max_batch:
            r = self.fresh({**inc.settings, "batch_size": lo * 2})
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
            r = self.fresh({**inc.settings, "batch_size": mid})
            tried.append(mid)
            measured.append(r)
            if r is None:
                break
            lo, hi = (mid, hi) if r.fits else (lo, mid)
        return tried, measured


def why_none(pairs: list[Pair], budget_spent: bool) -> str:
    """The table's note when no candidate could be judged."""
    if not pairs:
        return "no other value applies"
    if any(c is None for _, c, _ in pairs) or budget_spent and any(c.fits for _, c, _ in pairs):
        return "budget spent"
    if any(c.fits for _, c, _ in pairs):
        return "the incumbent's measurement beside the candidate failed"
    return "; ".join(f"{v}: {c.status}" for v, c, _ in pairs if c is not None and not c.fits) or "no change"
