"""``dlscale tta MODEL --data DIR --target-top1 X``: train to a target accuracy (time to accuracy)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dlscale.cli import costopts as copt
from dlscale.cli import distopts as dopt
from dlscale.cli.common import (DbOpt, Format, FormatOpt, TagOpt, config_options, info_done_elsewhere, out,
                                print_json, warn)
from dlscale.format import fmt_count

HELP = """Long test: train MODEL to a quality target and record the time to reach it.

An image classifier trains on an ImageNet-layout JPEG tree until its validation top-1 (and
top-5) accuracy reaches --target-top1. Every other family trains to --target of its domain's
metric: COCO mAP (detection), BLEU (translation), HR@10 (recommendation), validation
log-perplexity (LLM, lower is better) and mean episode return (reinforcement learning, --data
is a gymnasium environment id). `dlscale dataset DOMAIN DIR` makes a small dataset for each;
--data also reads the real datasets' layouts. Evaluation follows every epoch (or every
--eval-every epochs). The record holds the quality curve against epochs and wall-clock time, the
time and epochs to target, and the training throughput. The time-to-target clock runs from the
run's start and includes set-up, evaluation and checkpoints; each is also recorded on its own
(docs/METRICS.md)."""

EPILOG = """Examples:\n\n
  dlscale dataset digits /tmp/digits\n\n
  dlscale tta tinycnn --data /tmp/digits --image-size 16 --target-top1 0.9 --max-epochs 10 --threads 1\n\n
  dlscale tta tinycnn --data /tmp/digits --image-size 16 --target-top1 0.9 --optimizer lars --lr 16 --lr-schedule poly --end-lr 0.0001 --warmup-epochs 1 --mlperf-log mlperf.log\n\n
  dlscale tta tinycnn --data /tmp/digits --image-size 16 --target-top1 0.9 --nproc-per-node 2\n\n
  dlscale tta resnet50 --data /data/imagenet --target-top1 0.759 --lr-schedule '0.4;10;0.04;60;0.004' --lr-scaling none --runs 5\n\n
  dlscale dataset translation /tmp/tr && dlscale tta transformer_tiny --data /tmp/tr\n\n
  dlscale tta ppo_mlp --data CartPole-v1 --target 475"""


def tta(
    model: Annotated[str, typer.Argument(help="Model name; `dlscale models` lists them.", show_default=False)],
    data: Annotated[Optional[str], typer.Option("--data", help="Classifiers: ROOT with ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg; other families: their dataset directory (`dlscale dataset DOMAIN`) or real layout; RL: a gymnasium environment id (default CartPole-v1).", show_default=False)] = None,
    target_top1: Annotated[Optional[float], typer.Option("--target-top1", help="Classifiers: target validation top-1 accuracy, a fraction (0.759).", show_default=False)] = None,
    target_top5: Annotated[Optional[float], typer.Option("--target-top5", help="Classifiers: also require this top-5 accuracy (fraction).", show_default=False)] = None,
    target: Annotated[Optional[float], typer.Option("--target", help="Other families: the target of the domain's metric (default: the domain's; `dlscale tta --help` lists them in docs/METRICS.md).", show_default=False)] = None,
    max_epochs: Annotated[Optional[int], typer.Option("--max-epochs", help="Stop here if the target is not reached (also the schedule's length; default 90 for classifiers, the domain's otherwise).", show_default=False)] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Evaluate every K epochs (and after the last).")] = 1,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", "-b", help="Per-rank batch size (default 32 for classifiers, the domain's otherwise).", show_default=False)] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="LLM context length in tokens (default: the task's).", show_default=False)] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="Translation/LLM: a local tokenizer file (default DATA/tokenizer.json).", show_default=False)] = None,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Input size in pixels (default: the model's native).", show_default=False)] = None,
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help="sgd (momentum) | lars (classifiers) | adam | adamw (default: sgd for classifiers, the domain's otherwise).", show_default=False)] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Base LR (default 0.1 for classifiers, the domain's otherwise); classifiers' peak is lr x global batch / 256 under --lr-scaling linear.", show_default=False)] = None,
    lr_scaling: Annotated[Optional[str], typer.Option("--lr-scaling", help="linear (lr x global batch / 256; classifiers' default) | none (other families).", show_default=False)] = None,
    lr_schedule: Annotated[Optional[str], typer.Option("--lr-schedule", help="cosine | poly | constant | piecewise 'lr;epoch;lr;...' (default: cosine for classifiers, the domain's otherwise).", show_default=False)] = None,
    warmup_epochs: Annotated[float, typer.Option("--warmup-epochs", help="Linear warm-up to the peak LR over this many epochs.")] = 0.0,
    end_lr: Annotated[float, typer.Option("--end-lr", help="Final LR of cosine/poly decay.")] = 0.0,
    poly_power: Annotated[float, typer.Option("--poly-power", help="Power of the poly decay.")] = 2.0,
    momentum: Annotated[float, typer.Option("--momentum")] = 0.9,
    weight_decay: Annotated[Optional[float], typer.Option("--weight-decay", help="Default 1e-4 for classifiers, the domain's otherwise.", show_default=False)] = None,
    lars_eta: Annotated[float, typer.Option("--lars-eta", help="LARS trust coefficient.")] = 0.001,
    label_smoothing: Annotated[float, typer.Option("--label-smoothing")] = 0.0,
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32 | tf32 | bf16 (autocast).")] = "fp32",
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    workers: Annotated[int, typer.Option("--workers", help="Data-loading worker processes per rank (0: decode in the training process, exact resume; use several on GPU servers).")] = 0,
    threads: Annotated[Optional[int], typer.Option("--threads", help="Torch threads per process (default: torch's; 1 for tiny models on a busy CPU).", show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights, shuffling and augmentation (run i of --runs uses seed + i).")] = 0,
    runs: Annotated[int, typer.Option("--runs", help="Independent runs; >= 3 adds MLPerf's olympic mean (drop fastest and slowest).")] = 1,
    mlperf_log: Annotated[Optional[str], typer.Option("--mlperf-log", help="Write MLPerf :::MLLOG lines here (rank 0; classifiers as resnet, closed division; other families as their benchmark, open division).", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --mlperf-log (never a database; --resume continues its own).")] = False,
    checkpoint_dir: Annotated[Optional[str], typer.Option("--checkpoint-dir", help="Write an atomic checkpoint here after every epoch.", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from --checkpoint-dir's last checkpoint.")] = False,
    nproc_per_node: dopt.NprocOpt = None,
    nnodes: dopt.NnodesOpt = 1,
    node_rank: dopt.NodeRankOpt = 0,
    master_addr: dopt.MasterAddrOpt = "127.0.0.1",
    master_port: dopt.MasterPortOpt = None,
    backend: dopt.BackendOpt = None,
    emulate_nodes: dopt.EmulateOpt = None,
    link_bandwidth: dopt.BandwidthOpt = None,
    link_latency: dopt.LatencyOpt = None,
    node_link_bandwidth: dopt.NodeBandwidthOpt = None,
    node_cpu_quota: dopt.NodeQuotaOpt = None,
    cpu_binding: dopt.CpuBindingOpt = True,
    timeout: dopt.TimeoutOpt = 300.0,
    tag: TagOpt = None,
    db: DbOpt = None,
    price_per_hour: copt.PriceOpt = None,
    systems_file: copt.SystemsFileOpt = None,
    system: copt.SystemOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    given = dict(locals())
    from dlscale import api
    from dlscale.cli.train import failed_as_json
    from dlscale.tta.config import TTAConfig

    layout = dopt.layout(nproc_per_node, nnodes, node_rank, master_addr, master_port, backend, emulate_nodes,
                         link_bandwidth, link_latency, timeout,
                         node_link_bandwidth=node_link_bandwidth, node_cpu_quota=node_cpu_quota,
                         cpu_binding=cpu_binding)
    cfg = TTAConfig(**config_options(TTAConfig, given), world_size=layout.world_size)
    price = copt.price(price_per_hour, systems_file, system)
    with failed_as_json(fmt, db):
        recs = api.tta(config=cfg, layout=layout, db=db, price=price)
    if not recs:
        info_done_elsewhere(layout)
        return
    if runs == 1:
        report(recs[0], fmt)
        return
    *each, summary = recs
    for rec in each:
        report(rec, Format.human, quiet=fmt == Format.json)
    if fmt == Format.json:
        print_json({"runs": [r.to_dict() for r in each], "olympic": summary.to_dict()})
    else:
        out.print(_olympic_table(summary))


def report(rec: Any, fmt: Format, quiet: bool = False) -> None:
    for w in rec.warnings:
        warn(w)
    if quiet:
        return
    if fmt == Format.json:
        print_json(rec.to_dict())
    else:
        out.print(_summary_table(rec))


def _quality(rec: Any) -> tuple[str, Any, Any]:
    """(target words, final-quality words, throughput unit) of a tta record of any family."""
    from dlscale.cli.render import fmt_num, fmt_pct

    m, c = rec.metrics, rec.config
    if c.get("quality_metric"):
        op = ">=" if c.get("higher_is_better", True) else "<="
        figs = ", ".join(f"{k[6:]} {fmt_num(v)}" for k, v in m.items() if k.startswith("final_")
                         and k not in ("final_quality", "final_loss") and isinstance(v, (int, float)))
        return (f"{c['quality_label']} {op} {fmt_num(c.get('target'))}", figs or fmt_num(m.get("final_quality")),
                c.get("sample_unit", "samples"))
    target = f"top-1 >= {fmt_pct(c.get('target_top1'))}" + (
        "" if c.get("target_top5") is None else f", top-5 >= {fmt_pct(c['target_top5'])}")
    return target, f"top-1 {fmt_pct(m.get('final_top1'))} / top-5 {fmt_pct(m.get('final_top5'))}", "samples"


def _summary_table(rec: Any) -> Any:
    from rich.table import Table

    from dlscale.cli.render import energy_cost_rows, fmt_num, fmt_seconds

    m, c = rec.metrics, rec.config
    t = Table(title=f"dlscale tta {rec.workload}  [{rec.status}]", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("run id", rec.run_id)
    shape = f"{c['image_size']}px, " if c.get("image_size") else ""
    t.add_row("config", f"batch {c.get('batch_size')} x {c.get('world_size')} rank(s) = {c.get('global_batch')}, "
              f"{shape}{c.get('optimizer')}, lr schedule {c.get('lr_schedule')}, peak lr {fmt_num(m.get('peak_lr'))}")
    target, final, unit = _quality(rec)
    t.add_row("target", target)  # what was asked; the quality reached is its own row, never the target's words
    if m.get("reached_target"):
        t.add_row("time to target", f"[bold]{fmt_seconds(m['time_to_target'])}[/bold] in {fmt_count(m['epochs_to_target'], 'epoch')}")
    else:
        t.add_row("time to target", f"[yellow]not reached[/yellow] in {fmt_count(m.get('epochs_run'), 'epoch')}")
    ckpt = fmt_seconds(m.get("checkpoint_time")) if c.get("checkpoint_dir") else "none written"
    lost = f", lost to interruptions {fmt_seconds(m['lost_time'])}" if m.get("lost_time") is not None else ""
    t.add_row("of which", f"training {fmt_seconds(m.get('train_time'))}, evaluation {fmt_seconds(m.get('eval_time'))}, "
              f"checkpoints {ckpt}, set-up {fmt_seconds(m.get('setup_time'))}{lost}")
    t.add_row("quality reached", f"{final} (the last evaluation)")
    t.add_row("training throughput", f"{fmt_num(m.get('throughput'))} {unit}/s")
    if m.get("speedup") is not None:
        t.add_row("speed-up vs 1 node", f"{m['speedup']:.2f}x = throughput {m['throughput_speedup']:.2f}x "
                  f"x epochs {m['epochs_ratio']:.2f} (+ eval/set-up)  [ref {m['reference_run_id']}]")
    if m.get("resumed_from_epoch") is not None:
        t.add_row("resumed", f"from epoch {m['resumed_from_epoch']} ({fmt_seconds(m.get('resume_gap'))} after its "
                  f"checkpoint; the work lost after it, {fmt_seconds(m.get('lost_time'))}, is in the time)")
    for what, words in energy_cost_rows(rec):
        t.add_row(what, words)
    return t


def summary_tables(rec: Any) -> list[Any]:
    """The headline figures and the quality curve of one tta record (for `dlscale results show`)."""
    from rich.table import Table

    from dlscale.cli.render import fmt_num, fmt_pct, fmt_seconds

    curve = rec.raw.get("curve", [])
    if rec.config.get("quality_metric"):
        t = Table("epoch", "wall (s)", "train (s)", "train loss", "lr", rec.config.get("quality_label", "quality"),
                  "eval", title="quality curve", title_justify="left")
        for c in curve:
            t.add_row(str(c["epoch"]), f"{c['wall_s']:.2f}", f"{c['train_s']:.2f}", fmt_num(c["train_loss"]),
                      fmt_num(c["lr"]), fmt_num(c["quality"]), fmt_seconds(c["eval_s"]))
        return [_summary_table(rec), t]
    t = Table("epoch", "wall (s)", "train (s)", "train loss", "lr", "top-1", "top-5", "val loss", "eval",
              title="accuracy curve", title_justify="left")
    for c in curve:
        t.add_row(str(c["epoch"]), f"{c['wall_s']:.2f}", f"{c['train_s']:.2f}", fmt_num(c["train_loss"]),
                  fmt_num(c["lr"]), fmt_pct(c["top1"]), fmt_pct(c["top5"]), fmt_num(c["loss"]), fmt_seconds(c["eval_s"]))
    return [_summary_table(rec), t]


def _olympic_table(rec: Any) -> Any:
    from rich.table import Table

    from dlscale.cli.render import fmt_seconds

    t = Table(title=f"olympic mean over {fmt_count(rec.metrics['runs'], 'run')}  [{rec.run_id}]", show_header=False, title_justify="left")
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
    from dlscale.domains.classification.digits import make_digits

    summary = make_digits(root, size=size, val_fraction=val_fraction, seed=seed)
    if fmt == Format.json:
        print_json(summary)
    else:
        out.print(f"{summary['root']}: {summary['train']} train + {summary['val']} val images, "
                  f"{summary['classes']} classes, {summary['size']}px (scikit-learn's handwritten digits)")


DIGITS_HELP = ("Write scikit-learn's handwritten digits (1,797 real 8x8 images, 10 classes, shipped with the "
               "package; nothing downloaded) as an ImageNet-layout JPEG tree for time-to-accuracy tests. "
               "tinycnn reaches 90% top-1 on it in a few epochs.")
