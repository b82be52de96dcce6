"""Verdicts: pure functions from figures, expectations and thresholds to PASS / WARN / FAIL / NO EXPECTATION.

For a figure (measured rate m) and an expectation (expected rate e, from a datasheet, a baseline,
a reference or the median of its peers), ``ratio = m / e`` and the shortfall ``1 - ratio``:

- PASS: the shortfall is below the warn threshold;
- FAIL: the shortfall reaches the fail threshold *and* is significant (one-sided p < alpha:
  ``signif``; against a baseline, over the spread between its accepted runs, never below the
  ``run_spread`` floor; against peers, over the raw samples of the same run, or for nodes' CPUs
  over the spread between the peers' values) — a FAIL is never declared inside the noise;
- WARN: otherwise when the shortfall reaches the warn threshold (saying whether it passed the
  fail line inside the noise, or could not be tested for want of samples);
- NO EXPECTATION: a figure with no expectation of any kind; its run becomes the baseline next time.

Nothing here reads the store or runs anything: re-judging old records with new thresholds is
calling ``judge`` again (docs/METRICS.md, "Acceptance: verdicts").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.accept import signif
from dlscale.accept.figures import Figure

PASS, WARN, FAIL, NO_EXPECTATION = "PASS", "WARN", "FAIL", "NO EXPECTATION"
STATUSES = (PASS, WARN, FAIL, NO_EXPECTATION)


@dataclass(frozen=True)
class Thresholds:
    """Shortfalls (fractions below the expectation) that WARN and FAIL, the significance level, and
    the least spread between runs a baseline comparison assumes (SD of the log of the rate; 0.15,
    set against healthy runs of a shared 2-core machine: docs/METRICS.md)."""

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
    kind: str  # "datasheet" | "baseline" | "reference" | "peers" | "spec" (a value the acceptance spec gives)
    value: float
    source: str
    samples: tuple[float, ...] = ()  # peers: their samples (the test's other side)
    runs: tuple[float, ...] = ()  # baseline: the figure's value in each accepted run, newest first; peers
    # whose noise is between them (a node's CPU): each peer's value
    run_id: str | None = None

    @property
    def phrase(self) -> str:
        """'its peers' / 'the baseline' / 'the datasheet' / 'the reference' (for explanations)."""
        return {"peers": "its peers", "baseline": "the baseline", "datasheet": "its datasheet expectation",
                "reference": "the reference", "spec": "the spec's expectation"}.get(self.kind, self.kind)


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
    ratio = fig.value / exp.value if exp.value else None
    test = _test(fig, exp, th)
    v = _base(fig, PASS)
    v.expected, v.expectation, v.source, v.ratio = exp.value, exp.kind, exp.source, ratio
    v.warn, v.fail, v.test = th.warn, th.fail, test.to_dict() if test else None
    v.run_ids = [fig.run_id] + ([exp.run_id] if exp.run_id and exp.run_id != fig.run_id else [])
    if ratio is None:
        v.status, v.reason = NO_EXPECTATION, f"{exp.kind} expectation is 0: nothing to compare with"
        return v
    short = 1 - ratio
    below = f"{short:.1%} below {exp.phrase}" if short > 0 else f"{-short:.1%} above {exp.phrase}"
    significant = v.significant = test is not None and test.p < th.alpha and short > 0
    if short < th.warn:
        v.status, v.reason = PASS, f"{below} (warn at {th.warn:.0%})"
    elif short >= th.fail and significant:
        v.status, v.reason = FAIL, f"{below}: past the {th.fail:.0%} fail line, significant (p = {test.p:.2g})"
    elif short >= th.fail:
        why = f"p = {test.p:.2g} >= {th.alpha:g}" if test else "no samples to tell the noise"
        floor = test.detectable(th.alpha) if test else None
        if floor is not None:
            why += f"; against {test.against} with a spread of {test.sigma:.2f} a FAIL needs {floor:.0%} or more"
        v.status, v.reason = WARN, f"{below}: past the {th.fail:.0%} fail line but inside the noise ({why})"
    else:
        v.status, v.reason = WARN, f"{below}: past the {th.warn:.0%} warn line"
    return v


def _test(fig: Figure, exp: Expectation, th: Thresholds) -> signif.Test | None:
    if exp.runs:
        return signif.vs_runs(fig.value, exp.runs, th.run_spread, "peer" if exp.kind == "peers" else "baseline run")
    if exp.samples:
        return signif.vs_samples(fig.samples, exp.samples)
    return signif.vs_value(fig.samples, exp.value)


def _base(fig: Figure, status: str) -> Verdict:
    s = fig.subject
    return Verdict(check=fig.check, figure=fig.name, subject=s.label if s else None, status=status, measured=fig.value,
                   unit=fig.unit, ci95=list(fig.ci95) if fig.ci95 else None, run_ids=[fig.run_id], key=fig.key,
                   subject_key=s.key if s else None, nodes=list(s.nodes) if s else [],
                   devices=list(s.devices) if s else [], energy=dict(fig.context.get("energy") or {}))


def no_expectation(fig: Figure) -> Verdict:
    v = _base(fig, NO_EXPECTATION)
    v.reason = "no datasheet, baseline, reference or peer figure: recorded as the baseline for next time"
    return v


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
            out[i] = Expectation("peers", med, f"median of {len(others)} peer(s) of the same model ({model}) in the "
                                               f"same run: {', '.join(o.subject.label for o in others if o.subject)}",
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
    """FAIL if any FAIL, else WARN if any WARN, else PASS (NO EXPECTATION when nothing had one)."""
    seen = {v.status for v in verdicts}
    for s in (FAIL, WARN, PASS):
        if s in seen:
            return s
    return NO_EXPECTATION


def counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    return {s: sum(v.status == s for v in verdicts) for s in STATUSES}
