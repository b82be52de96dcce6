"""Verdicts: pure functions from figures, expectations and thresholds to PASS / WARN / FAIL / NO EXPECTATION / ERROR.

For a figure (measured rate m) and an expectation (expected rate e, from a healthy figure of its
model, a datasheet, a baseline, a reference or the median of its peers), ``ratio = m / e`` and the
shortfall ``1 - ratio``:

- PASS: the shortfall is below the warn threshold (against a healthy figure: at least its tolerance);
- FAIL: the shortfall reaches the fail threshold *and* is significant (one-sided p < alpha:
  ``significance``; against a baseline, over the spread between runs of that figure on that class of
  device (``noise.py``); against a healthy figure, over its tolerance; against peers, over the raw
  samples of the same run, or for nodes' CPUs over the spread between the peers' values) — a FAIL
  is never declared inside the noise; a healthy *floor* (a published minimum) FAILs below it;
- WARN: otherwise when the shortfall reaches the warn threshold (saying whether it passed the
  fail line inside the noise, or could not be tested for want of samples);
- NO EXPECTATION: a figure with no expectation of any kind; its run becomes the baseline next time;
- ERROR: nothing sound was measured or nothing sound to compare with, so no verdict can be given: a
  check whose run failed, ran past its time limit, recorded nothing or no figure, a figure that is
  not a positive finite number (NaN, inf, 0, a string), an expectation that is not one. Verdicts
  fail closed: an ERROR exits 1 like a FAIL and is never shown as PASS or NO EXPECTATION.

Nothing here reads the store or runs anything: re-judging old records with new thresholds is
calling ``judge`` again (docs/METRICS.md, "Acceptance: verdicts").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.accept.figures.figure import Figure, sound
from dlscale.accept.judging import significance

PASS, WARN, FAIL, NO_EXPECTATION, ERROR = "PASS", "WARN", "FAIL", "NO EXPECTATION", "ERROR"
STATUSES = (PASS, WARN, FAIL, ERROR, NO_EXPECTATION)
NOT_PASSED = (FAIL, ERROR)  # what exits 1 whatever the thresholds (a WARN does with warn_fails)


@dataclass(frozen=True)
class Thresholds:
    """Shortfalls (fractions below the expectation) that WARN and FAIL, the significance level, and
    the spread between runs a baseline comparison assumes for a figure with no history of its own
    (SD of the log of the rate; 0.15, set against healthy runs of a shared 2-core machine), which
    also caps what a short history's upper bound may claim (``noise.between_runs``, docs/METRICS.md)."""

    warn: float = 0.05
    fail: float = 0.10
    alpha: float = 0.01
    run_spread: float = 0.15

    def check(self, where: str = "thresholds") -> None:
        from dlscale.errors import UsageError

        if not 0 <= self.warn <= self.fail < 1:
            raise UsageError(f"{where}: need 0 <= warn <= fail < 1 (fractions below the expectation), "
                             f"got warn {self.warn}, fail {self.fail}")
        if not 0 < self.alpha < 1:
            raise UsageError(f"{where}: alpha must be in (0, 1), got {self.alpha}")
        if not 0 < self.run_spread < 1:
            raise UsageError(f"{where}: run_spread must be in (0, 1) (the spread between runs, SD of the log of "
                             f"the rate; 0.15 is about 15%), got {self.run_spread}")

    def like(self, other: "Thresholds") -> "Thresholds":
        """These warn and fail lines with ``other``'s significance level and run spread."""
        return Thresholds(self.warn, self.fail, other.alpha, other.run_spread)


@dataclass(frozen=True)
class Expectation:
    kind: str  # "healthy" | "datasheet" | "baseline" | "reference" | "peers" | "spec" (a value the spec gives) |
    # "rule" (a bound that follows from what is measured: DDP over one rank against training alone)
    value: float
    source: str
    samples: tuple[float, ...] = ()  # peers: their samples (the test's other side)
    runs: tuple[float, ...] = ()  # baseline: the figure's value in each accepted run, newest first; peers
    # whose noise is between them (a node's CPU): each peer's value
    run_id: str | None = None
    tolerance: float | None = None  # healthy (typical): how far below a healthy system still measures
    sigma: float | None = None  # healthy: the known spread (log) of the figure among healthy systems
    floor: bool = False  # healthy: a published minimum (FAIL below it), not a typical figure
    spread: Any = None  # baseline: the between-run spread of the figure (noise.Spread)

    @property
    def phrase(self) -> str:
        """'its peers' / 'the baseline' / 'the datasheet' / 'the reference' (for explanations)."""
        return PHRASES.get(self.kind + (" floor" if self.floor else ""), self.kind)


