"""Train to a target accuracy and record the curve: the body of ``dlscale tta`` (kind ``tta``).

The clock starts when the body starts (dlscale's run start, once its Python modules are
imported) and runs on the wall: data-loader and model set-up, every training epoch, every
evaluation and every checkpoint write are inside ``time_to_target``. Evaluation, checkpoint
and set-up time are also recorded on their own, and ``time_to_target_train`` is training time
alone. Each epoch is seeded from (seed, epoch), so a
run resumed from a checkpoint repeats exactly what the uninterrupted run would have done.

A resumed run (``--resume``) goes on from its checkpoint's clock plus the time the interrupted
attempt spent after that checkpoint (its progress mark, tta/checkpoint.py): the lost work
counts in ``time_to_target`` and is recorded as ``lost_time``; its MLPerf log continues from the
checkpoint (tta/mlperf.py), or the run says before training why it cannot pass the checker.

Like the short test (train/shorttest.py), ``build_setup`` makes everything the run trains with
(loaders, schedule, MLPerf log, model, optimizer, resumed progress); the epoch loop every
time-to-quality run shares (tta/epochs.py) then calls one named step at a time
(``train_one_epoch``, ``evaluate_point``, ``log_point``, ``save_checkpoint``) until a curve point
reaches the target, and ``assemble_outcome`` turns the progress into the run's figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale import workloads
from dlscale.format import fmt_count
from dlscale.harness import device as dev
from dlscale.harness.runner import Outcome
from dlscale.tta import checkpoint
from dlscale.tta.config import TTAConfig, same_config_key
from dlscale.tta.epochs import Progress, Ranks, add_energy, epoch_seed, resume_progress, run_epochs
from dlscale.tta.loop import evaluate, train_epoch
from dlscale.tta.mlperf import RESNET_TARGET

UNITS = {
    "time_to_target": "s", "time_to_target_train": "s", "epochs_to_target": "epochs", "epochs_run": "epochs",
    "wall_time": "s", "train_time": "s", "eval_time": "s", "checkpoint_time": "s", "setup_time": "s",
    "throughput": "samples/s", "epoch_throughputs": "samples/s", "final_top1": "fraction", "final_top5": "fraction",
    "best_top1": "fraction", "final_loss": "nats", "target_top1": "fraction", "target_top5": "fraction",
    "samples_per_epoch": "samples", "steps_per_epoch": "steps", "global_batch": "samples", "world_size": "ranks",
    "peak_lr": "lr", "train_samples": "samples", "eval_samples": "samples", "resumed_from_epoch": "epochs",
    "resume_gap": "s", "lost_time": "s",
}
DIGITS_MARKER = "dlscale-digits.json"


@dataclass
class Setup:
    """Everything a time-to-accuracy run trains with, built once by ``build_setup``."""

    cfg: TTAConfig
    device: Any
    ranks: Ranks
    train_loader: Any
    val_loader: Any
    plain: bool  # tiny digits: resized, no crops or flips
    n_train: int
    n_val: int
    val_limit: int  # this rank's real (unpadded) validation samples
    steps_per_epoch: int
    sched: Any  # schedules.Schedule
    key: str  # same_config_key: a checkpoint resumes only the same config
    model: Any  # what trains (wrapped, e.g. in DDP)
    base: Any  # the bare module: evaluated and checkpointed
    opt: Any
    amp: Any  # autocast dtype or None
    channels_last: bool
    progress: Progress
    mlog: Any = None  # mlperf.MLPerfLog on rank 0 with --mlperf-log
    log_problems: list[str] = field(default_factory=list)  # closed-division rules the config breaks

    def sync(self) -> None:
        dev.synchronize(self.device)
        self.ranks.barrier()

    def close(self) -> None:
        if self.mlog:
            self.mlog.close()
        self.train_loader.close()
        self.val_loader.close()


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
    """Set up, train epoch by epoch until the target or ``max_epochs``, and assemble the figures."""
    with dev.run_flags(cfg.precision, device):  # the precision's TF32 and cuDNN flags, restored after the run
        s = build_setup(cfg, device, ranks, wrap_model, platform, t0)
        run_epochs(s, train_one_epoch, evaluate_point, on_epoch)
        return assemble_outcome(s)


def build_setup(cfg: TTAConfig, device: Any, ranks: Ranks, wrap_model: Callable[[Any], Any] | None, platform: str,
                t0: float) -> Setup:
    """Loaders, schedule, MLPerf log header, model and optimizer, and the resumed state if any.

    Set-up time (from ``t0``) is added to the run's ``setup_time``; the MLPerf run starts here.
    """
    import torch

    key = same_config_key(cfg.to_dict())
    state = checkpoint.load(cfg.checkpoint_dir, key) if cfg.resume else None
    plain = (Path(cfg.data) / DIGITS_MARKER).is_file()
    train_loader, val_loader = _loaders(cfg, ranks, plain)
    n_train, n_val = len(train_loader.loader.dataset), len(val_loader.loader.dataset)
    steps_per_epoch = len(train_loader)
    sched = cfg.schedule()
    mlog, log_problems, resume_problems = _mlperf_log(cfg, ranks, sched, steps_per_epoch, platform, n_train, n_val,
                                                      state)

    torch.manual_seed(cfg.seed)
    base = workloads.get(cfg.model).builder(train_loader.num_classes).to(device)
    channels_last = dev.default_channels_last(device.type, cfg.precision)
    base = base.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    model = wrap_model(base) if wrap_model else base
    s = Setup(cfg=cfg, device=device, ranks=ranks, train_loader=train_loader, val_loader=val_loader, plain=plain,
              n_train=n_train, n_val=n_val, val_limit=len(range(ranks.rank, n_val, ranks.world)),
              steps_per_epoch=steps_per_epoch, sched=sched, key=key, model=model,
              base=base, opt=_optimizer(cfg, model, sched.peak), amp=dev.autocast_dtype(cfg.precision),
              channels_last=channels_last, progress=Progress(t0=t0), mlog=mlog, log_problems=log_problems)
    if state is not None:
        s.progress = resume_progress(s, state, t0, resume_problems)
    elif mlog:
        mlog.init_stop_run_start()
    s.progress.acc["setup_time"] += time.perf_counter() - t0
    return s


def _loaders(cfg: TTAConfig, ranks: Ranks, plain: bool) -> tuple[Any, Any]:
    """This rank's shard of the training split, and of the validation split when there are several ranks."""
    from dlscale.data.loader import build_loader

    common = dict(batch_size=cfg.batch_size, image_size=cfg.image_size, workers=cfg.workers, plain_resize=plain,
                  seed=cfg.seed)
    train_loader = build_loader(cfg.data, "train", train=True, distributed=(ranks.rank, ranks.world), **common)
    val_shard = (ranks.rank, ranks.world) if ranks.world > 1 else None
    val_loader = build_loader(cfg.data, "val", train=False, distributed=val_shard, **common)
    if val_loader.classes != train_loader.classes:
        raise RuntimeError(f"{cfg.data}: train and val have different class folders")
    return train_loader, val_loader


