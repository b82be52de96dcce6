"""``dlscale micro KIND``: phase-1 microbenchmarks (gemm, conv, rnn, memory, p2p, collectives, all)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Annotated, Any, Optional

import typer

from dlscale.cli.common import DbOpt, Format, FormatOpt, TagOpt, info, out, print_json, warn
from dlscale.cli.distopts import BandwidthOpt, EmulateOpt, LatencyOpt

HELP = """Run phase-1 microbenchmarks and record each as a `micro` run.

KIND is gemm, conv, rnn (DeepBench training shapes: TFLOP/s and % of the dense peak; conv and
rnn per pass: fwd, bwd_data, bwd_weights), memory (STREAM copy/scale/add/triad; H2D/D2H pinned
and pageable and D2D on GPUs), p2p (GPU-GPU bandwidth and latency matrices; needs >= 2 GPUs),
collectives (torch.distributed under torchrun: nccl-tests' columns, exact correctness check),
or all. On CPUs the default sizes suit a small machine; --full runs every shape."""

EPILOG = """Examples:\n\n
  dlscale micro gemm --precision fp32,bf16\n\n
  dlscale micro conv --shapes my_convs.csv --full\n\n
  dlscale micro memory --format json\n\n
  dlscale micro collectives --nproc-per-node 2 --sizes 8:16M --min-busbw 0.5\n\n
  dlscale micro collectives --emulate-nodes 2 --link-bandwidth 10gbit\n\n
  dlscale micro all --cpu-ghz 2.0"""

KINDS = ("gemm", "conv", "rnn", "memory", "p2p", "collectives", "all")
CPU_ALL_SIZES = "8:1M"  # collectives in `micro all` on a CPU: small sizes (--sizes for more)


def micro(
    kind: Annotated[str, typer.Argument(help="gemm | conv | rnn | memory | p2p | collectives | all.", show_default=False)],
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    precision: Annotated[str, typer.Option("--precision", "-p", help="Comma list of fp32, tf32, bf16, fp16 (gemm, conv, rnn).")] = "fp32",
    warmup: Annotated[Optional[int], typer.Option("--warmup", help="Uncounted calls first (default 2; collectives 5).", show_default=False)] = None,
    iters: Annotated[Optional[int], typer.Option("--iters", "--reps", help="Timed calls (default 10; collectives 20).", show_default=False)] = None,
    full: Annotated[bool, typer.Option("--full", help="Every shape at full rep counts, however long it takes on this device.")] = False,
    max_gflop: Annotated[Optional[float], typer.Option("--max-gflop", help="Skip shapes above this many GFLOP per call (CPU default 1, rnn 2).", show_default=False)] = None,
    shapes: Annotated[Optional[str], typer.Option("--shapes", help="Your own shape file (CSV as dlscale/data/deepbench/*.csv).", show_default=False)] = None,
    channels_last: Annotated[Optional[bool], typer.Option("--channels-last/--no-channels-last", help="conv layout (default NHWC on CPU and reduced precision).", show_default=False)] = None,
    mem_mib: Annotated[Optional[int], typer.Option("--mem-mib", help="memory/p2p buffer size in MiB (default: STREAM's 4x last-level cache; 256 MiB GPU copies).", show_default=False)] = None,
    cpu_ghz: Annotated[Optional[float], typer.Option("--cpu-ghz", help="CPU clock for the ISA peak where the model name has none.", show_default=False)] = None,
    case_budget: Annotated[Optional[float], typer.Option("--case-budget", help="CPU: seconds of timed reps per case before reps are cut (>= 3). Default 0.5.", show_default=False)] = None,
    sizes: Annotated[Optional[str], typer.Option("--sizes", help="collectives: MIN:MAX[:FACTOR] or a comma list, bytes (8, 64K, 128M). Default 8:128M (`all` on CPU: 8:1M).", show_default=False)] = None,
    ops: Annotated[Optional[str], typer.Option("--ops", help="collectives: comma list (default all of them).", show_default=False)] = None,
    budget: Annotated[float, typer.Option("--budget", help="collectives: seconds per (op, size, mode); fewer iterations where slow.")] = 0.5,
    min_busbw: Annotated[Optional[float], typer.Option("--min-busbw", help="collectives: fail (exit 1) when the average busbw (GB/s) is lower.", show_default=False)] = None,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", help="collectives: ranks on this node.")] = 2,
    emulate_nodes: EmulateOpt = None,
    link_bandwidth: BandwidthOpt = None,
    link_latency: LatencyOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="collectives: seconds before the job is ended.")] = 900.0,
    plant_wrong: Annotated[Optional[str], typer.Option("--plant-wrong", hidden=True, help="Test hook: corrupt one result element of this collective.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the random operands.")] = 0,
    tag: TagOpt = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.errors import RunFailure, UsageError
    from dlscale.micro.base import MicroOptions
    from dlscale.micro.collectives import DEFAULT_SIZES, CollectiveOptions
    from dlscale.store import Store

    if kind not in KINDS:
        raise UsageError(f"unknown microbenchmark {kind!r}; choose one of {', '.join(KINDS)}")
    opts = MicroOptions(device=device, precisions=tuple(p.strip() for p in precision.split(",") if p.strip()),
                        warmup=2 if warmup is None else warmup, reps=10 if iters is None else iters, full=full,
                        max_gflop=max_gflop, shapes=shapes, channels_last=channels_last, mem_mib=mem_mib,
                        cpu_ghz=cpu_ghz, case_budget_s=case_budget, seed=seed, tag=tag)
    kinds = ["gemm", "conv", "rnn", "memory", "p2p", "collectives"] if kind == "all" else [kind]
    coll = None
    if "collectives" in kinds:
        if sizes is None:
            sizes = CPU_ALL_SIZES if kind == "all" and device != "cuda" and not _has_cuda() else DEFAULT_SIZES
        coll = CollectiveOptions(sizes=sizes, ops=ops, warmup=5 if warmup is None else warmup,
                                 iters=20 if iters is None else iters, budget=budget, min_busbw=min_busbw,
                                 nproc_per_node=nproc_per_node, emulate_nodes=emulate_nodes,
                                 link_bandwidth=link_bandwidth, link_latency=link_latency, timeout=timeout,
                                 plant_wrong=plant_wrong, device=device, tag=tag)
    if kinds != ["collectives"]:  # a precision the device cannot run stops here, before any work
        from dlscale.harness import device as dev

        target = dev.select_device(opts.device)
        for p in opts.precisions:
            dev.check_precision(p, target)
    store = Store.open(db)  # an unwritable database is a usage error before any work
    docs, failures = [], []
    for k in kinds:
        try:
            rec = run_collectives(coll, store) if k == "collectives" else run_kernel(k, opts, store)
        except RunFailure as e:  # recorded as failed: show what it has, go on with the next kind
            failures.append(str(e))
            rec = store.get(e.run_id) if e.run_id else None
        else:
            if rec is not None and rec.status != "ok":
                failures.append(f"run {rec.run_id} failed: {rec.error}")
        if rec is not None:
            docs.append(report(rec, fmt))
    if fmt == Format.json:
        print_json(docs[0] if kind != "all" and docs else docs)
    if failures:
        raise RunFailure("; ".join(failures), run_id=None)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_kernel(kind: str, opts, store) -> Any:
    """gemm, conv, rnn, memory, p2p: one recorded run through the microbenchmark harness."""
    from dlscale import micro
    from dlscale.micro.harness import run_recorded

    bench = micro.get(kind)
    if kind == "p2p":
        why = bench.unavailable()
        if why:
            info(why)  # not a failure: nothing is recorded
            return None
    info(f"dlscale micro {kind}: {bench.title}")
    return run_recorded(bench, opts, store)


def run_collectives(c, store) -> Any:
    """Launch one worker per rank with torchrun; rank 0 records the run; read it back from the store."""
    from dlscale.distributed.launch import run_torchrun
    from dlscale.errors import RunFailure

    fd, result = tempfile.mkstemp(prefix="dlscale-micro-", suffix=".json")
    os.close(fd)
    os.unlink(result)  # rank 0 creates it once the run is recorded
    info(f"dlscale micro collectives: {c.nproc_per_node * (c.emulate_nodes or 1)} ranks, sizes {c.sizes}")
    try:
        rc = run_torchrun("dlscale.micro.coll_worker", c.worker_args(str(store.path), result),
                          nproc_per_node=c.nproc_per_node, emulate_nodes=c.emulate_nodes,
                          link_bandwidth=c.link_bandwidth, link_latency=c.link_latency, timeout_s=c.timeout)
        try:
            with open(result) as f:
                outcome = json.load(f)
        except (OSError, ValueError):
            raise RunFailure(f"collectives: the ranks ended (exit code {rc}) before rank 0 recorded a result; "
                             "their output is above") from None
    finally:
        if os.path.exists(result):
            os.unlink(result)
    return store.get(outcome["run_id"])


def report(rec, fmt: Format | None) -> dict[str, Any]:
    """Print one record (human) and return its JSON document (rows, metrics, config, status)."""
    from dlscale.micro.report import print_record

    doc = {"run_id": rec.run_id, "status": rec.status, "error": rec.error, "kind": rec.kind,
           "workload": rec.workload, "tag": rec.tag, "config": rec.config, "metrics": rec.metrics,
           "units": rec.units, "warnings": rec.warnings, "rows": rec.raw.get("rows", [])}
    if fmt != Format.human:
        return doc
    for w in rec.warnings:
        warn(w)
    print_record(rec, out)
    return doc
