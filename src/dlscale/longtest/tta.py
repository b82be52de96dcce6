"""Train to a target accuracy and record the curve: the body of ``dlscale tta`` (kind ``tta``).

The clock starts when the body starts (dlscale's run start, once its Python modules are
imported) and runs on the wall: data-loader and model set-up, every training epoch, every
evaluation and every checkpoint write are inside ``time_to_target``. Evaluation, checkpoint
and set-up time are also recorded on their own, and ``time_to_target_train`` is training time
alone. Each epoch is seeded from (seed, epoch), so a
run resumed from a checkpoint repeats exactly what the uninterrupted run would have done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale import workloads
from dlscale.harness import device as dev
from dlscale.harness.runner import Outcome
from dlscale.longtest import checkpoint
from dlscale.longtest.config import TTAConfig, same_config_key
from dlscale.longtest.loop import evaluate, train_epoch
from dlscale.longtest.mlperf import RESNET_TARGET

UNITS = {
    "time_to_target": "s", "time_to_target_train": "s", "epochs_to_target": "epochs", "epochs_run": "epochs",
    "wall_time": "s", "train_time": "s", "eval_time": "s", "checkpoint_time": "s", "setup_time": "s",
    "throughput": "samples/s", "epoch_throughputs": "samples/s", "final_top1": "fraction", "final_top5": "fraction",
    "best_top1": "fraction", "final_loss": "nats", "target_top1": "fraction", "target_top5": "fraction",
    "samples_per_epoch": "samples", "steps_per_epoch": "steps", "global_batch": "samples", "world_size": "ranks",
    "peak_lr": "lr", "train_samples": "samples", "eval_samples": "samples", "resumed_from_epoch": "epochs",
    "resume_gap": "s",
}
DIGITS_MARKER = "dlscale-digits.json"


@dataclass
class Ranks:
    """This process's place in a data-parallel run; one rank alone by default."""

    rank: int = 0
    world: int = 1
    all_reduce: Callable[[Any], None] | None = None  # in-place sum over ranks
    barrier: Callable[[], None] = lambda: None
    # before an evaluation: give every rank rank 0's buffers (BN running statistics drift by one
    # local batch per rank after DDP's per-forward broadcast), so all ranks evaluate one model
    sync_buffers: Callable[[Any], None] = lambda model: None


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch


def reached(cfg: TTAConfig, top1: float, top5: float) -> bool:
    return top1 >= cfg.target_top1 and (cfg.target_top5 is None or top5 >= cfg.target_top5)


