"""``dlscale micro KIND``: phase-1 microbenchmarks, one subcommand per kind with its own options."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dlscale.cli import costopts as copt
from dlscale.cli import distopts as dopt
from dlscale.cli.common import DbOpt, Format, FormatOpt, MinDurationOpt, TagOpt, out, print_json, warn

HELP = """Run phase-1 microbenchmarks and record each as a `micro` run.

One subcommand per kind, each with its own options: gemm, conv, rnn (DeepBench training shapes:
TFLOP/s and % of the dense peak; conv and rnn per pass: fwd, bwd_data, bwd_weights), memory
(STREAM copy/scale/add/triad; H2D/D2H pinned and pageable and D2D on GPUs), p2p (GPU-GPU
bandwidth and latency matrices with peer access; needs >= 2 GPUs), collectives (torch.distributed
on every rank of a layout, one node or several: nccl-tests' columns, exact correctness check),
links (every node's link, measured between every pair of nodes: names the slow one), burnin (a
seeded GEMM chain and LLM training on every device at once for --duration seconds, compared bit for
bit: names a device that computes wrong), or all (every kind but links and burnin). On CPUs the
default sizes suit a small machine; --full runs every shape."""

COLL_EPILOG = """Examples:\n\n
  dlscale micro collectives --nproc-per-node 2 --sizes 8:16M --min-busbw 0.5\n\n
  dlscale micro collectives --emulate-nodes 2 --link-bandwidth 1gbit --sizes 1M:4M\n\n
  dlscale micro collectives --nnodes 2 --node-rank 0 --master-addr node0 --nproc-per-node 8   # on each node"""

LINKS_EPILOG = """Examples:\n\n
  dlscale micro links --emulate-nodes 3 --link-bandwidth 1gbit --node-link-bandwidth 2=100mbit --sizes 256K,2M\n\n
  dlscale micro links --nnodes 4 --node-rank 0 --master-addr node0 --nproc-per-node 8   # on each node"""

BURN_EPILOG = """Examples:\n\n
  dlscale micro burnin --duration 600                        # every GPU of this node, 10 minutes\n\n
  dlscale micro burnin --duration 30 --nproc-per-node 2 --threads-per-rank 1   # two CPU ranks\n\n
  dlscale accept --checks burnin   # the same burn, judged: also against this model's known-good run"""

EPILOG = """Examples:\n\n
  dlscale micro gemm --precision fp32,bf16\n\n
  dlscale micro conv --shapes my_convs.csv --full\n\n
  dlscale micro memory --format json\n\n
  dlscale micro collectives --nproc-per-node 2 --sizes 8:16M --min-busbw 0.5\n\n
  dlscale micro collectives --emulate-nodes 2 --link-bandwidth 10gbit\n\n
  dlscale micro links --emulate-nodes 3 --link-bandwidth 1gbit --node-link-bandwidth 2=100mbit\n\n
  dlscale micro burnin --duration 600\n\n
  dlscale micro all --cpu-ghz 2.0"""

app = typer.Typer(help=HELP, epilog=EPILOG, no_args_is_help=True, rich_markup_mode="markdown")

# Options declared once; each kind takes only those it reads (an option it does not read is an error).
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")]
PrecisionOpt = Annotated[str, typer.Option("--precision", "-p", help="Comma list of fp32, tf32, bf16, fp16.")]
WarmupOpt = Annotated[Optional[int], typer.Option("--warmup", help="Uncounted calls first (default 2; collectives 5).", show_default=False)]
ItersOpt = Annotated[Optional[int], typer.Option("--iters", "--reps", help="Timed calls (default 10; collectives 20); on GPUs timed windows of >= 1 ms of calls each.", show_default=False)]
FullOpt = Annotated[bool, typer.Option("--full", help="Every shape at full rep counts, however long it takes on this device.")]
MaxGflopOpt = Annotated[Optional[float], typer.Option("--max-gflop", help="Skip shapes above this many GFLOP per call (CPU default 1, rnn 2).", show_default=False)]
ShapesOpt = Annotated[Optional[str], typer.Option("--shapes", help="Your own shape file (CSV as dlscale/facts/deepbench/*.csv).", show_default=False)]
ChannelsLastOpt = Annotated[Optional[bool], typer.Option("--channels-last/--no-channels-last", help="Layout (default NHWC on CPU and reduced precision).", show_default=False)]
MemMibOpt = Annotated[Optional[int], typer.Option("--mem-mib", help="Buffer size in MiB (default: STREAM's 4x last-level cache; 256 MiB GPU copies).", show_default=False)]
CpuGhzOpt = Annotated[Optional[float], typer.Option("--cpu-ghz", help="CPU clock for the ISA peak where the model name has none.", show_default=False)]
CaseBudgetOpt = Annotated[Optional[float], typer.Option("--case-budget", help="CPU: seconds of timed reps per case before reps are cut (>= 3). Default 0.5.", show_default=False)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for the random operands.")]
SizesOpt = Annotated[Optional[str], typer.Option("--sizes", help="MIN:MAX[:FACTOR] or a comma list, bytes (8, 64K, 128M). Default 8:128M (`all` on CPU: 8:1M).", show_default=False)]
OpsOpt = Annotated[Optional[str], typer.Option("--ops", help="Comma list of collectives (default all of them).", show_default=False)]
BudgetOpt = Annotated[float, typer.Option("--budget", help="Seconds per (op, size, mode); fewer iterations where slow.")]
MinBusbwOpt = Annotated[Optional[float], typer.Option("--min-busbw", help="Fail (exit 1) when a collective's average busbw (GB/s) is lower; names which.", show_default=False)]
CacheOpt = Annotated[Optional[str], typer.Option("--cache", help="GPUs: hot (operands reused, default) or cold (each call's operands are a copy not in L2: the copies rotate and together exceed it).", show_default=False)]
EveryDeviceOpt = Annotated[bool, typer.Option("--every-device", help="Measure every visible GPU in turn (rows say which); a CPU is one device.")]
PlantOpt = Annotated[Optional[str], typer.Option("--plant-wrong", hidden=True, help="Test hook: corrupt one result element of this collective.")]


def _kernel(kind: str, **kw: Any) -> None:
    db, fmt, price = kw.pop("db"), kw.pop("fmt"), kw.pop("price")
    _run(kind, {k: v for k, v in kw.items() if v is not None}, None, db, fmt, price)


@app.command("gemm", help="GEMM on DeepBench training shapes: TFLOP/s and % of the dense peak.")
def gemm(device: DeviceOpt = "auto", precision: PrecisionOpt = "fp32", warmup: WarmupOpt = None, iters: ItersOpt = None, min_duration: MinDurationOpt = None,
         full: FullOpt = False, max_gflop: MaxGflopOpt = None, shapes: ShapesOpt = None, cpu_ghz: CpuGhzOpt = None,
         case_budget: CaseBudgetOpt = None, every_device: EveryDeviceOpt = False, cache: CacheOpt = None,
         seed: SeedOpt = 0, tag: TagOpt = None, db: DbOpt = None, fmt: FormatOpt = Format.human,
         price_per_hour: copt.PriceOpt = None, systems_file: copt.SystemsFileOpt = None,
         system: copt.SystemOpt = None) -> None:
    _kernel("gemm", device=device, precisions=precision, warmup=warmup, reps=iters, min_duration_s=min_duration, full=full, max_gflop=max_gflop,
            shapes=shapes, cpu_ghz=cpu_ghz, case_budget_s=case_budget, every_device=every_device or None,
            cache=cache, seed=seed, tag=tag, db=db, fmt=fmt, price=copt.price(price_per_hour, systems_file, system))


@app.command("rnn", help="Recurrent layers (LSTM/GRU/vanilla) on DeepBench training shapes, per pass.")
def rnn(device: DeviceOpt = "auto", precision: PrecisionOpt = "fp32", warmup: WarmupOpt = None, iters: ItersOpt = None, min_duration: MinDurationOpt = None,
        full: FullOpt = False, max_gflop: MaxGflopOpt = None, shapes: ShapesOpt = None, cpu_ghz: CpuGhzOpt = None,
        case_budget: CaseBudgetOpt = None, cache: CacheOpt = None, seed: SeedOpt = 0, tag: TagOpt = None,
        db: DbOpt = None, fmt: FormatOpt = Format.human, price_per_hour: copt.PriceOpt = None,
        systems_file: copt.SystemsFileOpt = None, system: copt.SystemOpt = None) -> None:
    _kernel("rnn", device=device, precisions=precision, warmup=warmup, reps=iters, min_duration_s=min_duration, full=full, max_gflop=max_gflop,
            shapes=shapes, cpu_ghz=cpu_ghz, case_budget_s=case_budget, cache=cache, seed=seed, tag=tag, db=db,
            fmt=fmt, price=copt.price(price_per_hour, systems_file, system))


@app.command("conv", help="Convolutions on DeepBench training shapes, per pass (fwd, bwd_data, bwd_weights).")
def conv(device: DeviceOpt = "auto", precision: PrecisionOpt = "fp32", warmup: WarmupOpt = None, iters: ItersOpt = None, min_duration: MinDurationOpt = None,
         full: FullOpt = False, max_gflop: MaxGflopOpt = None, shapes: ShapesOpt = None,
         channels_last: ChannelsLastOpt = None, cpu_ghz: CpuGhzOpt = None, case_budget: CaseBudgetOpt = None,
         cache: CacheOpt = None, seed: SeedOpt = 0, tag: TagOpt = None, db: DbOpt = None,
         fmt: FormatOpt = Format.human, price_per_hour: copt.PriceOpt = None,
         systems_file: copt.SystemsFileOpt = None, system: copt.SystemOpt = None) -> None:
    _kernel("conv", device=device, precisions=precision, warmup=warmup, reps=iters, min_duration_s=min_duration, full=full, max_gflop=max_gflop,
            shapes=shapes, channels_last=channels_last, cpu_ghz=cpu_ghz, case_budget_s=case_budget, cache=cache,
            seed=seed, tag=tag, db=db, fmt=fmt, price=copt.price(price_per_hour, systems_file, system))


@app.command("memory", help="STREAM copy/scale/add/triad; on GPUs also H2D/D2H (pinned, pageable) and D2D.")
def memory(device: DeviceOpt = "auto", warmup: WarmupOpt = None, iters: ItersOpt = None, min_duration: MinDurationOpt = None, mem_mib: MemMibOpt = None,
           case_budget: CaseBudgetOpt = None, every_device: EveryDeviceOpt = False, seed: SeedOpt = 0,
           tag: TagOpt = None, db: DbOpt = None, fmt: FormatOpt = Format.human, price_per_hour: copt.PriceOpt = None,
           systems_file: copt.SystemsFileOpt = None, system: copt.SystemOpt = None) -> None:
    _kernel("memory", device=device, warmup=warmup, reps=iters, min_duration_s=min_duration, mem_mib=mem_mib, case_budget_s=case_budget,
            every_device=every_device or None, seed=seed, tag=tag, db=db, fmt=fmt,
            price=copt.price(price_per_hour, systems_file, system))


@app.command("p2p", help="GPU-GPU bandwidth and latency matrices with the peer-access matrix (needs >= 2 GPUs).")
def p2p(device: DeviceOpt = "auto", warmup: WarmupOpt = None, iters: ItersOpt = None, min_duration: MinDurationOpt = None, mem_mib: MemMibOpt = None,
        case_budget: CaseBudgetOpt = None, seed: SeedOpt = 0, tag: TagOpt = None, db: DbOpt = None,
        fmt: FormatOpt = Format.human, price_per_hour: copt.PriceOpt = None, systems_file: copt.SystemsFileOpt = None,
        system: copt.SystemOpt = None) -> None:
    _kernel("p2p", device=device, warmup=warmup, reps=iters, min_duration_s=min_duration, mem_mib=mem_mib, case_budget_s=case_budget, seed=seed,
            tag=tag, db=db, fmt=fmt, price=copt.price(price_per_hour, systems_file, system))


@app.command("collectives", help="torch.distributed collectives on every rank of a layout: nccl-tests' columns, "
             "exact correctness check, busbw per collective.", epilog=COLL_EPILOG)
def collectives(
    sizes: SizesOpt = None, ops: OpsOpt = None, warmup: WarmupOpt = None, iters: ItersOpt = None, min_duration: MinDurationOpt = None,
    budget: BudgetOpt = 0.5, min_busbw: MinBusbwOpt = None, plant_wrong: PlantOpt = None,
    device: DeviceOpt = "auto", tag: TagOpt = None, db: DbOpt = None, fmt: FormatOpt = Format.human,
    price_per_hour: copt.PriceOpt = None, systems_file: copt.SystemsFileOpt = None, system: copt.SystemOpt = None,
    nproc_per_node: dopt.NprocOpt = None, nnodes: dopt.NnodesOpt = 1, node_rank: dopt.NodeRankOpt = 0,
    master_addr: dopt.MasterAddrOpt = "127.0.0.1", master_port: dopt.MasterPortOpt = None,
    backend: dopt.BackendOpt = None, emulate_nodes: dopt.EmulateOpt = None, link_bandwidth: dopt.BandwidthOpt = None,
    link_latency: dopt.LatencyOpt = None, timeout: dopt.TimeoutOpt = 300.0, threads_per_rank: dopt.ThreadsOpt = None,
    node_link_bandwidth: dopt.NodeBandwidthOpt = None, node_cpu_quota: dopt.NodeQuotaOpt = None,
    cpu_binding: dopt.CpuBindingOpt = True,
) -> None:
    layout = dopt.layout(nproc_per_node, nnodes, node_rank, master_addr, master_port, backend, emulate_nodes,
                         link_bandwidth, link_latency, timeout, threads_per_rank,
                         node_link_bandwidth=node_link_bandwidth, node_cpu_quota=node_cpu_quota,
                         cpu_binding=cpu_binding)
    options = dict(sizes=sizes, ops=ops, warmup=warmup, iters=iters, min_duration_s=min_duration, budget=budget,
                   min_busbw=min_busbw, plant_wrong=plant_wrong, device=device, tag=tag)
    _run("collectives", {k: v for k, v in options.items() if v is not None}, layout, db, fmt,
         copt.price(price_per_hour, systems_file, system))


@app.command("links", help="Every node's link: one rank per node exchanges data with one rank of every other "
             "node in turn (send/recv, both directions at once); each node's figure is its fastest pair, so a slow "
             "link is named by its node.", epilog=LINKS_EPILOG)
def links(
    sizes: Annotated[Optional[str], typer.Option("--sizes", help="MIN:MAX[:FACTOR] or a comma list, bytes each way per exchange; the largest gives each link's figure. Default 64K:16M:4.", show_default=False)] = None,
    warmup: WarmupOpt = None, iters: ItersOpt = None,
    budget: Annotated[float, typer.Option("--budget", help="Seconds per (pair, size); fewer iterations where slow.")] = 0.5,
    device: DeviceOpt = "auto", tag: TagOpt = None, db: DbOpt = None, fmt: FormatOpt = Format.human,
    price_per_hour: copt.PriceOpt = None, systems_file: copt.SystemsFileOpt = None, system: copt.SystemOpt = None,
    nproc_per_node: dopt.NprocOpt = None, nnodes: dopt.NnodesOpt = 1, node_rank: dopt.NodeRankOpt = 0,
    master_addr: dopt.MasterAddrOpt = "127.0.0.1", master_port: dopt.MasterPortOpt = None,
    backend: dopt.BackendOpt = None, emulate_nodes: dopt.EmulateOpt = None, link_bandwidth: dopt.BandwidthOpt = None,
    link_latency: dopt.LatencyOpt = None, timeout: dopt.TimeoutOpt = 300.0, threads_per_rank: dopt.ThreadsOpt = None,
    node_link_bandwidth: dopt.NodeBandwidthOpt = None, node_cpu_quota: dopt.NodeQuotaOpt = None,
    cpu_binding: dopt.CpuBindingOpt = True,
) -> None:
    layout = dopt.layout(nproc_per_node, nnodes, node_rank, master_addr, master_port, backend, emulate_nodes,
                         link_bandwidth, link_latency, timeout, threads_per_rank,
                         node_link_bandwidth=node_link_bandwidth, node_cpu_quota=node_cpu_quota,
                         cpu_binding=cpu_binding)
    options = dict(sizes=sizes, warmup=warmup, iters=iters, budget=budget, device=device, tag=tag)
    _run("links", {k: v for k, v in options.items() if v is not None}, layout, db, fmt,
         copt.price(price_per_hour, systems_file, system))


@app.command("burnin", help="A seeded GEMM chain and a short LLM training run with deterministic algorithms on "
             "every device at once, in rounds for --duration seconds; every round's results compared bit for bit "
             "with its first and across devices (a device that differs fails the run by name); power, clocks, "
             "temperature and clock-event reasons recorded.", epilog=BURN_EPILOG)
def burnin(
    duration: Annotated[float, typer.Option("--duration", help="Seconds of rounds on every device (at least one round).")] = 60.0,
    gemm_size: Annotated[Optional[int], typer.Option("--gemm-size", help="N of the chain's N x N matrices (default 8192 on GPUs, 384 on CPUs).", show_default=False)] = None,
    gemm_chain: Annotated[Optional[int], typer.Option("--gemm-chain", help="Matrix products per round (default 256 on GPUs, 8 on CPUs).", show_default=False)] = None,
    llm_steps: Annotated[Optional[int], typer.Option("--llm-steps", help="llama_tiny training steps per round (default 8 on GPUs, 4 on CPUs).", show_default=False)] = None,
    seed: SeedOpt = 0, device: DeviceOpt = "auto", tag: TagOpt = None, db: DbOpt = None, fmt: FormatOpt = Format.human,
    price_per_hour: copt.PriceOpt = None, systems_file: copt.SystemsFileOpt = None, system: copt.SystemOpt = None,
    nproc_per_node: dopt.NprocOpt = None, nnodes: dopt.NnodesOpt = 1, node_rank: dopt.NodeRankOpt = 0,
    master_addr: dopt.MasterAddrOpt = "127.0.0.1", master_port: dopt.MasterPortOpt = None,
    backend: dopt.BackendOpt = None, timeout: dopt.TimeoutOpt = 300.0, threads_per_rank: dopt.ThreadsOpt = None,
) -> None:
    layout = dopt.layout(nproc_per_node, nnodes, node_rank, master_addr, master_port, backend, None, None, None,
                         timeout, threads_per_rank)
    options = dict(duration=duration, gemm_size=gemm_size, gemm_chain=gemm_chain, llm_steps=llm_steps, seed=seed,
                   device=device, tag=tag)
    _run("burnin", {k: v for k, v in options.items() if v is not None}, layout, db, fmt,
         copt.price(price_per_hour, systems_file, system))


@app.command("all", help="Every kind in turn: gemm, conv, rnn, memory, p2p (where >= 2 GPUs), collectives.")
def all_(device: DeviceOpt = "auto", precision: PrecisionOpt = "fp32", warmup: WarmupOpt = None,
         iters: ItersOpt = None, full: FullOpt = False, max_gflop: MaxGflopOpt = None, cpu_ghz: CpuGhzOpt = None,
         case_budget: CaseBudgetOpt = None, mem_mib: MemMibOpt = None, cache: CacheOpt = None,
         sizes: SizesOpt = None, min_busbw: MinBusbwOpt = None, seed: SeedOpt = 0, tag: TagOpt = None, db: DbOpt = None,
         fmt: FormatOpt = Format.human, price_per_hour: copt.PriceOpt = None, systems_file: copt.SystemsFileOpt = None, system: copt.SystemOpt = None) -> None:
    options = dict(device=device, precisions=precision, warmup=warmup, reps=iters, full=full, max_gflop=max_gflop,
                   cpu_ghz=cpu_ghz, case_budget_s=case_budget, mem_mib=mem_mib, cache=cache, sizes=sizes,
                   min_busbw=min_busbw, seed=seed, tag=tag)
    _run("all", {k: v for k, v in options.items() if v is not None}, None, db, fmt,
         copt.price(price_per_hour, systems_file, system))


def _run(kind: str, options: dict[str, Any], layout: Any, db: str | None, fmt: Format, price: Any = None) -> None:
    """Run through the API, print every record (failed ones too), then exit 1 if any failed."""
    from dlscale import api
    from dlscale.errors import RunFailure

    failure = None
    try:
        recs = api.micro(kind, layout=layout, db=db, price=price, **options)
    except RunFailure as e:
        recs, failure = e.records, e
    docs = [report(r, fmt) for r in recs]
    if fmt == Format.json:
        print_json(docs if kind == "all" else (docs[0] if docs else None))
    if failure is not None:
        raise failure


def report(rec, fmt: Format | None) -> dict[str, Any]:
    """Print one record (human) and return its JSON document (rows, metrics, config, status)."""
    from dlscale.cli.render import energy_cost_lines
    from dlscale.micro.report import print_record

    doc = {"run_id": rec.run_id, "status": rec.status, "error": rec.error, "kind": rec.kind,
           "workload": rec.workload, "tag": rec.tag, "config": rec.config, "metrics": rec.metrics,
           "units": rec.units, "warnings": rec.warnings, "rows": rec.raw.get("rows", [])}
    for key in ("links", "node"):  # every node's link; the GPUs run at once and the node's energy
        if key in rec.raw:
            doc[key] = rec.raw[key]
    if rec.workload == "burnin":
        doc["ranks"] = [{k: v for k, v in r.items() if k != "series"} for r in rec.raw.get("ranks", [])]
    if fmt != Format.human:
        return doc
    for w in rec.warnings:
        warn(w)
    print_record(rec, out)
    for line in energy_cost_lines(rec):
        out.print(line, markup=False)
    return doc
