"""The epoch loop every time-to-quality run shares: image classification's (tta/classifier.py) and
every other family's (tta/domain.py).

``Ranks`` is this process's place in a data-parallel run and ``Progress`` what the run has done
so far (the curve, the clock across a resume, the time and sample totals, the target point).
``run_epochs`` trains epoch by epoch with the caller's train and evaluate steps: evaluation
follows every ``eval_every``-th epoch and the last (``evaluates_after``), ``log_point`` stamps
each point with the run's clock and energy, and ``save_checkpoint`` writes rank 0's checkpoint
after each epoch; ``resume_progress`` loads one back (``--resume``), its clock moved on by the
work the interrupted attempt lost after it. The energy figures (``add_energy``) are the joules
metered from the first epoch to each logged point (every rank's device; a host's CPU packages once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlscale.harness.runner import Outcome
from dlscale.log import info
from dlscale.tta import checkpoint
from dlscale.tta.config import TTAConfig


@dataclass
class Ranks:
    """This process's place in a data-parallel run; one rank alone by default."""

    rank: int = 0
    world: int = 1
    all_reduce: Callable[[Any], None] | None = None  # in-place sum over ranks
    all_gather: Callable[[Any], list[Any]] = lambda obj: [obj]  # every rank's (picklable) object, in rank order
    barrier: Callable[[], None] = lambda: None
    # before an evaluation: give every rank rank 0's buffers (BN running statistics drift by one
    # local batch per rank after DDP's per-forward broadcast), so all ranks evaluate one model
    sync_buffers: Callable[[Any], None] = lambda model: None


@dataclass
class Progress:
    """What the run has done so far: the curve, the time and sample totals, the target point.

    A checkpoint holds it and ``--resume`` restores it; ``clock`` runs across a resume.
    """

    t0: float  # perf_counter when this process's run started
    prior_s: float = 0.0  # seconds the run had taken before a resume
    start_epoch: int = 0
    curve: list[dict[str, Any]] = field(default_factory=list)
    acc: dict[str, Any] = field(default_factory=lambda: {  # seconds and counts over the whole run
        "train_time": 0.0, "eval_time": 0.0, "checkpoint_time": 0.0, "setup_time": 0.0, "lost_time": 0.0,
        "samples": 0, "steps": 0})
    resume_info: dict[str, Any] = field(default_factory=dict)
    hit: dict[str, Any] | None = None  # the first curve point that reached the target
    prior_j: float | None = 0.0  # joules the run had used before a resume (None: not measured then)
    meter: Any = None  # harness.energy_meter.EnergyMeter over the epochs, open while they run
    notes: list[str] = field(default_factory=list)  # warnings for the record (a resumed log that cannot pass)

    def clock(self) -> float:
        """Seconds since the run started, across a resume."""
        return self.prior_s + time.perf_counter() - self.t0


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch


def run_epochs(s: Any, train: Callable[[Any, int], dict[str, Any]], evaluate: Callable[[Any, int, dict], None],
               on_epoch: Callable[[dict[str, Any]], None] | None) -> None:
    """The epoch loop of every time-to-quality run (tta/classifier.py's and tta/domain.py's ``s``):
    train, evaluate on the cadence, log the point, checkpoint; stop at the target or
    ``max_epochs``; the MLPerf log's run_stop says which, and ``s.close()`` always runs."""
    from dlscale.harness.energy_meter import EnergyMeter

    p, cfg = s.progress, s.cfg
    p.meter = EnergyMeter(s.device)
    p.meter.begin()
    mark = (checkpoint.ProgressMark(cfg.checkpoint_dir, s.key, p.clock).start()
            if cfg.checkpoint_dir and s.ranks.rank == 0 else None)
    try:
        for epoch in range(p.start_epoch, cfg.max_epochs):
            if p.hit:
                break
            point = train(s, epoch)
            if evaluates_after(cfg, epoch):
                evaluate(s, epoch, point)
            log_point(s, point, on_epoch)
            if cfg.checkpoint_dir:
                save_checkpoint(s, epoch)
        if s.mlog:
            s.mlog.run_stop(success=p.hit is not None)
    except BaseException:
        if s.mlog:
            s.mlog.run_stop(success=False)
        raise
    finally:
        p.meter.end()
        p.meter.close()
        if mark:
            mark.stop()  # the clock when the run ended, or failed: what a resume counts as lost after the checkpoint
        s.close()


