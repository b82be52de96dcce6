"""``dlscale tta MODEL --data DIR --target-top1 X``: train to a target accuracy (time to accuracy)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dlscale.cli.common import DbOpt, Format, FormatOpt, TagOpt, info, out, print_json, warn

HELP = """Long test: train MODEL to a target accuracy and record the time to reach it.

Trains on an ImageNet-layout JPEG tree until the validation top-1 (and top-5) accuracy
reaches the target, evaluating every epoch (or every --eval-every epochs), and record the
accuracy/loss curve against epochs and wall-clock time, the time and epochs to target, and the
training throughput. The time-to-target clock runs from the run's start and includes set-up,
evaluation and checkpoints; each is also recorded on its own (docs/METRICS.md)."""

EPILOG = """Examples:\n\n
  dlscale dataset digits /tmp/digits\n\n
  dlscale tta tinycnn --data /tmp/digits --image-size 16 --target-top1 0.9 --max-epochs 10 --threads 1\n\n
  dlscale tta tinycnn --data /tmp/digits --image-size 16 --target-top1 0.9 --optimizer lars --lr 16 --lr-schedule poly --end-lr 0.0001 --warmup-epochs 1 --mlperf-log mlperf.log\n\n
  dlscale tta tinycnn --data /tmp/digits --image-size 16 --target-top1 0.9 --nproc-per-node 2\n\n
  dlscale tta resnet50 --data /data/imagenet --target-top1 0.759 --lr-schedule '0.4;10;0.04;60;0.004' --lr-scaling none --runs 5"""


def tta(
    model: Annotated[str, typer.Argument(help="Model name; `dlscale models` lists them.", show_default=False)],
    data: Annotated[str, typer.Option("--data", help="ROOT with ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg.", show_default=False)],
    target_top1: Annotated[float, typer.Option("--target-top1", help="Target validation top-1 accuracy, a fraction (0.759).", show_default=False)],
    target_top5: Annotated[Optional[float], typer.Option("--target-top5", help="Also require this top-5 accuracy (fraction).", show_default=False)] = None,
    max_epochs: Annotated[int, typer.Option("--max-epochs", help="Stop here if the target is not reached (also the schedule's length).")] = 90,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Evaluate every K epochs (and after the last).")] = 1,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Per-rank batch size.")] = 32,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Input size in pixels (default: the model's native).", show_default=False)] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="sgd (momentum) | lars.")] = "sgd",
    lr: Annotated[float, typer.Option("--lr", help="Base LR; the peak is lr x global batch / 256 under --lr-scaling linear.")] = 0.1,
    lr_scaling: Annotated[str, typer.Option("--lr-scaling", help="linear (lr x global batch / 256) | none.")] = "linear",
    lr_schedule: Annotated[str, typer.Option("--lr-schedule", help="cosine | poly | constant | piecewise 'lr;epoch;lr;...' (e.g. '0.4;10;0.04;60;0.004').")] = "cosine",
    warmup_epochs: Annotated[float, typer.Option("--warmup-epochs", help="Linear warm-up to the peak LR over this many epochs.")] = 0.0,
    end_lr: Annotated[float, typer.Option("--end-lr", help="Final LR of cosine/poly decay.")] = 0.0,
    poly_power: Annotated[float, typer.Option("--poly-power", help="Power of the poly decay.")] = 2.0,
    momentum: Annotated[float, typer.Option("--momentum")] = 0.9,
    weight_decay: Annotated[float, typer.Option("--weight-decay")] = 1e-4,
    lars_eta: Annotated[float, typer.Option("--lars-eta", help="LARS trust coefficient.")] = 0.001,
    label_smoothing: Annotated[float, typer.Option("--label-smoothing")] = 0.0,
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32 | tf32 | bf16 (autocast).")] = "fp32",
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    workers: Annotated[int, typer.Option("--workers", help="Data-loading worker processes per rank (0: decode in the training process, exact resume; use several on GPU servers).")] = 0,
    threads: Annotated[Optional[int], typer.Option("--threads", help="Torch threads per process (default: torch's; 1 for tiny models on a busy CPU).", show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights, shuffling and augmentation (run i of --runs uses seed + i).")] = 0,
    runs: Annotated[int, typer.Option("--runs", help="Independent runs; >= 3 adds MLPerf's olympic mean (drop fastest and slowest).")] = 1,
    mlperf_log: Annotated[Optional[str], typer.Option("--mlperf-log", help="Write MLPerf :::MLLOG lines here (rank 0; resnet, closed division).", show_default=False)] = None,
    checkpoint_dir: Annotated[Optional[str], typer.Option("--checkpoint-dir", help="Write an atomic checkpoint here after every epoch.", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from --checkpoint-dir's last checkpoint.")] = False,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", help="Data-parallel ranks per node (torchrun; gloo on CPU).")] = 1,
    nnodes: Annotated[int, typer.Option("--nnodes", help="Nodes in the job.")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", help="This node's rank (0 is the master).")] = 0,
    master_addr: Annotated[str, typer.Option("--master-addr", help="Address of node 0.")] = "127.0.0.1",
    master_port: Annotated[Optional[int], typer.Option("--master-port", help="Port on node 0 (default: a free one).", show_default=False)] = None,
    emulate_nodes: Annotated[Optional[int], typer.Option("--emulate-nodes", help="Run this many nodes on this machine in network namespaces (root).", show_default=False)] = None,
    link_bandwidth: Annotated[Optional[str], typer.Option("--link-bandwidth", help="Emulated inter-node link rate, e.g. 10gbit.", show_default=False)] = None,
    link_latency: Annotated[Optional[str], typer.Option("--link-latency", help="Emulated inter-node latency, e.g. 1ms.", show_default=False)] = None,
    tag: TagOpt = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dataclasses import replace
    from pathlib import Path

    from dlscale.errors import RunFailure, UsageError
    from dlscale.longtest.config import TTAConfig
    from dlscale.store import Store

    cfg = TTAConfig(
        model=model, data=data, target_top1=target_top1, target_top5=target_top5, max_epochs=max_epochs,
        eval_every=eval_every, batch_size=batch_size, image_size=image_size, optimizer=optimizer, lr=lr,
        lr_scaling=lr_scaling, lr_schedule=lr_schedule, warmup_epochs=warmup_epochs, end_lr=end_lr,
        poly_power=poly_power, momentum=momentum, weight_decay=weight_decay, lars_eta=lars_eta,
        label_smoothing=label_smoothing, precision=precision, device=device, workers=workers, threads=threads,
        seed=seed, runs=runs, mlperf_log=mlperf_log, checkpoint_dir=checkpoint_dir, resume=resume,
        nproc_per_node=nproc_per_node, nnodes=nnodes, emulate_nodes=emulate_nodes, tag=tag,
    )
    store = Store.open(db)  # an unwritable database is a usage error before any work
    _check_data(data)
    if resume:
        from dlscale.longtest.checkpoint import checkpoint_path

        if not checkpoint_path(checkpoint_dir).is_file():
            raise UsageError(f"--resume: no checkpoint at {checkpoint_path(checkpoint_dir)}; "
                             "run without --resume to start from scratch")
    dist = dict(node_rank=node_rank, master_addr=master_addr, master_port=master_port,
                link_bandwidth=link_bandwidth, link_latency=link_latency)
    recs = []
    for i in range(runs):
        run_cfg = cfg if runs == 1 else replace(
            cfg, seed=seed + i,
            mlperf_log=_nth(mlperf_log, i),
            checkpoint_dir=str(Path(checkpoint_dir) / f"run{i}") if checkpoint_dir else None,
        )
        if runs > 1:
            info(f"run {i + 1} of {runs} (seed {run_cfg.seed})")
        try:
            rec = run_one(run_cfg, store, dist)
        except RunFailure as e:
            if fmt == Format.json and e.run_id:
                print_json(store.get(e.run_id).to_dict())
            raise
        if rec is not None:
            recs.append(rec)
            report(rec, fmt if runs == 1 else Format.human, quiet=fmt == Format.json and runs > 1)
    if runs > 1 and recs:
        summary = olympic_record(cfg, recs, store)
        if fmt == Format.json:
            print_json({"runs": [r.to_dict() for r in recs], "olympic": summary.to_dict()})
        else:
            out.print(_olympic_table(summary))


def _check_data(root: str) -> None:
    """Both splits exist with the same class folders, before any process starts (else a UsageError)."""
    from pathlib import Path

    from dlscale.errors import UsageError

    classes = []
    for split in ("train", "val"):
        base = Path(root) / split
        if not base.is_dir():
            raise UsageError(f"{base} is not a directory; expected the ImageNet layout ROOT/{split}/<class>/*.jpg "
                             "(`dlscale dataset digits ROOT` makes a small real one)")
        classes.append(sorted(d.name for d in base.iterdir() if d.is_dir()))
    if not classes[0] or classes[0] != classes[1]:
        raise UsageError(f"{root}: train/ and val/ must hold the same, non-empty set of class folders")


def _nth(path: str | None, i: int) -> str | None:
    if not path:
        return None
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}_{i}{p.suffix}"))


def device_name(device: Any, world: int = 1) -> str:
    from dlscale.train.shorttest import _device_name

    return f"{world}x{_device_name(device)}"


def add_reference(out: Any, config: dict[str, Any], store: Any) -> None:
    """Speed-up over the single-node run of the same config, split into throughput and epochs."""
    from dlscale.longtest.aggregate import find_reference, speedup_split

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


def run_one(cfg: Any, store: Any, dist: dict[str, Any]) -> Any:
    """One run, in this process or through torchrun; returns rank 0's record (None off node 0)."""
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.system import collect_cached

    if cfg.world_size > 1 or cfg.emulate_nodes:
        return _run_distributed(cfg, store, dist)
    device = dev.select_device(cfg.device)
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    info(f"dlscale tta {resolved.model}: target top-1 {resolved.target_top1}, batch {resolved.batch_size}, "
         f"{resolved.image_size}px, up to {resolved.max_epochs} epochs, on {device}")

    def body(_rec: Any) -> Any:
        from dlscale.longtest.tta import run_tta

        return run_tta(resolved, device, platform=device_name(device), on_epoch=epoch_line)

    return execute(kind="tta", workload=resolved.model, config=resolved.to_dict(), tag=resolved.tag,
                   store=store, system=collect_cached(), body=body)


