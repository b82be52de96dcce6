"""Learning-rate schedules as pure functions of the training step (derived in docs/METRICS.md).

A schedule is evaluated at the start of every step. ``e = step / steps_per_epoch`` is the
fractional epoch. The peak LR is the base LR, times ``global_batch / 256`` under the linear
scaling rule (Goyal et al. 2017). Linear warm-up over ``w`` epochs multiplies by
``min(1, (step + 1) / (w * steps_per_epoch))``: it reaches the peak on the last warm-up step and
is never zero. After warm-up, with ``D = total_epochs - w`` and ``p = (e - w) / D`` (capped at 1):

- ``constant``: the peak.
- ``cosine``: ``end + (peak - end) * (1 + cos(pi * p)) / 2``.
- ``poly``: ``end + (peak - end) * (1 - p) ** power`` (MLPerf's ResNet LARS schedule: power 2).
- piecewise ``'0.4;10;0.04;60;0.004'`` (the seeds' tf_cnn_benchmarks syntax): 0.4 before epoch
  10, 0.04 from epoch 10 to 60, 0.004 after; the values are scaled like the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlscale.errors import UsageError

REFERENCE_BATCH = 256
NAMED = ("constant", "cosine", "poly")


def scaled_lr(base_lr: float, global_batch: int, scaling: str = "linear") -> float:
    """The linear scaling rule: ``base_lr * global_batch / 256``; ``scaling='none'`` keeps it."""
    if scaling == "none":
        return base_lr
    if scaling != "linear":
        raise UsageError(f"unknown --lr-scaling {scaling!r}; choose linear or none")
    if global_batch <= 0:
        raise UsageError(f"the global batch must be > 0, got {global_batch}")
    return base_lr * global_batch / REFERENCE_BATCH


def lr_rule(spec: str, base_lr: float, global_batch: int, scaling: str = "linear") -> str:
    """How the peak LR follows from the options, with the numbers: what a run prints when it starts.

    Linear scaling, a named schedule, ``--lr 0.1`` on global batch 32: ``peak lr = --lr 0.1 x global
    batch 32 / 256 = 0.0125``. A piecewise schedule peaks at its first value, and every value is
    scaled alike (``--lr`` is then not used).
    """
    factor = scaled_lr(1.0, global_batch, scaling)
    if is_piecewise(spec):
        base = parse_piecewise(spec).values[0]
        source, given = f"the --lr-schedule's first value {base:g}", "the --lr-schedule values"
    else:
        base, source, given = base_lr, f"--lr {base_lr:g}", "--lr"
    if scaling == "none":
        return (f"no scaling: peak lr = {source}, as given "
                f"(--lr-scaling linear to scale it by global batch / {REFERENCE_BATCH})")
    return (f"linear scaling: peak lr = {source} x global batch {global_batch} / {REFERENCE_BATCH} = "
            f"{base * factor:g} (--lr-scaling none to use {given} as given)")


@dataclass(frozen=True)
class Piecewise:
    values: tuple[float, ...]  # len(boundaries) + 1 values
    boundaries: tuple[float, ...]  # epochs, strictly increasing

    def at(self, epoch: float) -> float:
        i = sum(1 for b in self.boundaries if epoch >= b)
        return self.values[i]


def parse_piecewise(spec: str) -> Piecewise:
    """``'v0;b1;v1;b2;v2'`` -> values (v0, v1, v2), boundaries (b1, b2) in epochs."""
    parts = [p.strip() for p in spec.split(";")]
    if len(parts) % 2 == 0 or any(p == "" for p in parts):
        raise UsageError(f"--lr-schedule {spec!r}: expected 'lr;epoch;lr;...;lr' (odd number of ';'-separated numbers)")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise UsageError(f"--lr-schedule {spec!r}: every field must be a number") from None
    values, bounds = tuple(nums[0::2]), tuple(nums[1::2])
    if any(not v > 0 for v in values):
        raise UsageError(f"--lr-schedule {spec!r}: learning rates must be > 0")
    if any(b <= 0 for b in bounds) or any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
        raise UsageError(f"--lr-schedule {spec!r}: epoch boundaries must be > 0 and increasing")
    return Piecewise(values, bounds)


def is_piecewise(spec: str) -> bool:
    return ";" in spec or _is_number(spec)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Schedule:
    """A validated schedule. ``peak`` is the post-scaling LR; ``scale`` multiplies piecewise values."""

    kind: str  # constant | cosine | poly | piecewise
    peak: float
    total_epochs: float
    warmup_epochs: float = 0.0
    end_lr: float = 0.0
    power: float = 2.0
    piecewise: Piecewise | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in NAMED + ("piecewise",):
            raise UsageError(f"unknown schedule {self.kind!r}; choose {', '.join(NAMED)} or a piecewise 'lr;epoch;lr'")
        if not self.peak > 0:
            raise UsageError(f"the learning rate must be > 0, got {self.peak}")
        if not self.total_epochs > 0:
            raise UsageError(f"the schedule needs total epochs > 0, got {self.total_epochs}")
        if self.warmup_epochs < 0 or self.warmup_epochs >= self.total_epochs:
            raise UsageError(f"--warmup-epochs must be >= 0 and below --max-epochs ({self.total_epochs}), "
                             f"got {self.warmup_epochs}")
        if self.end_lr < 0 or (self.kind in ("cosine", "poly") and self.end_lr > self.peak):
            raise UsageError(f"--end-lr must be between 0 and the peak LR {self.peak:g}, got {self.end_lr}")
        if not self.power > 0:
            raise UsageError(f"--poly-power must be > 0, got {self.power}")
        if self.kind == "piecewise" and self.piecewise is None:
            raise UsageError("a piecewise schedule needs its 'lr;epoch;lr' spec")

    def lr(self, step: int, steps_per_epoch: int) -> float:
        """The LR for ``step`` (0-based, counted from the start of training)."""
        if steps_per_epoch <= 0 or step < 0:
            raise ValueError("step must be >= 0 and steps_per_epoch > 0")
        e = step / steps_per_epoch
        warm = 1.0
        if self.warmup_epochs > 0 and e < self.warmup_epochs:
            warm = min(1.0, (step + 1) / (self.warmup_epochs * steps_per_epoch))
        if self.kind == "piecewise":
            return warm * self.scale * self.piecewise.at(e)
        if self.kind == "constant" or e < self.warmup_epochs:
            return warm * self.peak
        p = min(1.0, (e - self.warmup_epochs) / (self.total_epochs - self.warmup_epochs))
        if self.kind == "cosine":
            return self.end_lr + (self.peak - self.end_lr) * (1 + math.cos(math.pi * p)) / 2
        return self.end_lr + (self.peak - self.end_lr) * (1 - p) ** self.power


def build_schedule(spec: str, base_lr: float, global_batch: int, scaling: str, total_epochs: float,
                   warmup_epochs: float = 0.0, end_lr: float = 0.0, power: float = 2.0) -> Schedule:
    """From the CLI's ``--lr-schedule`` (a name or a piecewise spec) and ``--lr`` to a Schedule.

    Named schedules peak at ``scaled_lr(base_lr)``; a piecewise spec carries its own LRs, each
    multiplied by the same scaling factor (``--lr`` is then not used).
    """
    factor = scaled_lr(1.0, global_batch, scaling)
    if is_piecewise(spec):
        pw = parse_piecewise(spec)
        return Schedule("piecewise", peak=pw.values[0] * factor, total_epochs=total_epochs,
                        warmup_epochs=warmup_epochs, piecewise=pw, scale=factor)
    if spec not in NAMED:
        raise UsageError(f"unknown --lr-schedule {spec!r}; choose {', '.join(NAMED)} or a piecewise 'lr;epoch;lr'")
    return Schedule(spec, peak=base_lr * factor, total_epochs=total_epochs, warmup_epochs=warmup_epochs,
                    end_lr=end_lr, power=power)
