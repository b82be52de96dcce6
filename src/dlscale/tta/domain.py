"""Train a model of any family beyond image classification to a target of its task's quality
metric (``dlscale tta``, kind ``tta``): the loop every ``tta.tasks.Task`` runs in.

It keeps image classification's rules (tta/classifier.py): the clock starts when the body starts
and runs on the wall through data set-up, training, every evaluation and every checkpoint;
each epoch on each rank is seeded from (seed, epoch, rank), so a run resumed from its checkpoint
repeats what the uninterrupted run would have done; evaluation follows every ``eval_every``-th
epoch and the last. The task supplies the data, the model, the batches, the loss and the metric;
this module owns the optimizer step, the LR schedule, throughput in the family's unit, the
target check, the checkpoints, the MLPerf log and the figures. Evaluation is sharded: every rank
evaluates its share of the validation set, the parts (sums where the metric is a sum over
samples, predictions where it is not, as mAP and BLEU) are gathered to every rank, and every rank
combines them into the same figures, so every rank stops at the same epoch and no rank waits in a
collective while another evaluates (a COCO or C4 evaluation can outlast the collective timeout).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlscale.format import fmt_count
from dlscale.harness import device as dev
from dlscale.harness.runner import NonFiniteLoss, Outcome
from dlscale.tta import checkpoint
from dlscale.tta.config import TTAConfig, same_config_key
from dlscale.tta.epochs import Progress, Ranks, add_energy, epoch_seed, resume_progress, run_epochs
from dlscale.tta.tasks import EpochContext, Task, TaskData

UNITS = {
    "time_to_target": "s", "time_to_target_train": "s", "epochs_to_target": "epochs", "epochs_run": "epochs",
    "wall_time": "s", "train_time": "s", "eval_time": "s", "checkpoint_time": "s", "setup_time": "s",
    "steps_per_epoch": "steps", "world_size": "ranks", "peak_lr": "lr", "train_samples": "samples",
    "eval_samples": "samples", "resumed_from_epoch": "epochs", "resume_gap": "s", "lost_time": "s",
    "final_loss": "nats",
}


@dataclass
class DomainSetup:
    """Everything one run trains with, built once by ``build_setup``."""

    cfg: TTAConfig
    task: Task
    data: TaskData
    device: Any
    ranks: Ranks
    model: Any  # what trains (DDP-wrapped on several ranks)
    base: Any  # the bare module: evaluated, checkpointed, and what RL rollouts act with
    opt: Any
    sched: Any
    steps_per_epoch: int
    amp: Any
    key: str
    progress: Progress
    mlog: Any = None
    log_problems: list[str] = field(default_factory=list)

    def sync(self) -> None:
        dev.synchronize(self.device)
        self.ranks.barrier()

    def close(self) -> None:
        if self.mlog:
            self.mlog.close()


def rank_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of epoch ``epoch`` (0-based) on ``rank``: distinct per rank and per epoch."""
    return epoch_seed(seed, epoch) * 1009 + rank


def run_domain(cfg: TTAConfig, device: Any, ranks: Ranks | None = None,
               wrap_model: Callable[[Any, Task], Any] | None = None, platform: str = "cpu",
               on_epoch: Callable[[dict[str, Any]], None] | None = None, data: TaskData | None = None,
               t0: float | None = None) -> Outcome:
    """Train ``cfg`` (resolved) until its task's target or ``max_epochs``; the run's figures.

    ``data`` is the task's data when the caller already opened it (on the clock from ``t0``).
    """
    import torch

    t0 = time.perf_counter() if t0 is None else t0
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        with dev.run_flags(cfg.precision, device):  # the precision's TF32 and cuDNN flags, restored after the run
            s = build_setup(cfg, device, ranks or Ranks(), wrap_model, platform, data, t0)
            run_epochs(s, train_one_epoch, evaluate_point, on_epoch)
            return assemble_outcome(s)
    finally:
        torch.set_num_threads(threads)


def build_setup(cfg: TTAConfig, device: Any, ranks: Ranks, wrap_model: Callable[[Any, Task], Any] | None,
                platform: str, data: TaskData | None, t0: float) -> DomainSetup:
    """Data, model, optimizer, schedule, MLPerf header and the resumed state if any."""
    import torch

    from dlscale.tta import tasks

    task = tasks.get(cfg.family)
    key = same_config_key(cfg.to_dict())
    state = checkpoint.load(cfg.checkpoint_dir, key) if cfg.resume else None
    data = data if data is not None else task.open(cfg.data, cfg)
    if ranks.rank == 0:
        from dlscale.log import info

        info(f"data: {data.describe}")
    steps = task.steps_per_epoch(data, cfg)
    if steps <= 0:
        raise RuntimeError(f"{cfg.data}: one epoch gives no step at --batch-size {cfg.batch_size} on "
                           f"{cfg.world_size} rank(s); lower --batch-size")
    sched = cfg.schedule()
    torch.manual_seed(cfg.seed)
    base = task.build_model(cfg, data).to(device)
    model = wrap_model(base, task) if wrap_model else base
    s = DomainSetup(cfg=cfg, task=task, data=data, device=device, ranks=ranks, model=model, base=base,
                    opt=make_optimizer(cfg, model, sched.peak, task), sched=sched, steps_per_epoch=steps,
                    amp=dev.autocast_dtype(cfg.precision), key=key, progress=Progress(t0=t0))
    resume_problems = _open_mlperf_log(s, platform, state) if ranks.rank == 0 and cfg.mlperf_log else []
    if state is not None:
        s.progress = resume_progress(s, state, t0, resume_problems)
    elif s.mlog:
        s.mlog.init_stop_run_start()
    s.progress.acc["setup_time"] += time.perf_counter() - t0
    return s


