"""``dlscale train MODEL``: the throughput short test (warm-up steps, then measured steps)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dlscale.cli import costopts as copt
from dlscale.cli import dataopts as dataopt
from dlscale.cli import distopts as dopt
from dlscale.cli import shapeopts as sopt
from dlscale.cli.common import (DbOpt, Format, FormatOpt, MinDurationOpt, TagOpt, config_options, err, info,
                                info_done_elsewhere, interactive, out, print_json, warn)

HELP = """Run the training-throughput short test of MODEL on synthetic data and record it.

Warm-up steps are not counted; the measured steps are timed one by one with the device
synchronised around the window. Prints throughput in the model family's unit (images/s,
tokens/s or samples/s; `dlscale models` lists them) with its 95% CI, step-time
percentiles, CV, FLOPs, MFU and peak memory, and stores the full record. With --data it
trains on a JPEG tree; every run samples CPU, memory, disk, network and GPU use, times each
phase of a step after the window and says whether it was input-, communication- or compute-bound."""

EPILOG = """Examples:\n\n
  dlscale train resnet50 --batch-size 64\n\n
  dlscale train resnet18 --image-size 64 --steps 30 --format json\n\n
  dlscale train resnet50 --precision bf16 --channels-last --repeat 3 --tag baseline\n\n
  dlscale train resnet18 --image-size 64 --price-per-hour 2.50 --format json   (cost per million images)\n\n
  dlscale train alexnet --data /data/imagenet-mini --workers 4 --profile ./prof\n\n
  dlscale train llama_tiny --seq-len 256 --batch-size 8 --precision bf16\n\n
  dlscale train llama3.2_1b --nproc-per-node 8 --parallel fsdp --activation-checkpointing\n\n
  dlscale train transformer_base --tokens-per-batch 4096\n\n
  dlscale train --config tune-resnet50.yaml   (what `dlscale tune resnet50` wrote, model included; options given here win)"""


def train(
    model: Annotated[Optional[str], typer.Argument(help="Model name; `dlscale models` lists them (optional with a --config file that names one).", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Per-device batch size.")] = 32,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Input size in pixels (default: the model's native).", show_default=False)] = None,
    seq_len: sopt.SeqLenOpt = None,
    tokens_per_batch: sopt.TokensOpt = None,
    model_config: sopt.ModelConfigOpt = None,
    max_table_rows: sopt.MaxRowsOpt = None,
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32 (TF32 off) | tf32 (TF32 matmuls and convolutions) | bf16 | fp16 (autocast; fp16 with a grad scaler).")] = "fp32",
    channels_last: Annotated[Optional[bool], typer.Option("--channels-last/--no-channels-last", help="Memory format (default: channels_last on CPU and for reduced precision).", show_default=False)] = None,
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the model (compiles during warm-up).")] = False,
    compile_mode: Annotated[Optional[str], typer.Option("--compile-mode", help="torch.compile mode, implies --compile: default | max-autotune | max-autotune-no-cudagraphs | reduce-overhead (CUDA graphs; CUDA only).", show_default=False)] = None,
    cudnn_benchmark: sopt.CudnnBenchmarkOpt = True,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Uncounted steps before the measured window.")] = 10,
    steps: Annotated[int, typer.Option("--steps", "-n", help="Measured steps.")] = 100,
    min_duration_s: MinDurationOpt = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="sgd (momentum 0.9) | adamw.")] = "sgd",
    optimizer_impl: Annotated[str, typer.Option("--optimizer-impl", help="default | foreach (multi-tensor) | fused: torch.optim's implementation.")] = "default",
    lr: Annotated[Optional[float], typer.Option("--lr", help="Learning rate (default: the model's, 0.01 for most; `dlscale models --format json` lists it).", show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    repeat: Annotated[int, typer.Option("--repeat", "-r", help="Independent repeats (fresh model each); CI over repeats when >= 2.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights and synthetic data.")] = 0,
    data: dataopt.DataOpt = None,
    workers: dataopt.WorkersOpt = None,
    pin_memory: Annotated[Optional[bool], typer.Option("--pin-memory/--no-pin-memory", help="With --data: page-locked host batches for fast copies to the GPU (default: on with CUDA; refused on CPU).", show_default=False)] = None,
    prefetch_factor: Annotated[Optional[int], typer.Option("--prefetch-factor", help="With --data: batches each loader worker prepares ahead (default: 2).", show_default=False)] = None,
    strict: dataopt.StrictOpt = False,
    monitor_interval: dataopt.MonitorOpt = 1.0,
    breakdown_steps: dataopt.BreakdownOpt = 10,
    profile: dataopt.ProfileOpt = None,
    profile_steps: dataopt.ProfileStepsOpt = 5,
    tag: TagOpt = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
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
    threads_per_rank: dopt.ThreadsOpt = None,
    parallel: sopt.ParallelOpt = "ddp",
    activation_checkpointing: sopt.CheckpointOpt = False,
    ddp_bucket_mb: sopt.DdpBucketOpt = None,
    ddp_grad_as_bucket_view: sopt.DdpViewOpt = None,
    ddp_static_graph: sopt.DdpStaticOpt = False,
    ddp_broadcast_buffers: sopt.DdpBuffersOpt = None,
    dp_reference: sopt.DpReferenceOpt = None,
    config: Annotated[Optional[str], typer.Option("--config", help="YAML file of option: value defaults (TrainConfig fields and threads_per_rank, as `dlscale tune` writes them); options given on the command line win.", show_default=False)] = None,
    price_per_hour: copt.PriceOpt = None,
    systems_file: copt.SystemsFileOpt = None,
    system: copt.SystemOpt = None,
) -> None:
    given = dict(locals())
    from dlscale import api

    cfg, threads_per_rank = _config(given, config)
    price = copt.price(price_per_hour, systems_file, system)
    layout = dopt.layout(nproc_per_node, nnodes, node_rank, master_addr, master_port, backend, emulate_nodes,
                         link_bandwidth, link_latency, timeout, threads_per_rank,
                         node_link_bandwidth=node_link_bandwidth, node_cpu_quota=node_cpu_quota,
                         cpu_binding=cpu_binding)
    cfg.check_layout(layout.distributed)
    if threads_per_rank is not None and not layout.distributed:
        import torch  # one process: its intra-op threads (ranks of a job get theirs from the launcher)

        torch.set_num_threads(threads_per_rank)
    with _progress(fmt, cfg, enabled=not layout.distributed) as on_step, failed_as_json(fmt, db):
        rec = api.train(config=cfg, layout=layout, db=db, on_step=on_step, price=price)
    if rec is None:
        info_done_elsewhere(layout)
    else:
        report(rec, fmt)
        show_hint(rec, db)


def _config(given: dict[str, Any], config: str | None) -> tuple[Any, int | None]:
    """The run's TrainConfig (a --config file's values under the options given) and its threads per rank."""
    from dlscale.config import TrainConfig

    opts = config_options(TrainConfig, given, "threads_per_rank")

    if config is not None:
        from dlscale.tune import configfile

        opts = configfile.merge(config, opts, configfile.explicit_options())
    elif opts["model"] is None:
        from dlscale.errors import UsageError

        raise UsageError("give MODEL (e.g. dlscale train resnet50; `dlscale models` lists them) or --config FILE "
                         "naming one (what `dlscale tune` wrote)")
    threads_per_rank = opts.pop("threads_per_rank")
    return TrainConfig(**opts), threads_per_rank


def show_hint(rec, db: str | None) -> None:
    """One stderr line when the store holds a much faster precision or format of this model here
    (not when the store was lost during the run: the record is in the local spool)."""
    from dlscale.store import Store
    from dlscale.tune.hint import hint_for

    if "spooled" in rec.raw:
        return
    with Store.open(db) as s:
        line = hint_for(rec, s)
    if line:
        info(line)


class failed_as_json:
    """With --format json, a run that failed still prints its (failed) record on stdout."""

    def __init__(self, fmt: Format, db: str | None) -> None:
        self.fmt, self.db = fmt, db

    def __enter__(self) -> "failed_as_json":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        from dlscale.errors import RunFailure

        if self.fmt == Format.json and isinstance(exc, RunFailure) and exc.run_id:
            from dlscale.store import Store

            with Store.open_holding(self.db, exc.run_id) as s:
                rec = s.get(exc.run_id)
            if rec is not None:
                print_json(rec.to_dict())


def report(rec, fmt: Format) -> None:
    from dlscale.cli.render import train_summary_table

    for w in rec.warnings:
        warn(w)
    if fmt == Format.json:
        print_json(rec.to_dict())
    else:
        out.print(train_summary_table(rec))
        from dlscale.cli.breakdown_view import breakdown_tables

        for t in breakdown_tables(rec):
            out.print(t)


class _progress:
    """A Rich progress bar over warm-up and measured steps, on stderr, for terminals only."""

    def __init__(self, fmt: Format, cfg, enabled: bool = True) -> None:
        self.enabled = enabled and interactive() and fmt == Format.human
        self.total = (cfg.warmup_steps + cfg.steps) * cfg.repeat
        self.cfg = cfg
        self.bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), console=err, transient=True)
        self.bar.start()
        task = self.bar.add_task("warm-up", total=self.total)

        def on_step(phase: str, done: int, total: int) -> None:
            if phase == "measure" and done == 1:  # --min-duration: the window's steps are known once it opens
                self.bar.update(task, total=self.bar.tasks[0].total + total - self.cfg.steps)
            self.bar.update(task, advance=1, description="warm-up" if phase == "warmup" else "measuring")

        return on_step

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