def _run_distributed(cfg: Any, store: Any, dist: dict[str, Any]) -> Any:
    import shutil
    import tempfile
    from dataclasses import asdict

    from dlscale.distributed import faults
    from dlscale.distributed.launch import run_torchrun
    from dlscale.errors import RunFailure, UsageError
    from dlscale.longtest.worker import MODULE, worker_args

    job_dir = tempfile.mkdtemp(prefix="dlscale-tta-")
    info(f"dlscale tta {cfg.model}: {cfg.world_size} ranks ({cfg.nodes} node(s) x {cfg.nproc_per_node}), "
         f"global batch {cfg.global_batch}, target top-1 {cfg.target_top1}")
    try:
        code = run_torchrun(MODULE, worker_args(asdict(cfg), str(store.path), job_dir),
                            nproc_per_node=cfg.nproc_per_node, nnodes=cfg.nnodes, node_rank=dist["node_rank"],
                            master_addr=dist["master_addr"], master_port=dist["master_port"],
                            emulate_nodes=cfg.emulate_nodes, link_bandwidth=dist["link_bandwidth"],
                            link_latency=dist["link_latency"])
        run_id = faults.read_run_id(job_dir)
        failures = faults.read_failures(job_dir)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    if code == 0:
        return store.get(run_id) if run_id else None
    causes = [f"rank {f['rank']}: {f['cause']}" for f in failures if f.get("kind") == "error"] or \
             [f"rank {f['rank']}: {f['cause']}" for f in failures] or [f"torchrun exited with code {code}"]
    if code == 2 and not run_id:
        raise UsageError(causes[0].split(": ", 1)[-1])
    raise RunFailure(f"run {run_id or '(not recorded)'} failed: {causes[0]}", run_id=run_id)