def _mlperf_log(cfg: TTAConfig, ranks: Ranks, sched: Any, steps_per_epoch: int, platform: str, n_train: int,
                n_val: int, state: dict[str, Any] | None) -> tuple[Any, list[str], list[str]]:
    """Rank 0's MLPerf log with its header written (continued after --resume), the rules it breaks,
    and why a resumed log cannot pass the checker."""
    if not cfg.mlperf_log or ranks.rank != 0:
        return None, [], []
    from dlscale.tta.mlperf import closed_division_problems, open_log

    mlog, resume_problems = open_log(cfg, state)
    if not cfg.resume:
        mlog.header(cfg, sched, steps_per_epoch, platform, n_train, n_val)
    return mlog, closed_division_problems(cfg, sched), resume_problems


def _optimizer(cfg: TTAConfig, model: Any, peak_lr: float) -> Any:
    import torch

    if cfg.optimizer == "lars":
        from dlscale.tta.lars import make_lars

        return make_lars(model.parameters(), lr=peak_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                         eta=cfg.lars_eta)
    return torch.optim.SGD(model.parameters(), lr=peak_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def train_one_epoch(s: Setup, epoch: int) -> dict[str, Any]:
    """Train epoch ``epoch`` (0-based), seeded from (seed, epoch); its curve point, not yet evaluated."""
    import torch

    cfg, acc, mlog = s.cfg, s.progress.acc, s.mlog
    torch.manual_seed(epoch_seed(cfg.seed, epoch))
    s.train_loader.epoch = epoch  # the sampler's shuffle is seeded by (seed, epoch)
    if mlog:
        if epoch % cfg.eval_every == 0:  # the first epoch of an evaluation block
            mlog.block_start(epoch + 1, min(cfg.eval_every, cfg.max_epochs - epoch))
        mlog.epoch_start(epoch + 1)
    s.sync()
    te = time.perf_counter()
    r = train_epoch(s.model, s.opt, s.train_loader, s.device, lambda step: s.sched.lr(step, s.steps_per_epoch),
                    epoch * s.steps_per_epoch, cfg.label_smoothing, s.amp, s.channels_last)
    s.sync()
    dt = time.perf_counter() - te
    acc["train_time"] += dt
    acc["samples"] += r.samples * s.ranks.world
    acc["steps"] += r.steps
    if mlog:
        mlog.epoch_stop(epoch + 1)
    return {
        "epoch": epoch + 1, "train_s": acc["train_time"], "epoch_train_s": dt,
        "throughput": r.samples * s.ranks.world / dt, "train_loss": _mean_over_ranks(r, s.ranks),
        "lr": s.opt.param_groups[0]["lr"], "top1": None, "top5": None, "loss": None, "eval_s": None,
    }


def evaluate_point(s: Setup, epoch: int, point: dict[str, Any]) -> None:
    """Evaluate rank 0's model over the whole validation split; fill ``point`` and check the target."""
    cfg, mlog = s.cfg, s.mlog
    if mlog:
        mlog.eval_start(epoch + 1)
    tv = time.perf_counter()
    s.ranks.sync_buffers(s.base)
    ev = evaluate(s.base, s.val_loader, s.device, s.val_limit, s.amp, s.channels_last, s.ranks.all_reduce)
    s.sync()
    point.update(top1=ev.top1, top5=ev.top5, loss=ev.loss, eval_s=time.perf_counter() - tv)
    s.progress.acc["eval_time"] += point["eval_s"]
    if mlog:
        mlog.eval_stop(epoch + 1, ev.top1)
        mlog.block_stop(epoch + 1 - (epoch % cfg.eval_every))
    point["reached"] = reached(cfg, ev.top1, ev.top5)


def assemble_outcome(s: Setup) -> Outcome:
    """The run's figures from its progress; the applied LR rule and data settings join the config."""
    cfg, p = s.cfg, s.progress
    out = _outcome(cfg, p.curve, p.hit, p.acc, p.clock(), s.steps_per_epoch, s.sched.peak, s.n_train, s.n_val,
                   p.resume_info)
    out.config.update({"plain_resize": s.plain, "num_classes": s.train_loader.num_classes,
                       "peak_lr": s.sched.peak, "lr_rule": cfg.lr_rule()})
    add_energy(out, p)
    problems = list(s.log_problems)
    if s.mlog and not any(c["top1"] is not None and c["top1"] >= RESNET_TARGET for c in p.curve):
        problems.append(f"no evaluation reached {RESNET_TARGET}, the checker's ResNet accuracy threshold")
    if problems:
        out.warnings.append(f"the MLPerf log {cfg.mlperf_log} will not pass the closed-division checker: "
                            + "; ".join(problems))
    out.warnings.extend(p.notes)
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
                        f"{fmt_count(metrics['epochs_run'], 'epoch')} (best top-1 {metrics['best_top1']}); "
                        "raise --max-epochs or tune the LR")
    raw = {"curve": [{k: v for k, v in c.items() if k != "reached"} for c in curve]}
    return Outcome(metrics=metrics, units=dict(UNITS), raw=raw, warnings=warnings)
