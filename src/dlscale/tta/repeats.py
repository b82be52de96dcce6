"""Time-to-accuracy runs end to end: one run here or on every rank of a layout, ``--runs`` and the
olympic aggregate, the speed-up over the single-node reference. ``api.tta`` calls ``run_all``.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError, on_interrupt
from dlscale.format import fmt_count
from dlscale.log import info


def check_data(root: str) -> None:
    """Both splits exist with the same class folders, before any process starts (else a UsageError)."""
    classes = []
    for split in ("train", "val"):
        base = Path(root) / split
        if not base.is_dir():
            raise UsageError(f"{base} is not a directory; expected the ImageNet layout ROOT/{split}/<class>/*.jpg "
                             "(`dlscale dataset digits ROOT` makes a small real one)")
        classes.append(sorted(d.name for d in base.iterdir() if d.is_dir()))
    if not classes[0] or classes[0] != classes[1]:
        raise UsageError(f"{root}: train/ and val/ must hold the same, non-empty set of class folders")


def check_resume(cfg: Any) -> None:
    """With --resume, a whole checkpoint must be there before any process starts (else a UsageError)."""
    if cfg.resume:
        from dlscale.tta.checkpoint import check_readable, checkpoint_path

        check_readable(checkpoint_path(cfg.checkpoint_dir))


def run_all(cfg: Any, layout: Any, store: Any, price: Any = None) -> list[Any]:
    """``cfg.runs`` runs (seed + i each), then the olympic record when runs > 1; the records
    (rank 0's; an empty list off node 0). ``price`` (cost.Price): each run's cost to the target."""
    if cfg.mlperf_log and layout.node_rank == 0:  # node 0's rank 0 writes it: a bad path now, not after the run
        check_logs(cfg, str(store.path))
    if cfg.family == "classification":
        check_data(cfg.data)
    elif layout.distributed:  # a malformed file is one line here, not one failure per rank
        from dlscale.tta import tasks

        tasks.get(cfg.family).open(cfg.data, cfg)
    check_resume(cfg)
    if cfg.family == "classification":
        info(f"lr: {cfg.lr_rule()}")
    else:
        info(f"lr: peak {cfg.peak_lr:g} ({cfg.optimizer}, {cfg.lr_schedule} schedule; no batch-size scaling)")
    recs = []
    for i in range(cfg.runs):
        run_cfg = cfg if cfg.runs == 1 else replace(
            cfg, seed=cfg.seed + i, mlperf_log=_nth(cfg.mlperf_log, i),
            checkpoint_dir=str(Path(cfg.checkpoint_dir) / f"run{i}") if cfg.checkpoint_dir else None)
        if cfg.runs > 1:
            info(f"run {i + 1} of {cfg.runs} (seed {run_cfg.seed})")
        with on_interrupt(lambda: interrupted(cfg, run_cfg, i)):
            rec = run_one(run_cfg, layout, store, price)
        if rec is not None:
            recs.append(rec)
    if cfg.runs > 1 and recs:
        recs.append(olympic_record(cfg, recs, store))
    return recs


def interrupted(cfg: Any, run_cfg: Any, i: int) -> str:
    """What a time-to-train run stopped by Ctrl-C kept (its run recorded as interrupted, its last
    checkpoint) and how to go on (``--resume`` from that checkpoint, else run it again)."""
    from dlscale.tta.checkpoint import checkpoint_path

    which = f"run {i + 1} of {cfg.runs}" if cfg.runs > 1 else "the run"
    head = f"tta {cfg.model}: {which} is recorded as interrupted"
    if cfg.runs > 1:
        done = f"; the {i} run(s) before it are recorded" if i else ""
        return f"{head}{done}; --runs does not resume: run the command again"
    if not run_cfg.checkpoint_dir:
        return f"{head}; no --checkpoint-dir, so nothing to resume from: run it again (with --checkpoint-dir DIR to " \
               "make it resumable)"
    if not checkpoint_path(run_cfg.checkpoint_dir).is_file():
        return f"{head}; it stopped before its first checkpoint in {run_cfg.checkpoint_dir}: run it again"
    return (f"{head}; its last checkpoint is in {run_cfg.checkpoint_dir}: resume with the same command and "
            "--resume")


def run_one(cfg: Any, layout: Any, store: Any, price: Any = None) -> Any:
    """One run, in this process or on every rank of the layout; rank 0's record (None off node 0)."""
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.system import collect_cached

    from dlscale.distributed.env import detect

    env = detect(master_addr=layout.master_addr, master_port=layout.master_port)
    if env is not None and not layout.distributed and cfg.world_size != env.world_size:
        cfg = replace(cfg, world_size=env.world_size)  # started by srun/mpirun/torchrun: the launcher's world
    if layout.distributed or env is not None:
        from dlscale.distributed.job import run_job

        info(f"dlscale tta {cfg.model}: {fmt_count(layout.world_size, 'rank')} ({fmt_count(layout.nodes, 'node')} x "
             f"{layout.nproc_per_node}), "
             f"global batch {cfg.global_batch}, target {target_words(cfg)}")
        return run_job("tta", asdict(cfg), layout, str(store.path), price)
    device = dev.select_device(cfg.device)
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    shape = f"{resolved.image_size}px, " if resolved.image_size else ""
    info(f"dlscale tta {resolved.model}: target {target_words(resolved)}, batch {resolved.batch_size}, "
         f"{shape}up to {fmt_count(resolved.max_epochs, 'epoch')}, on {device}")

    def body(_rec: Any) -> Any:
        if resolved.family != "classification":
            from dlscale.tta.domain import run_domain

            return run_domain(resolved, device, platform=platform_name(device), on_epoch=epoch_line)
        from dlscale.tta.classifier import run_tta

        return run_tta(resolved, device, platform=platform_name(device), on_epoch=epoch_line)

    return execute(kind="tta", workload=resolved.model, config=resolved.to_dict(), tag=resolved.tag,
                   store=store, system=collect_cached(), body=body, price=price)


def check_logs(cfg: Any, db: str) -> None:
    """Every run's --mlperf-log (``paths.check_output``): never the database or a database; an existing
    file only with --force or, continued, with --resume. Checked where rank 0 runs (the others do not write)."""
    from dlscale.distributed.env import detect
    from dlscale.paths import check_output, check_writable_file

    env = detect()
    for i in range(cfg.runs):
        path = cfg.mlperf_log if cfg.runs == 1 else _nth(cfg.mlperf_log, i)
        if env is None or env.rank == 0:
            check_output(path, "--mlperf-log", db=db, force=cfg.force, append=cfg.resume)
        else:
            check_writable_file(path, "--mlperf-log")


def _nth(path: str | None, i: int) -> str | None:
    if not path:
        return None
    p = Path(path)
    return str(p.with_name(f"{p.stem}_{i}{p.suffix}"))


def platform_name(device: Any, world: int = 1) -> str:
    """MLPerf's platform string: ranks x device name."""
    from dlscale.harness.device import device_name

    return f"{world}x{device_name(device)}"


def add_reference(out: Any, config: dict[str, Any], store: Any) -> None:
    """Speed-up over the single-node run of the same config, split into throughput and epochs."""
    from dlscale.tta.aggregate import find_reference, speedup_split

    m = out.metrics
    if config.get("world_size", 1) == 1 or m.get("time_to_target") is None:
        return
    ref = find_reference(store, config)
    if ref is None:
        out.warnings.append("no single-node tta run of the same config in the store: speed-up not computed "
                            "(run it with --nproc-per-node/--nnodes 1 first)")
        return
    r = ref.metrics
    m.update(speedup_split(r["time_to_target"], r["throughput"], r["epochs_to_target"],
                           m["time_to_target"], m["throughput"], m["epochs_to_target"]))
    m["reference_run_id"] = ref.run_id
    out.units.update({"speedup": "x", "throughput_speedup": "x", "epochs_ratio": "x", "train_time_speedup": "x"})


def target_words(cfg: Any) -> str:
    """"top-1 0.9" for a classifier, "BLEU 30" for a translation model, ..."""
    if cfg.family == "classification":
        return f"top-1 {cfg.target_top1}" + ("" if cfg.target_top5 is None else f", top-5 {cfg.target_top5}")
    from dlscale.tta import tasks

    task = tasks.get(cfg.family)
    return f"{task.metric_label} {'>=' if task.higher_is_better else '<='} {cfg.target:g}"


def epoch_line(p: dict[str, Any]) -> None:
    if "quality" in p:  # another family's curve point
        figs = ", ".join(f"{k} {v:.4g}" for k, v in (p["figures"] or {}).items())
        info(f"epoch {p['epoch']}: {p['wall_s']:.2f} s since start, train loss {p['train_loss']:.4f}, "
             f"{p['throughput']:.1f} units/s" + (f", {figs}" if figs else ""))
        return
    acc = "" if p["top1"] is None else f", top-1 {p['top1']:.4f}, top-5 {p['top5']:.4f}, val loss {p['loss']:.4f}"
    info(f"epoch {p['epoch']}: {p['wall_s']:.2f} s since start, train loss {p['train_loss']:.4f}, "
         f"{p['throughput']:.1f} samples/s{acc}")


def olympic_record(cfg: Any, recs: list[Any], store: Any) -> Any:
    """MLPerf's aggregate over --runs: drop the fastest and slowest time to target, average the rest."""
    from dlscale.harness.runner import Outcome, execute
    from dlscale.tta.aggregate import olympic_mean

    times = [r.metrics.get("time_to_target") for r in recs]

    def body(_rec: Any) -> Any:
        m: dict[str, Any] = {"runs": len(recs), "runs_reached": sum(t is not None for t in times),
                             "olympic_time_to_target": olympic_mean(times) if len(recs) >= 3 else None}
        warnings = [] if len(recs) >= 3 else ["the olympic mean needs at least 3 runs"]
        if len(recs) >= 3 and m["olympic_time_to_target"] is None:
            warnings.append("two or more runs did not reach the target: no olympic mean")
        return Outcome(metrics=m, units={"runs": "runs", "runs_reached": "runs", "olympic_time_to_target": "s"},
                       raw={"run_ids": [r.run_id for r in recs], "times_to_target": times,
                            "seeds": [r.config.get("seed") for r in recs]}, warnings=warnings)

    return execute(kind="tta_olympic", workload=cfg.model, config=cfg.to_dict(), tag=cfg.tag, store=store, body=body)
