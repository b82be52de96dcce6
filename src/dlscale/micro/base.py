"""What a microbenchmark is: a name, the cases it runs, and how much work one call of a case is.

A module under ``dlscale.micro`` declares a ``Microbench``: ``cases()`` returns ``Case`` objects,
each with the columns that identify it (``labels``), a ``build`` that allocates its inputs on the
device and returns the operation to time, and the FLOPs and/or bytes one call performs. The
shared harness (``dlscale.micro.harness``, on GPUs ``dlscale.micro.gputiming``) owns everything
else: warm-up, timed windows with device synchronisation, hot or cold caches, statistics, rates,
% of peak, clocks, energy, and the run record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dlscale.errors import UsageError
from dlscale.format import fmt_count

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class MicroOptions:
    """Options every kernel and memory microbenchmark takes (validated at construction)."""

    device: str = "auto"
    precisions: tuple[str, ...] = ("fp32",)
    warmup: int = 2
    reps: int = 10
    min_duration_s: float | None = None  # a case's timed calls last at least this (count from a probe: harness/window)
    case_budget_s: float | None = None  # CPU: fewer reps (>= 3) for slow cases; None: 0.5 s on CPUs
    full: bool = False  # every shape in the set, whatever its size
    max_gflop: float | None = None  # per call; None: the device's default (docs/METRICS.md)
    shapes: str | None = None  # the user's own shape file
    channels_last: bool | None = None  # conv layout; None: NHWC on CPU and for reduced precision
    mem_mib: int | None = None  # memory: array size; None: 4x the last-level cache (STREAM's rule)
    cpu_ghz: float | None = None  # the CPU clock for the ISA peak, where the model name has none
    every_device: bool = False  # gemm, memory: the device cases on every visible GPU at once (one device on CPUs)
    cache: str = "hot"  # GPUs: hot (operands reused) or cold (rotating operand copies past the L2)
    seed: int = 0
    tag: str | None = None

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"unknown --device {self.device!r}; choose one of auto, cpu, cuda")
        if not self.precisions:
            raise UsageError("--precision needs at least one of " + ", ".join(PRECISIONS))
        for p in self.precisions:
            if p not in PRECISIONS:
                raise UsageError(f"unknown --precision {p!r}; choose from {', '.join(PRECISIONS)}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if self.reps < 1:
            raise UsageError(f"--reps must be >= 1, got {self.reps}")
        from dlscale import limits

        for opt, v in (("--case-budget", self.case_budget_s), ("--max-gflop", self.max_gflop), ("--cpu-ghz", self.cpu_ghz)):
            limits.finite(opt, v)
        for opt, v in (("--warmup", self.warmup), ("--iters", self.reps)):
            limits.at_most(opt, v, limits.STEPS, "calls of one case")
        from dlscale.harness.window import check_min_duration

        check_min_duration("--min-duration", self.min_duration_s)
        if self.case_budget_s is not None and not self.case_budget_s > 0:
            raise UsageError(f"--case-budget must be > 0 seconds, got {self.case_budget_s}")
        if self.max_gflop is not None and not self.max_gflop > 0:
            raise UsageError(f"--max-gflop must be > 0, got {self.max_gflop}")
        if self.mem_mib is not None and self.mem_mib < 1:
            raise UsageError(f"--mem-mib must be >= 1, got {self.mem_mib}")
        if self.cpu_ghz is not None and not 0.1 <= self.cpu_ghz <= 10:
            raise UsageError(f"--cpu-ghz must be a clock in GHz (0.1..10), got {self.cpu_ghz}")
        if self.cache not in ("hot", "cold"):
            raise UsageError(f"unknown --cache {self.cache!r}; choose hot or cold")


def run_devices(opts: MicroOptions, device: Any) -> list[Any]:
    """The devices a kernel or memory benchmark measures: ``device``, or with ``every_device`` every
    visible CUDA device (a CPU is one device); the plan groups the cases that run on all at once."""
    if not opts.every_device or getattr(device, "type", "cpu") != "cuda":
        return [device]
    import torch

    return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]


@dataclass
class Case:
    """One timed operation: its identifying columns, how to build it, and the work per call."""

    labels: dict[str, Any]
    build: Callable[[], Callable[[], Any]]  # allocate inputs; return the op to time
    flops: float | None = None  # FLOPs per call (None: not a compute benchmark)
    bytes: float | None = None  # bytes moved per call, by the benchmark's own definition
    precision: str | None = None  # for % of peak
    device: Any = None  # where it runs and is timed; None: the run's device
    capture: bool = False  # GPUs: its call can be captured into a CUDA graph (tried; launched one by one if not)
    group: Any = None  # cases sharing a key, one per GPU, run on every GPU at once (micro/node.py); None: alone


@dataclass
class Plan:
    """The cases a microbenchmark will run here, and one-line notes (skipped shapes, why)."""

    cases: list[Case] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Microbench(Protocol):
    name: str
    title: str  # one line for --help and report headers
    columns: Sequence[str]  # the label columns of its rows, in print order

    def plan(self, opts: MicroOptions, device: Any) -> Plan: ...

    def summarize(self, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
        """Headline metrics (and units) of one run, from its rows."""
        ...


MIN_REPS = 3
CPU_CASE_BUDGET_S = 0.5


def case_budget(opts: MicroOptions, device: Any) -> float | None:
    """Seconds of timed reps a case may take before its reps are cut (not below MIN_REPS); CPUs only."""
    if getattr(device, "type", "cpu") == "cuda" or opts.full:
        return None
    return opts.case_budget_s or CPU_CASE_BUDGET_S


def size_filter(cases: list[Case], opts: MicroOptions, device: Any, notes: list[str],
                cpu_max_gflop: float = 1.0) -> list[Case]:
    """Drop cases above the per-call FLOP budget (unless --full), with one note saying so.

    GPUs run every shape; on CPUs the default limit is ``cpu_max_gflop`` (each microbenchmark
    says its own) so that ``dlscale micro all`` takes minutes on a small machine.
    """
    default = None if getattr(device, "type", "cpu") == "cuda" else cpu_max_gflop
    limit = None if opts.full else (opts.max_gflop or default)
    if limit is None:
        return cases
    kept = [c for c in cases if c.flops is None or c.flops <= limit * 1e9]
    if len(kept) < len(cases):
        notes.append(f"{len(cases) - len(kept)} of {fmt_count(len(cases), 'case')} skipped: above {limit:g} GFLOP per call "
                     "on this device (--full runs every shape, --max-gflop sets the limit)")
    return kept