PHRASES = {"peers": "its peers", "baseline": "the baseline", "datasheet": "its datasheet expectation",
           "reference": "the reference", "healthy": "its healthy figure", "healthy floor": "its healthy minimum",
           "history": "its own history", "spec": "the spec's expectation",
           "rule floor": "the one-rank minimum against training alone"}


@dataclass
class Verdict:
    check: str
    figure: str  # the figure's name
    subject: str | None  # "GPU 3", "link 0-2", None: the system
    status: str
    measured: float | None
    unit: str
    expected: float | None = None
    expectation: str | None = None  # its kind
    source: str | None = None
    ratio: float | None = None
    warn: float | None = None
    fail: float | None = None
    ci95: list[float] | None = None  # the measurement's own 95% interval
    test: dict[str, Any] | None = None  # p, ratio_ci95, method
    significant: bool = False  # the shortfall is significant (p < alpha): a proven one, however small
    reason: str = ""
    run_ids: list[str] = field(default_factory=list)
    key: str = ""  # the figure's key (figures.Figure.key)
    subject_key: str | None = None
    nodes: list[int] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    related: list[str] = field(default_factory=list)  # other verdicts that explain this one
    energy: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def shortfall(self) -> float | None:
        return None if self.ratio is None else 1 - self.ratio


def compare(fig: Figure, exp: Expectation, th: Thresholds) -> Verdict:
    """One figure against one expectation (the module doc's rules)."""
    th = lines_for(exp, th)
    v = _base(fig, PASS)
    v.expected, v.expectation, v.source = exp.value, exp.kind, exp.source
    v.warn, v.fail = th.warn, th.fail
    v.run_ids = [fig.run_id] + ([exp.run_id] if exp.run_id and exp.run_id != fig.run_id else [])
    if not sound(fig.value) or not sound(exp.value):
        what = f"measured {fig.value!r}" if not sound(fig.value) else f"the {exp.kind} expectation is {exp.value!r}"
        v.status, v.reason = ERROR, f"{what}: not a positive finite rate, nothing sound to judge"
        v.expected = exp.value if sound(exp.value) else None
        v.measured = fig.value if sound(fig.value) else None
        return v
    ratio = v.ratio = fig.value / exp.value
    test = _test(fig, exp, th)
    v.test = test.to_dict() if test else None
    short = 1 - ratio
    below = f"{short:.1%} below {exp.phrase}" if short > 0 else f"{-short:.1%} above {exp.phrase}"
    significant = v.significant = test is not None and test.p < th.alpha and short > 0
    line = "the minimum" if exp.floor else f"the {th.fail:.0%} fail line"
    if short < th.warn:
        v.status, v.reason = PASS, f"{below} (warn at {th.warn:.0%})"
    elif short >= th.fail and significant:
        v.status, v.reason = FAIL, f"{below}: past {line}, significant (p = {test.p:.2g})"
    elif short >= th.fail:
        why = f"p = {test.p:.2g} >= {th.alpha:g}" if test else "no samples to tell the noise"
        floor = test.detectable(th.alpha) if test else None
        if floor is not None:
            why += f"; against {test.against} with a spread of {test.sigma:.3g} a FAIL needs {floor:.0%} or more"
        v.status, v.reason = WARN, f"{below}: past {line} but inside the noise ({why})"
    else:
        v.status, v.reason = WARN, f"{below}: past the {th.warn:.0%} warn line"
    return v


def lines_for(exp: Expectation, th: Thresholds) -> Thresholds:
    """The warn and fail lines against this expectation: a healthy figure's at least its tolerance
    (a healthy system measures down to it); a healthy minimum's at the minimum itself."""
    if exp.floor:
        return Thresholds(0.0, 0.0, th.alpha, th.run_spread)
    if exp.tolerance:
        warn = max(th.warn, exp.tolerance)
        return Thresholds(warn, max(th.fail, warn), th.alpha, th.run_spread)
    return th


def _test(fig: Figure, exp: Expectation, th: Thresholds) -> significance.Test | None:
    if exp.sigma is not None and not exp.runs:
        return significance.vs_known(fig.value, exp.value, exp.sigma)
    if exp.runs:
        noun = "peer" if exp.kind == "peers" else "baseline run"
        return significance.vs_runs(fig.value, exp.runs, th.run_spread, noun, spread=exp.spread)
    if exp.samples:
        return significance.vs_samples(fig.samples, exp.samples)
    return significance.vs_value(fig.samples, exp.value)