def evaluates_after(cfg: TTAConfig, epoch: int) -> bool:
    """Evaluation follows every ``eval_every``-th epoch (0-based ``epoch``) and the last one."""
    return (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.max_epochs


def log_point(s: Any, point: dict[str, Any], on_epoch: Callable[[dict[str, Any]], None] | None) -> None:
    """Stamp ``point`` with the run's clock, add it to the curve, and keep it if it reached the target."""
    p = s.progress
    point["wall_s"] = p.clock()
    point["energy_j"] = run_energy(s)
    p.curve.append(point)
    if point.get("reached"):
        p.hit = point
    if on_epoch:
        on_epoch(point)


def save_checkpoint(s: Any, epoch: int) -> None:
    """Rank 0 writes the model, optimizer and progress after epoch ``epoch``; every rank waits for it."""
    p = s.progress
    tc = time.perf_counter()
    if s.ranks.rank == 0:
        from dlscale.tta.mlperf import log_mark

        checkpoint.save_atomic({
            "config_key": s.key, "epoch": epoch + 1, "model": s.base.state_dict(), "optimizer": s.opt.state_dict(),
            "curve": p.curve, "acc": p.acc, "elapsed_s": p.clock(), "saved_at": time.time(),
            "mlperf_log": log_mark(s.mlog),
        }, s.cfg.checkpoint_dir)
    s.sync()
    p.acc["checkpoint_time"] += time.perf_counter() - tc


def resume_progress(s: Any, state: dict[str, Any], t0: float, log_problems: list[str]) -> Progress:
    """Load checkpoint ``state`` into the model and optimizer; the progress it held, its clock moved on
    by the time the interrupted attempt spent after it (``lost_time``, said here before training)."""
    s.base.load_state_dict(state["model"])
    s.opt.load_state_dict(state["optimizer"])
    curve = state["curve"]
    lost = checkpoint.lost_after(s.cfg.checkpoint_dir, state)
    acc = {**Progress(t0=t0).acc, **state["acc"]}  # a checkpoint from before lost_time has none
    acc["lost_time"] += lost
    if s.ranks.rank == 0:
        info(f"resuming after epoch {state['epoch']}: the interrupted run worked {lost:.1f} s past that checkpoint; "
             f"that lost work counts in the run's time ({acc['lost_time']:.1f} s lost in all)")
    notes = [f"the MLPerf log {s.cfg.mlperf_log} will not pass the checker: " + "; ".join(log_problems)] \
        if log_problems else []
    return Progress(t0=t0, prior_s=state["elapsed_s"] + lost, start_epoch=state["epoch"], curve=curve, acc=acc,
                    prior_j=curve[-1].get("energy_j") if curve else 0.0,
                    resume_info={"resumed_from_epoch": state["epoch"], "resume_gap": time.time() - state["saved_at"],
                                 "lost_time": acc["lost_time"]},
                    hit=next((c for c in curve if c.get("reached")), None), notes=notes)


def run_energy(s: Any) -> float | None:
    """Joules the run has used so far (every rank's device; a host's CPU packages once); None without a
    counter on any rank. A collective: every rank calls it at each logged point."""
    import os

    p = s.progress
    own = p.meter.so_far() if p.meter is not None else None
    if s.ranks.all_reduce is not None and s.ranks.world > 1:
        import torch

        gpu = any(c.domain == "gpu" for c in p.meter.counters)
        counted = own if own is not None and (gpu or os.environ.get("LOCAL_RANK", "0") == "0") else 0.0
        t = torch.tensor([counted, 1.0 if own is None else 0.0], dtype=torch.float64)
        s.ranks.all_reduce(t)
        own = None if t[1].item() > 0 else t[0].item()
    return None if own is None or p.prior_j is None else p.prior_j + own


def add_energy(out: Outcome, p: Progress) -> None:
    metrics, units, raw = energy_outcome(p)
    out.metrics.update(metrics)
    out.units.update(units)
    out.raw.update(raw)


def energy_outcome(p: Progress) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """``energy_to_target_kwh`` (the joules at the target point / 3.6e6) and the run's ``energy_j``;
    ``raw["energy"]`` names the source or says why there is none."""
    m = p.meter
    reason = (m.reason if m is not None else "no counter read") or (
        "a run resumed from a checkpoint made without an energy counter" if p.prior_j is None else None)
    raw = {"energy": {"source": None if reason else m.found.source, "domains": [] if reason else
                      sorted({c.domain for c in m.counters}), "reason": reason,
                      "window": "from the first epoch to each evaluation (set-up not metered)"}}
    last = p.curve[-1].get("energy_j") if p.curve else None
    if reason or last is None:
        return {}, {}, raw
    metrics = {"energy_j": last}
    if p.hit is not None and p.hit.get("energy_j") is not None:
        metrics["energy_to_target_kwh"] = p.hit["energy_j"] / 3.6e6
    return metrics, {"energy_j": "J", "energy_to_target_kwh": "kWh"}, raw
