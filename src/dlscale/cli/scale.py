"""``dlscale scale MODEL``: the data-parallel ladder, its scaling efficiency and the layout comparison."""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from dlscale.cli import distopts as dopt
from dlscale.cli.common import DbOpt, Format, FormatOpt, info, out, print_json, warn
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


def parse_devices(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--devices {text!r}: give device counts like 1,2,4,8") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"--devices {text!r}: give device counts >= 1 like 1,2,4,8")
    return sorted(set(vals))


def parse_layouts(text: str | None) -> list[tuple[int, int]]:
    out = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", part)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise UsageError(f"--layouts: {part!r} is not NODESxDEVICES_PER_NODE (e.g. 2x4)")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def plan(devices: list[int], layouts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The layouts to run: 1x1 (the baseline), the given layouts, and 1xN for a count no layout covers."""
    covered = {n * g for n, g in layouts}
    todo = {(1, 1), *layouts, *((1, d) for d in devices if d not in covered)}
    return sorted(todo, key=lambda ng: (ng[0] * ng[1], ng[0]))


def scale(
    model: Annotated[Optional[str], typer.Argument(help="Model name (not needed with --from-store).", show_default=False)] = None,
    devices: Annotated[str, typer.Option("--devices", help="Device counts of the ladder, e.g. 1,2,4,8.")] = "1,2",
    layouts: Annotated[Optional[str], typer.Option("--layouts", help="NODESxDEVICES_PER_NODE layouts, e.g. 1x8,2x4,4x2.", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Per-device batch size.")] = 32,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Input size in pixels (default: the model's native).", show_default=False)] = None,
    precision: Annotated[str, typer.Option("--precision", "-p", help="fp32 | tf32 | bf16 | fp16.")] = "fp32",
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Uncounted steps before each measured window.")] = 10,
    steps: Annotated[int, typer.Option("--steps", "-n", help="Measured steps per point.")] = 100,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
    backend: dopt.BackendOpt = None,
    emulate_nodes: dopt.EmulateOpt = None,
    link_bandwidth: dopt.BandwidthOpt = None,
    link_latency: dopt.LatencyOpt = None,
    timeout: dopt.TimeoutOpt = 300.0,
    threads_per_rank: Annotated[Optional[int], typer.Option("--threads-per-rank", help="CPU threads per rank at every point (default: cores / the largest device count), so one device means the same on every rung.", show_default=False)] = None,
    from_store: Annotated[bool, typer.Option("--from-store", help="Run nothing: analyse recorded runs (filter with --tag/--model).")] = False,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Tag of the ladder's runs (default: scale-MODEL-TIME); with --from-store, the runs to analyse.")] = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.store import Store

    if from_store:
        if not tag and not model:
            raise UsageError("--from-store needs --tag T (or a MODEL) to choose the runs")
        with Store.open(db) as s:
            recs = s.query(tag=tag, workload=model, kind="train", status="ok")
        if not recs:
            raise UsageError(f"no ok train runs match{' tag ' + repr(tag) if tag else ''}{' model ' + model if model else ''}")
        _print(recs, tag, fmt)
        return
    if not model:
        raise UsageError("give a MODEL to run the ladder, or --from-store --tag T to analyse recorded runs")
    todo = plan(parse_devices(devices), parse_layouts(layouts))
    cfg, opts = _configs(model, todo, batch_size, image_size, precision, warmup_steps, steps, device, backend,
                         emulate_nodes, link_bandwidth, link_latency, timeout, threads_per_rank, tag)
    Store.open(db).close()  # an unwritable database is a usage error before any run
    tag = cfg[0].tag
    run_ids, failed = [], []
    for (n, g), c, o in zip(todo, cfg, opts):
        info(f"dlscale scale {model}: layout {n}x{g} ({n * g} device(s))"
             + (f" on {n} emulated nodes" if o.emulate_nodes else ""))
        from dlscale.distributed.job import run_job

        try:
            rec = run_job(c, o, db)
            run_ids.append(rec.run_id)
        except RunFailure as e:
            warn(f"layout {n}x{g}: {e}")
            failed.append(f"{n}x{g}")
    with Store.open(db) as s:
        recs = s.query(run_ids=run_ids) if run_ids else []
        if recs:
            s.insert(summary_record(model, tag, todo, opts[-1], recs))
    if recs:
        _print(recs, tag, fmt)
    info(f"runs tagged {tag!r}; analyse again with: dlscale scale --from-store --tag {tag}")
    if failed:
        raise RunFailure(f"layouts {', '.join(failed)} failed (recorded as failed); the tables leave them out")


def _configs(model, todo, batch_size, image_size, precision, warmup_steps, steps, device, backend, emulate_nodes,
             link_bandwidth, link_latency, timeout, threads_per_rank, tag) -> tuple[list[Any], list[Any]]:
    """One validated (TrainConfig, DistOptions) per layout; everything checked before the first run."""
    from dataclasses import replace

    from dlscale.config import TrainConfig
    from dlscale.distributed.job import DistOptions

    most_nodes = max(n for n, _ in todo)
    if most_nodes > 1 and not emulate_nodes:
        raise UsageError(f"layout with {most_nodes} nodes: dlscale scale runs multi-node layouts on emulated nodes "
                         f"here (--emulate-nodes {most_nodes}); on a real cluster run `dlscale train --nnodes ...` on "
                         "each node with one --tag and analyse with `dlscale scale --from-store --tag T`")
    if emulate_nodes is not None and emulate_nodes < most_nodes:
        raise UsageError(f"--emulate-nodes {emulate_nodes} is fewer than the {most_nodes} nodes of the largest layout")
    if (link_bandwidth or link_latency) and not emulate_nodes:
        raise UsageError("--link-bandwidth/--link-latency shape emulated links; add --emulate-nodes K")
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // max(n * g for n, g in todo))
    tag = tag or f"scale-{model}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"
    base = TrainConfig(model=model, batch_size=batch_size, image_size=image_size, precision=precision,
                       warmup_steps=warmup_steps, steps=steps, device=device, tag=tag)
    cfgs, opts = [], []
    for n, g in todo:
        cfgs.append(replace(base))
        emulated = n > 1
        opts.append(DistOptions(nproc_per_node=g, backend=backend, emulate_nodes=n if emulated else None,
                                link_bandwidth=link_bandwidth if emulated else None,
                                link_latency=link_latency if emulated else None, timeout_s=timeout,
                                threads_per_rank=threads))
    return cfgs, opts


def summary_record(model: str, tag: str, todo: list[tuple[int, int]], opts: Any, recs: list[Any]) -> Any:
    """A ``scale`` record of the ladder: its analysis as metrics (per layout), the rungs' run ids."""
    from dlscale.analysis.scaling import analyse
    from dlscale.record import RunRecord, utc_now
    from dlscale.system import collect_cached

    result = analyse(recs)
    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    for lad in result["ladders"]:
        suffix = f"@{lad['link']}" if lad["link"] and len(result["ladders"]) > 1 else ""
        for r in lad["efficiency"]:
            for k in ("throughput", "efficiency", "intra_node_efficiency", "inter_node_efficiency", "comm_fraction"):
                metrics[f"{k}_{r['layout']}{suffix}"] = r[k]
                units[f"{k}_{r['layout']}{suffix}"] = "samples/s" if k == "throughput" else "fraction"
    for comp in result["comparisons"]:
        for r in comp["rows"]:
            key = f"pct_difference_{r['scale_up']}_vs_{r['scale_out']}" + (f"@{r['link']}" if r["link"] else "")
            metrics[key], units[key] = r["pct_difference"], "fraction"
    config = {"layouts": [f"{n}x{g}" for n, g in todo], "emulated_nodes": bool(opts.emulate_nodes),
              "link_bandwidth": opts.link_bandwidth, "link_latency": opts.link_latency,
              "threads_per_rank": opts.threads_per_rank, **{k: recs[0].config.get(k) for k in (
                  "batch_size", "image_size", "precision", "device", "backend")}}
    rec = RunRecord(kind="scale", workload=model, config=config, system=collect_cached(), metrics=metrics, units=units, raw={"ladders": result, "run_ids": [r.run_id for r in recs]}, tag=tag)
    rec.finished_at = utc_now()
    return rec


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