def make_optimizer(cfg: TTAConfig, model: Any, lr: float, task: Task) -> Any:
    """sgd (momentum), adam or adamw (with the task's betas and epsilon) over every trainable
    parameter, at the schedule's peak LR."""
    import torch

    params = [q for q in model.parameters() if q.requires_grad]
    if cfg.optimizer in ("adam", "adamw"):
        cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
        return cls(params, lr=lr, betas=task.adam_betas, eps=task.adam_eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _open_mlperf_log(s: DomainSetup, platform: str, state: dict[str, Any] | None) -> list[str]:
    """Rank 0's MLPerf log (open division) with its header (continued after --resume), and the
    closed-division rules broken; why a resumed log cannot pass the checker."""
    cfg, task = s.cfg, s.task
    s.log_problems = task.closed_division_problems(cfg, s.sched.peak, s.data, s.steps_per_epoch)
    if s.log_problems:  # said before the run starts, and again in the record's warnings
        from dlscale.log import warn

        warn(f"{cfg.mlperf_log}: open division; the closed division would refuse: " + "; ".join(s.log_problems))
    from dlscale.tta.mlperf import open_log

    s.mlog, resume_problems = open_log(cfg, state)
    if not cfg.resume:
        s.mlog.domain_header(task.mlperf_benchmark_for(cfg), platform, cfg, s.data.n_train, s.data.n_eval,
                             task.mlperf_hparams(cfg, s.sched.peak, s.data, s.steps_per_epoch))
    return resume_problems


def context(s: DomainSetup, epoch: int, seed: int) -> EpochContext:
    return EpochContext(epoch=epoch, seed=seed, rank=s.ranks.rank, world=s.ranks.world, device=s.device,
                        cfg=s.cfg, amp=s.amp)


def train_one_epoch(s: DomainSetup, epoch: int) -> dict[str, Any]:
    """Train epoch ``epoch`` (0-based) on this rank's batches; its curve point, not yet evaluated."""
    import torch

    cfg, acc, mlog = s.cfg, s.progress.acc, s.mlog
    seed = rank_seed(cfg.seed, epoch, s.ranks.rank)
    torch.manual_seed(seed)
    if mlog:
        if epoch % cfg.eval_every == 0:
            mlog.block_start(epoch + 1, min(cfg.eval_every, cfg.max_epochs - epoch))
        mlog.epoch_start(epoch + 1)
    s.sync()
    te = time.perf_counter()
    loss_mean, units, steps = _train_steps(s, context(s, epoch, seed), epoch * s.steps_per_epoch)
    s.sync()
    dt = time.perf_counter() - te
    units_all = _sum_over_ranks(s.ranks, [float(units), loss_mean * steps, float(steps)])
    acc["train_time"] += dt
    acc["samples"] += int(units_all[0])
    acc["steps"] += steps
    if mlog:
        mlog.epoch_stop(epoch + 1)
    return {"epoch": epoch + 1, "train_s": acc["train_time"], "epoch_train_s": dt, "throughput": units_all[0] / dt,
            "train_loss": units_all[1] / units_all[2], "lr": s.opt.param_groups[0]["lr"], "quality": None,
            "figures": None, "eval_s": None}


def _train_steps(s: DomainSetup, ctx: EpochContext, first_step: int) -> tuple[float, int, int]:
    """The optimizer steps of one epoch; (mean loss, sample units, steps) on this rank."""
    import torch

    task, opt, device = s.task, s.opt, s.device
    s.model.train()
    loss_sum = torch.zeros((), device=device)
    steps = units = 0
    for batch in task.batches(s.data, s.base, ctx):
        for group in opt.param_groups:
            group["lr"] = s.sched.lr(first_step + steps, s.steps_per_epoch)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=s.amp, enabled=s.amp is not None):
            loss = task.loss(s.model, batch)
        loss.float().backward()
        if task.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(s.model.parameters(), task.clip_grad_norm)
        opt.step()
        loss_sum += loss.detach().float()
        steps += 1
        units += task.units(batch)
    if steps != s.steps_per_epoch:
        raise RuntimeError(f"the {task.family} task gave {steps} batches in epoch {ctx.epoch + 1} on rank "
                           f"{ctx.rank}, not the {s.steps_per_epoch} it promised (every rank must step alike)")
    mean = (loss_sum / steps).item()
    if mean != mean or mean in (float("inf"), float("-inf")):
        raise NonFiniteLoss(f"training loss became {mean} in epoch {ctx.epoch + 1}")
    return mean, units, steps


