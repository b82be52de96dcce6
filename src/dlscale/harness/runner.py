"""Run a body of work as a recorded run: inventory, timing of the whole, failure capture, store.

Every command that measures something goes through ``execute``: the record is written (status
``ok`` or ``failed`` with its error) whatever happens inside, and a failure is then raised as a
``RunFailure`` (exit code 1) naming the run id. Usage errors raised by the body are not runs:
they propagate unrecorded (exit code 2).
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlscale.errors import RunFailure, UsageError
from dlscale.record import RunRecord, utc_now
from dlscale.store import Store


@dataclass
class Outcome:
    """What a body returns: figures, their units, raw series, warnings, and config additions."""

    metrics: dict[str, Any] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


SWEEP_POINT_ENV = "DLSCALE_SWEEP_POINT"


class NonFiniteLoss(RuntimeError):
    pass


def describe_failure(exc: BaseException) -> str:
    """One line that names the problem and, where known, what to do."""
    name = type(exc).__name__
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if name == "OutOfMemoryError" or "out of memory" in msg.lower() or "can't allocate memory" in msg:
        return f"out of memory: {msg[:300]}; lower --batch-size or --image-size"
    if isinstance(exc, NonFiniteLoss):
        return f"{msg}; lower --lr or use a wider --precision"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    return f"{name}: {msg[:500]}"


def _note_features(rec: RunRecord) -> None:
    """The version-dependent features the installed stack had (compat.features), where the run used
    torch, and NCCL as it ran (nccl.info: version, NCCL_* variables, net plugin), where it joined a
    process group over NCCL; the record's system is replaced, not mutated, since callers may share it."""
    import sys

    if "torch" not in sys.modules or not isinstance(rec.system, dict):
        return
    from dlscale import compat, nccl

    software = dict(rec.system.get("software") or {})
    software["features"] = compat.features()
    if nccl.used():
        software["nccl_runtime"] = nccl.info()
    rec.system = {**rec.system, "software": software}


def execute(
    *,
    kind: str,
    workload: str,
    config: dict[str, Any],
    body: Callable[[RunRecord], Outcome],
    store: Store | None,
    tag: str | None = None,
    system: dict[str, Any] | None = None,
    price: Any = None,
) -> RunRecord:
    """Run ``body`` and record it. ``store=None`` skips writing (a non-zero distributed rank).

    ``price`` (cost.Price) adds the run's cost figures to a run that finished (cost.figures).
    """
    if system is None:
        from dlscale.system import collect_cached

        system = collect_cached()
    rec = RunRecord(kind=kind, workload=workload, config=dict(config), system=system, tag=tag)
    if os.environ.get(SWEEP_POINT_ENV):  # started by `dlscale sweep`: which point this run is
        rec.raw["sweep_point"] = os.environ[SWEEP_POINT_ENV]
    failure: BaseException | None = None
    start = time.monotonic()
    try:
        out = body(rec)
        rec.metrics.update(out.metrics)
        rec.units.update(out.units)
        rec.raw.update(out.raw)
        rec.warnings.extend(out.warnings)
        rec.config.update(out.config)
        if price is not None:
            from dlscale import cost

            c_metrics, c_units, c_raw = cost.figures(price, rec.metrics, rec.units, rec.config,
                                                     wall_s=time.monotonic() - start)
            rec.metrics.update(c_metrics)
            rec.units.update(c_units)
            rec.raw.update(c_raw)
    except UsageError:
        raise
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - every failure is recorded
        failure = e
        rec.fail(describe_failure(e))
        if os.environ.get("DLSCALE_DEBUG"):
            rec.raw["traceback"] = traceback.format_exc()
    rec.finished_at = utc_now()
    _note_features(rec)
    if store is not None:
        store.insert(rec)
    if failure is not None:
        if isinstance(failure, KeyboardInterrupt):
            raise failure
        raise RunFailure(f"run {rec.run_id} failed: {rec.error}", run_id=rec.run_id) from failure
    return rec