def _base(fig: Figure, status: str) -> Verdict:
    s = fig.subject
    return Verdict(check=fig.check, figure=fig.name, subject=s.label if s else None, status=status, measured=fig.value,
                   unit=fig.unit, ci95=list(fig.ci95) if fig.ci95 else None, run_ids=[fig.run_id], key=fig.key,
                   subject_key=s.key if s else None, nodes=list(s.nodes) if s else [],
                   devices=list(s.devices) if s else [], energy=dict(fig.context.get("energy") or {}))


def no_expectation(fig: Figure) -> Verdict:
    if not sound(fig.value):  # fail closed: an unsound figure is no baseline for next time
        v = _base(fig, ERROR)
        v.measured, v.reason = None, f"measured {fig.value!r}: not a positive finite rate, nothing sound to judge"
        return v
    v = _base(fig, NO_EXPECTATION)
    v.reason = "no healthy, datasheet, baseline, reference or peer figure: recorded as the baseline for next time"
    return v


def error(check: str, reason: str, *, figure: str = "run", subject: str | None = None,
          run_ids: Sequence[str] = (), measured: float | None = None, unit: str = "") -> Verdict:
    """An ERROR about a check (or one of its figures) with nothing sound measured: why, and the runs it had."""
    return Verdict(check=check, figure=figure, subject=subject, status=ERROR, measured=measured, unit=unit,
                   reason=reason, run_ids=list(run_ids), key=f"{check}|{figure}|{subject or ''}")


def peer_expectations(figs: Sequence[Figure]) -> dict[int, Expectation]:
    """For each figure with peers (same run, check, name and device model) the median of the
    others' values, their samples pooled (index into ``figs`` -> expectation)."""
    from dlscale.stats import percentile

    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(figs):
        if f.peer_group is not None:
            groups.setdefault(f.peer_group, []).append(i)
    out: dict[int, Expectation] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        for i in members:
            others = [figs[j] for j in members if j != i]
            med = percentile([o.value for o in others], 50)
            model = figs[i].model or "device"
            between = figs[i].peer_noise == "values"
            scope = f"same {figs[i].peer_scope}" if figs[i].peer_scope else "same run"
            out[i] = Expectation("peers", med, f"median of {len(others)} peer(s) of the same model ({model}) in the "
                                               f"{scope}: {', '.join(o.subject.label for o in others if o.subject)}",
                                 () if between else tuple(x for o in others for x in o.samples),
                                 runs=tuple(o.value for o in others) if between else (), run_id=figs[i].run_id)
    return out


def judge(figs: Sequence[Figure], expectations: dict[int, list[Expectation]], thresholds: Thresholds,
          peer_thresholds: Thresholds | None = None, per_check: dict[str, Thresholds] | None = None) -> list[Verdict]:
    """Every figure against each of its expectations (``expectations[i]``: figure i's datasheet,
    baseline and reference ones) and, where it has peers, the median of its peers; a figure with none
    gets NO EXPECTATION. ``per_check`` overrides the thresholds of a check (not of peer comparisons)."""
    peers = peer_expectations(figs)
    out: list[Verdict] = []
    for i, fig in enumerate(figs):
        th = (per_check or {}).get(fig.check, thresholds)
        mine = [compare(fig, e, th) for e in expectations.get(i, [])]
        if i in peers:
            mine.append(compare(fig, peers[i], peer_thresholds or th))
        out.extend(mine or [no_expectation(fig)])
    return out


def outcome(verdicts: Sequence[Verdict]) -> str:
    """FAIL if any FAIL, else ERROR if any ERROR, else WARN if any WARN, else PASS (NO EXPECTATION when
    nothing had one; ERROR when there is no verdict at all: nothing was judged)."""
    seen = {v.status for v in verdicts}
    if not seen:
        return ERROR
    for s in (FAIL, ERROR, WARN, PASS):
        if s in seen:
            return s
    return NO_EXPECTATION


def counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    return {s: sum(v.status == s for v in verdicts) for s in STATUSES}


def exit_code(verdicts: Sequence[Verdict], warn_fails: bool = False) -> int:
    """0 when nothing FAILed or ERRORed (and, with ``warn_fails``, nothing WARNed) and something was judged; else 1."""
    bad = set(NOT_PASSED) | ({WARN} if warn_fails else set())
    return 1 if not verdicts or any(v.status in bad for v in verdicts) else 0