def _sum_over_ranks(ranks: Ranks, values: list[float]) -> list[float]:
    if ranks.all_reduce is None or ranks.world == 1:
        return values
    import torch

    t = torch.tensor(values, dtype=torch.float64)
    ranks.all_reduce(t)
    return t.tolist()


def evaluate_point(s: DomainSetup, epoch: int, point: dict[str, Any]) -> None:
    """Every rank evaluates its share of the validation set on its bare model (rank 0's buffers);
    the parts are gathered to every rank, and every rank combines them into the same figures."""
    import torch

    cfg, task, mlog = s.cfg, s.task, s.mlog
    if mlog:
        mlog.eval_start(epoch + 1)
    tv = time.perf_counter()
    s.ranks.sync_buffers(s.base)
    s.base.eval()
    with torch.no_grad():
        part = task.evaluate_shard(s.base, s.data, context(s, epoch, cfg.seed))
    s.base.train()
    figures = {k: v if isinstance(v, int) and not isinstance(v, bool) else float(v)  # counts stay counts
               for k, v in task.combine(s.ranks.all_gather(part), s.data).items()}
    if task.metric not in figures:
        raise RuntimeError(f"the {task.family} task's evaluation gave no {task.metric!r}")
    value = figures[task.metric]
    s.sync()
    point.update(quality=value, figures=figures, eval_s=time.perf_counter() - tv)
    s.progress.acc["eval_time"] += point["eval_s"]
    if mlog:
        mlog.eval_stop(epoch + 1, task.mlperf_accuracy(figures))
        mlog.block_stop(epoch + 1 - (epoch % cfg.eval_every))
    point["reached"] = task.reached(value, cfg.target)


def assemble_outcome(s: DomainSetup) -> Outcome:
    """The run's figures: time and epochs to target, quality, throughput in the family's unit."""
    from dlscale.workloads.base import FAMILIES

    cfg, task, p = s.cfg, s.task, s.progress
    unit = FAMILIES[task.family]
    evals = [c for c in p.curve if c["quality"] is not None]
    best = (max if task.higher_is_better else min)((c["quality"] for c in evals), default=None)
    hit, acc = p.hit, p.acc
    m: dict[str, Any] = {
        "reached_target": hit is not None, "time_to_target": hit["wall_s"] if hit else None,
        "time_to_target_train": hit["train_s"] if hit else None, "epochs_to_target": hit["epoch"] if hit else None,
        "epochs_run": p.curve[-1]["epoch"] if p.curve else 0, "target": cfg.target,
        "final_quality": evals[-1]["quality"] if evals else None, "best_quality": best,
        "final_loss": p.curve[-1]["train_loss"] if p.curve else None,
        "wall_time": p.clock(), "train_time": acc["train_time"], "eval_time": acc["eval_time"],
        "checkpoint_time": acc["checkpoint_time"], "setup_time": acc["setup_time"],
        "throughput": acc["samples"] / acc["train_time"] if acc["train_time"] > 0 else None,
        "epoch_throughputs": [c["throughput"] for c in p.curve], "steps_per_epoch": s.steps_per_epoch,
        "global_batch": cfg.global_batch, "world_size": cfg.world_size, "peak_lr": s.sched.peak,
        "train_samples": s.data.n_train, "eval_samples": s.data.n_eval, **p.resume_info,
    }
    units = {**UNITS, "target": task.metric_unit, "final_quality": task.metric_unit, "best_quality": task.metric_unit,
             "throughput": f"{unit}/s", "epoch_throughputs": f"{unit}/s", "global_batch": "samples"}
    for k, v in ((evals[-1]["figures"] or {}) if evals else {}).items():
        m[f"final_{k}"] = v
    out = Outcome(metrics=m, units=units, raw={"curve": [{k: v for k, v in c.items() if k != "reached"}
                                                         for c in p.curve]})
    out.config.update({"family": task.family, "sample_unit": unit, "quality_metric": task.metric,
                       "quality_label": task.metric_label, "quality_unit": task.metric_unit,
                       "higher_is_better": task.higher_is_better, "quality_library": task.library,
                       "data_info": s.data.info, "peak_lr": s.sched.peak})
    add_energy(out, p)
    _warn(s, out, best)
    return out


def _warn(s: DomainSetup, out: Outcome, best: float | None) -> None:
    cfg, task = s.cfg, s.task
    if s.progress.hit is None:
        out.warnings.append(f"the target ({task.metric_label} {cfg.target:g}) was not reached in "
                            f"{fmt_count(out.metrics['epochs_run'], 'epoch')} (best {best}); raise --max-epochs or tune the LR")
    problems = list(s.log_problems)
    if problems:
        out.warnings.append(f"the MLPerf log {cfg.mlperf_log} is open division; the closed division would refuse: "
                            + "; ".join(problems))
    out.warnings.extend(s.progress.notes)