def run_tta(cfg: TTAConfig, device: Any, ranks: Ranks | None = None, wrap_model: Callable[[Any], Any] | None = None,
            platform: str = "cpu", on_epoch: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Train ``cfg`` (resolved) until the target or ``max_epochs``; returns the run's figures.

    The clock starts once the Python modules are imported (torch, torchvision's transforms, the
    loader): import time is the interpreter's, not the training system's.
    """
    import torch
    import torchvision.transforms.v2  # noqa: F401 - imported before the clock starts

    import dlscale.data.loader  # noqa: F401

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, device, ranks or Ranks(), wrap_model, platform, on_epoch, t0)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: TTAConfig, device: Any, ranks: Ranks, wrap_model: Callable[[Any], Any] | None, platform: str,
         on_epoch: Callable[[dict[str, Any]], None] | None, t0: float) -> Outcome:
    import torch

    from dlscale.data.loader import build_loader

    dev.set_matmul_precision(cfg.precision, device)
    plain = (Path(cfg.data) / DIGITS_MARKER).is_file()  # tiny digits: no crops or flips
    common = dict(batch_size=cfg.batch_size, image_size=cfg.image_size, workers=cfg.workers, plain_resize=plain,
                  seed=cfg.seed)
    train_loader = build_loader(cfg.data, "train", train=True, distributed=(ranks.rank, ranks.world), **common)
    val_shard = (ranks.rank, ranks.world) if ranks.world > 1 else None
    val_loader = build_loader(cfg.data, "val", train=False, distributed=val_shard, **common)
    if val_loader.classes != train_loader.classes:
        raise RuntimeError(f"{cfg.data}: train and val have different class folders")
    n_train, n_val = len(train_loader.loader.dataset), len(val_loader.loader.dataset)
    val_limit = len(range(ranks.rank, n_val, ranks.world))  # this rank's real (unpadded) validation samples
    steps_per_epoch = len(train_loader)
    sched = cfg.schedule()
    key = same_config_key(cfg.to_dict())

    mlog, log_problems = None, []
    if cfg.mlperf_log and ranks.rank == 0:
        from dlscale.longtest.mlperf import MLPerfLog, closed_division_problems

        log_problems = closed_division_problems(cfg, sched)
        mlog = MLPerfLog(cfg.mlperf_log, append=cfg.resume and Path(cfg.mlperf_log).is_file())
        if not cfg.resume:
            mlog.header(cfg, sched, steps_per_epoch, platform, n_train, n_val)

    torch.manual_seed(cfg.seed)
    model = workloads.get(cfg.model).builder(train_loader.num_classes).to(device)
    channels_last = device.type == "cpu" or cfg.precision != "fp32"
    model = model.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    base = model
    model = wrap_model(model) if wrap_model else model
    if cfg.optimizer == "lars":
        from dlscale.longtest.lars import make_lars

        opt = make_lars(model.parameters(), lr=sched.peak, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                        eta=cfg.lars_eta)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=sched.peak, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    amp = dev.autocast_dtype(cfg.precision)

    acc = {"train_time": 0.0, "eval_time": 0.0, "checkpoint_time": 0.0, "setup_time": 0.0, "samples": 0, "steps": 0}
    curve: list[dict[str, Any]] = []
    start_epoch, prior_s, resume_info = 0, 0.0, {}
    if cfg.resume:
        state = checkpoint.load(cfg.checkpoint_dir, key)
        base.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch, prior_s, curve, acc = state["epoch"], state["elapsed_s"], state["curve"], state["acc"]
        resume_info = {"resumed_from_epoch": start_epoch, "resume_gap": time.time() - state["saved_at"]}
    if mlog and not cfg.resume:
        mlog.init_stop_run_start()
    acc["setup_time"] += time.perf_counter() - t0

    def clock() -> float:  # seconds since the run started, across a resume
        return prior_s + time.perf_counter() - t0

    sync = lambda: (dev.synchronize(device), ranks.barrier())  # noqa: E731
    hit: dict[str, Any] | None = next((c for c in curve if c.get("reached")), None)
    try:
        for epoch in range(start_epoch, cfg.max_epochs):
            if hit:
                break
            torch.manual_seed(epoch_seed(cfg.seed, epoch))
            train_loader.epoch = epoch  # the sampler's shuffle is seeded by (seed, epoch)
            first_in_block = epoch % cfg.eval_every == 0
            if mlog:
                if first_in_block:
                    mlog.block_start(epoch + 1, min(cfg.eval_every, cfg.max_epochs - epoch))
                mlog.epoch_start(epoch + 1)
            sync()
            te = time.perf_counter()
            r = train_epoch(model, opt, train_loader, device, lambda s: sched.lr(s, steps_per_epoch),
                            epoch * steps_per_epoch, cfg.label_smoothing, amp, channels_last)
            sync()
            dt = time.perf_counter() - te
            acc["train_time"] += dt
            acc["samples"] += r.samples * ranks.world
            acc["steps"] += r.steps
            if mlog:
                mlog.epoch_stop(epoch + 1)
            point: dict[str, Any] = {
                "epoch": epoch + 1, "train_s": acc["train_time"], "epoch_train_s": dt,
                "throughput": r.samples * ranks.world / dt, "train_loss": _mean_over_ranks(r, ranks),
                "lr": opt.param_groups[0]["lr"], "top1": None, "top5": None, "loss": None, "eval_s": None,
            }
            if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.max_epochs:
                if mlog:
                    mlog.eval_start(epoch + 1)
                tv = time.perf_counter()
                ranks.sync_buffers(base)
                ev = evaluate(base, val_loader, device, val_limit, amp, channels_last, ranks.all_reduce)
                sync()
                point.update(top1=ev.top1, top5=ev.top5, loss=ev.loss, eval_s=time.perf_counter() - tv)
                acc["eval_time"] += point["eval_s"]
                if mlog:
                    mlog.eval_stop(epoch + 1, ev.top1)
                    mlog.block_stop(epoch + 1 - (epoch % cfg.eval_every))
                point["reached"] = reached(cfg, ev.top1, ev.top5)
            point["wall_s"] = clock()
            curve.append(point)
            if point.get("reached"):
                hit = point
            if on_epoch:
                on_epoch(point)
            if cfg.checkpoint_dir:
                tc = time.perf_counter()
                if ranks.rank == 0:
                    checkpoint.save_atomic({
                        "config_key": key, "epoch": epoch + 1, "model": base.state_dict(),
                        "optimizer": opt.state_dict(), "curve": curve, "acc": acc, "elapsed_s": clock(),
                        "saved_at": time.time(),
                    }, cfg.checkpoint_dir)
                sync()
                acc["checkpoint_time"] += time.perf_counter() - tc
        if mlog:
            mlog.run_stop(success=hit is not None)
    except BaseException:
        if mlog:
            mlog.run_stop(success=False)
        raise
    finally:
        if mlog:
            mlog.close()
        train_loader.close()
        val_loader.close()
    out = _outcome(cfg, curve, hit, acc, clock(), steps_per_epoch, sched.peak, n_train, n_val, resume_info)
    out.config.update({"plain_resize": plain, "num_classes": train_loader.num_classes})
    if mlog and not any(c["top1"] is not None and c["top1"] >= RESNET_TARGET for c in curve):
        log_problems.append(f"no evaluation reached {RESNET_TARGET}, the checker's ResNet accuracy threshold")
    if log_problems:
        out.warnings.append(f"the MLPerf log {cfg.mlperf_log} will not pass the closed-division checker: "
                            + "; ".join(log_problems))
    return out


def _mean_over_ranks(r: Any, ranks: Ranks) -> float:
    if ranks.all_reduce is None or ranks.world == 1:
        return r.loss_mean
    import torch

    t = torch.tensor([r.loss_mean * r.steps, float(r.steps)], dtype=torch.float64)
    ranks.all_reduce(t)
    return (t[0] / t[1]).item()


def _outcome(cfg: TTAConfig, curve: list[dict[str, Any]], hit: dict[str, Any] | None, acc: dict[str, Any], wall: float,
             steps_per_epoch: int, peak_lr: float, n_train: int, n_val: int, resume_info: dict[str, Any]) -> Outcome:
    evals = [c for c in curve if c["top1"] is not None]
    last = evals[-1] if evals else {}
    metrics: dict[str, Any] = {
        "reached_target": hit is not None,
        "time_to_target": hit["wall_s"] if hit else None,
        "time_to_target_train": hit["train_s"] if hit else None,
        "epochs_to_target": hit["epoch"] if hit else None,
        "epochs_run": curve[-1]["epoch"] if curve else 0,
        "target_top1": cfg.target_top1, "target_top5": cfg.target_top5,
        "final_top1": last.get("top1"), "final_top5": last.get("top5"), "final_loss": last.get("loss"),
        "best_top1": max((c["top1"] for c in evals), default=None),
        "wall_time": wall, "train_time": acc["train_time"], "eval_time": acc["eval_time"],
        "checkpoint_time": acc["checkpoint_time"], "setup_time": acc["setup_time"],
        "throughput": acc["samples"] / acc["train_time"] if acc["train_time"] > 0 else None,
        "epoch_throughputs": [c["throughput"] for c in curve],
        "samples_per_epoch": steps_per_epoch * cfg.global_batch, "steps_per_epoch": steps_per_epoch,
        "global_batch": cfg.global_batch, "world_size": cfg.world_size, "peak_lr": peak_lr,
        "train_samples": n_train, "eval_samples": n_val, **resume_info,
    }
    warnings = []
    if hit is None:
        warnings.append(f"the target (top-1 {cfg.target_top1}"
                        f"{'' if cfg.target_top5 is None else f', top-5 {cfg.target_top5}'}) was not reached in "
                        f"{metrics['epochs_run']} epochs (best top-1 {metrics['best_top1']}); "
                        "raise --max-epochs or tune the LR")
    raw = {"curve": [{k: v for k, v in c.items() if k != "reached"} for c in curve]}
    return Outcome(metrics=metrics, units=dict(UNITS), raw=raw, warnings=warnings)
