"""``dlscale scale MODEL``: the data-parallel ladder, its scaling efficiency and the layout comparison."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from dlscale.cli import costopts as copt
from dlscale.cli import distopts as dopt
from dlscale.cli import shapeopts as sopt
from dlscale.cli.common import DbOpt, Format, FormatOpt, MinDurationOpt, out, print_json, warn
from dlscale.cli.render import fmt_num, fmt_pct
from dlscale.errors import RunFailure, UsageError

HELP = """Scaling ladder: the short test at 1..N devices and in several layouts, with efficiencies.

Prints throughput,
speed-up and scaling efficiency = measured / (N x single-device throughput), split into intra- and
inter-node efficiency, and the scale-up vs scale-out % difference (A - B) / B at equal device count.

Layouts are NODESxDEVICES_PER_NODE. Multi-node layouts run here on emulated nodes
(--emulate-nodes, network namespaces with shaped links). With --from-store nothing runs: the same
analysis is made over recorded runs (e.g. `dlscale train` on a real cluster, or imported runs)."""

EPILOG = """Examples:\n\n
  dlscale scale resnet18 --image-size 64 --devices 1,2 --layouts 1x2,2x1 --emulate-nodes 2 --link-bandwidth 1gbit\n\n
  dlscale scale resnet50 --devices 1,2,4,8 --layouts 1x8,2x4 --tag c4140\n\n
  dlscale scale --from-store --tag c4140"""


def scale(
    model: Annotated[Optional[str], typer.Argument(help="Model name (not needed with --from-store).", show_default=False)] = None,
    devices: Annotated[str, typer.Option("--devices", help="Device counts of the ladder, e.g. 1,2,4,8.")] = "1,2",
    layouts: Annotated[Optional[str], typer.Option("--layouts", help="NODESxDEVICES_PER_NODE layouts, e.g. 1x8,2x4,4x2.", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Per-device batch size.")] = 32,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Input size in pixels (default: the model's native).", show_default=False)] = None,
    seq_len: sopt.SeqLenOpt = None,
    tokens_per_batch: sopt.TokensOpt = None,
    model_config: sopt.ModelConfigOpt = None,
    max_table_rows: sopt.MaxRowsOpt = None,
    parallel: sopt.ParallelOpt = "ddp",
    ddp_bucket_mb: sopt.DdpBucketOpt = None,
    ddp_grad_as_bucket_view: sopt.DdpViewOpt = None,
    ddp_static_graph: sopt.DdpStaticOpt = False,
    ddp_broadcast_buffers: sopt.DdpBuffersOpt = None,
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32 | tf32 | bf16 | fp16.")] = "fp32",
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Uncounted steps before each measured window.")] = 10,
    steps: Annotated[int, typer.Option("--steps", "-n", help="Measured steps per point.")] = 100,
    min_duration: MinDurationOpt = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    backend: dopt.BackendOpt = None,
    emulate_nodes: dopt.EmulateOpt = None,
    link_bandwidth: dopt.BandwidthOpt = None,
    link_latency: dopt.LatencyOpt = None,
    node_link_bandwidth: dopt.NodeBandwidthOpt = None,
    node_cpu_quota: dopt.NodeQuotaOpt = None,
    timeout: dopt.TimeoutOpt = 300.0,
    threads_per_rank: Annotated[Optional[int], typer.Option("--threads-per-rank", help="CPU threads per rank at every point (default: cores / the largest device count), so one device means the same on every rung.", show_default=False)] = None,
    from_store: Annotated[bool, typer.Option("--from-store", help="Run nothing: analyse recorded runs (filter with --tag/--model).")] = False,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Tag of the ladder's runs (default: scale-MODEL-TIME); with --from-store, the runs to analyse.")] = None,
    db: DbOpt = None,
    price_per_hour: copt.PriceOpt = None,
    systems_file: copt.SystemsFileOpt = None,
    system: copt.SystemOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.store import Store

    if from_store:
        if not tag and not model:
            raise UsageError("--from-store needs --tag T (or a MODEL) to choose the runs")
        with Store.open(db, create=False) as s:
            recs = s.query(tag=tag, workload=model, kind="train", status="ok")
        if not recs:
            raise UsageError(f"no ok train runs match{' tag ' + repr(tag) if tag else ''}{' model ' + model if model else ''}")
        _print(recs, tag, fmt)
        return
    if not model:
        raise UsageError("give a MODEL to run the ladder, or --from-store --tag T to analyse recorded runs")
    from dlscale import api
    from dlscale.distributed.ladder import parse_devices, parse_layouts

    recs = api.scale(model, devices=parse_devices(devices), layouts=parse_layouts(layouts),
                     emulate_nodes=emulate_nodes, link_bandwidth=link_bandwidth, link_latency=link_latency,
                     backend=backend, timeout_s=timeout, threads_per_rank=threads_per_rank, db=db,
                     price=copt.price(price_per_hour, systems_file, system),
                     node_link_bandwidth=node_link_bandwidth or (), node_cpu_quota=node_cpu_quota or (),
                     batch_size=batch_size, image_size=image_size, seq_len=seq_len, tokens_per_batch=tokens_per_batch,
                     model_config=model_config, max_table_rows=max_table_rows, parallel=parallel,
                     ddp_bucket_mb=ddp_bucket_mb, ddp_grad_as_bucket_view=ddp_grad_as_bucket_view,
                     ddp_static_graph=ddp_static_graph, ddp_broadcast_buffers=ddp_broadcast_buffers,
                     precision=precision, warmup_steps=warmup_steps, steps=steps, min_duration_s=min_duration,
                     device=device, tag=tag)
    rungs = [r for r in recs if r.kind == "train"]
    ok = [r for r in rungs if r.status == "ok"]
    if ok:
        _print(ok, ok[0].tag, fmt)
    failed = [f"{r.config.get('nodes')}x{r.config.get('devices_per_node')}" for r in rungs if r.status != "ok"]
    if failed or not ok:
        raise RunFailure(f"layouts {', '.join(failed) or 'all'} failed (recorded as failed); the tables leave them out")


def _print(recs: list[Any], tag: str | None, fmt: Format) -> None:
    from dlscale.analysis.scaling import analyse

    result = analyse(recs)
    if fmt == Format.json:
        print_json({"tag": tag, **result})
        return
    for lad in result["ladders"]:
        t = Table("layout", "devices", "throughput", "speed-up", "efficiency", "intra-node eff.", "inter-node eff.",
                  "comm fraction", "runs", title=f"scaling: {lad['label']}", title_justify="left")
        for r in lad["efficiency"]:
            t.add_row(r["layout"], str(r["devices"]), f"{fmt_num(r['throughput'])}/s",
                      "-" if r["speedup"] is None else f"{r['speedup']:.2f}x", fmt_pct(r["efficiency"]),
                      fmt_pct(r["intra_node_efficiency"]), fmt_pct(r["inter_node_efficiency"]),
                      fmt_pct(r["comm_fraction"]), str(r["runs"]))
        out.print(t)
        if all(r["efficiency"] is None for r in lad["efficiency"]):
            warn(f"{lad['label']}: no 1x1 run, so no speed-up or efficiency")
    for comp in result["comparisons"]:
        lt = Table("devices", "scale-up (A)", "throughput A", "scale-out (B)", "throughput B", "% diff (A-B)/B",
                   title=f"scale-up vs scale-out: {comp['label']}; (A - B) / B, positive when A is faster",
                   title_justify="left")
        for r in comp["rows"]:
            lt.add_row(str(r["devices"]), _who(r["scale_up"], r["scale_up_system"], None),
                       f"{fmt_num(r['scale_up_throughput'])}/s", _who(r["scale_out"], r["scale_out_system"], r["link"]),
                       f"{fmt_num(r['scale_out_throughput'])}/s", f"{r['pct_difference'] * 100:+.2f}%")
        out.print(lt)


def _who(layout: str, system: str | None, link: str | None) -> str:
    extra = ", ".join(x for x in (system, link) if x)
    return f"{layout} ({extra})" if extra else layout