def epoch_line(p: dict[str, Any]) -> None:
    acc = "" if p["top1"] is None else f", top-1 {p['top1']:.4f}, top-5 {p['top5']:.4f}, val loss {p['loss']:.4f}"
    info(f"epoch {p['epoch']}: {p['wall_s']:.2f} s since start, train loss {p['train_loss']:.4f}, "
         f"{p['throughput']:.1f} samples/s{acc}")


def olympic_record(cfg: Any, recs: list[Any], store: Any) -> Any:
    """MLPerf's aggregate over --runs: drop the fastest and slowest time to target, average the rest."""
    from dlscale.harness.runner import Outcome, execute
    from dlscale.longtest.aggregate import olympic_mean

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


def report(rec: Any, fmt: Format, quiet: bool = False) -> None:
    for w in rec.warnings:
        warn(w)
    if quiet:
        return
    if fmt == Format.json:
        print_json(rec.to_dict())
    else:
        out.print(_summary_table(rec))


def _summary_table(rec: Any) -> Any:
    from rich.table import Table

    from dlscale.cli.render import fmt_num, fmt_pct, fmt_seconds

    m, c = rec.metrics, rec.config
    t = Table(title=f"dlscale tta {rec.workload}  [{rec.status}]", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("run id", rec.run_id)
    t.add_row("config", f"batch {c.get('batch_size')} x {c.get('world_size')} rank(s) = {c.get('global_batch')}, "
              f"{c.get('image_size')}px, {c.get('optimizer')}, lr schedule {c.get('lr_schedule')}, peak lr {fmt_num(m.get('peak_lr'))}")
    target = f"top-1 {fmt_pct(c.get('target_top1'))}" + ("" if c.get("target_top5") is None else f", top-5 {fmt_pct(c['target_top5'])}")
    if m.get("reached_target"):
        t.add_row("time to target", f"[bold]{fmt_seconds(m['time_to_target'])}[/bold] ({target}) in {m['epochs_to_target']} epochs")
    else:
        t.add_row("time to target", f"[yellow]not reached[/yellow] ({target}) in {m.get('epochs_run')} epochs")
    ckpt = fmt_seconds(m.get("checkpoint_time")) if c.get("checkpoint_dir") else "none written"
    t.add_row("of which", f"training {fmt_seconds(m.get('train_time'))}, evaluation {fmt_seconds(m.get('eval_time'))}, "
              f"checkpoints {ckpt}, set-up {fmt_seconds(m.get('setup_time'))}")
    t.add_row("final top-1 / top-5", f"{fmt_pct(m.get('final_top1'))} / {fmt_pct(m.get('final_top5'))}")
    t.add_row("training throughput", f"{fmt_num(m.get('throughput'))} samples/s")
    if m.get("speedup") is not None:
        t.add_row("speed-up vs 1 node", f"{m['speedup']:.2f}x = throughput {m['throughput_speedup']:.2f}x "
                  f"x epochs {m['epochs_ratio']:.2f} (+ eval/set-up)  [ref {m['reference_run_id']}]")
    if m.get("resumed_from_epoch") is not None:
        t.add_row("resumed", f"from epoch {m['resumed_from_epoch']} ({fmt_seconds(m.get('resume_gap'))} after its checkpoint)")
    return t


def summary_tables(rec: Any) -> list[Any]:
    """The headline figures and the accuracy curve of one tta record (for `dlscale results show`)."""
    from rich.table import Table

    from dlscale.cli.render import fmt_num, fmt_pct, fmt_seconds

    t = Table("epoch", "wall (s)", "train (s)", "train loss", "lr", "top-1", "top-5", "val loss", "eval",
              title="accuracy curve", title_justify="left")
    for c in rec.raw.get("curve", []):
        t.add_row(str(c["epoch"]), f"{c['wall_s']:.2f}", f"{c['train_s']:.2f}", fmt_num(c["train_loss"]),
                  fmt_num(c["lr"]), fmt_pct(c["top1"]), fmt_pct(c["top5"]), fmt_num(c["loss"]), fmt_seconds(c["eval_s"]))
    return [_summary_table(rec), t]


def _olympic_table(rec: Any) -> Any:
    from rich.table import Table

    from dlscale.cli.render import fmt_seconds

    t = Table(title=f"olympic mean over {rec.metrics['runs']} runs  [{rec.run_id}]", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("times to target", ", ".join(fmt_seconds(x) for x in rec.raw["times_to_target"]))
    t.add_row("olympic time to target", fmt_seconds(rec.metrics.get("olympic_time_to_target")))
    return t


def digits(
    root: Annotated[str, typer.Argument(help="Directory to write ROOT/train and ROOT/val into.", show_default=False)],
    size: Annotated[int, typer.Option("--size", help="Image size in pixels (the digits are 8x8; upscaled).")] = 16,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Fraction of each class held out for validation.")] = 0.2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the train/val split.")] = 0,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.longtest.digits import make_digits

    summary = make_digits(root, size=size, val_fraction=val_fraction, seed=seed)
    if fmt == Format.json:
        print_json(summary)
    else:
        out.print(f"{summary['root']}: {summary['train']} train + {summary['val']} val images, "
                  f"{summary['classes']} classes, {summary['size']}px (scikit-learn's handwritten digits)")


DIGITS_HELP = ("Write scikit-learn's handwritten digits (1,797 real 8x8 images, 10 classes, shipped with the "
               "package; nothing downloaded) as an ImageNet-layout JPEG tree for time-to-accuracy tests. "
               "tinycnn reaches 90% top-1 on it in a few epochs.")
