"""``dlscale predict MODEL --from RUN --layouts ...``: scaling of layouts you do not have."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dlscale.cli.common import DbOpt, Format, FormatOpt, TagOpt, info, out, print_json, warn

HELP = """Predict data-parallel scaling from a one-device run and link parameters, and record it.

A model of one step: the one-device run's forward, backward and optimizer time (a `dlscale train`
run, or a published one-GPU figure brought in by `dlscale import`, split by the model's counted
FLOPs); the gradient buckets DDP all-reduces, each ready when backward has computed it; each
bucket's ring all-reduce time from an alpha-beta model of the link it crosses (fitted from
`dlscale micro collectives` runs in the store, or a datasheet link given with --intra/--inter);
what overlapping the all-reduce costs backward; the part of communication backward does not hide.
Prints per layout the predicted throughput, efficiency, intra- and inter-node efficiency and
communication fraction, and on stderr what each term assumed; each layout is stored as a
`prediction` record, so that `dlscale compare kind:prediction tag:MEASURED --by model,layout,link`
shows the error per layout."""

EPILOG = """Examples:\n\n
  dlscale predict resnet50 --from RUN_ID --layouts 1x8,2x4,4x2 --intra nvlink4 --inter ib-ndr\n\n
  dlscale predict resnet18 --from RUN_ID --layouts 1x2,2x1 --inter 1gbit --tag pred\n\n
  dlscale import --ref seed001-scaling; dlscale predict resnet50 --from IMPORTED_1GPU_ID --layouts 1x4,2x4 --intra pcie3 --inter edr\n\n
  dlscale predict llama3.2_1b --from RUN_ID --layouts 4x8 --intra nvlink4 --inter ib-ndr --nics-per-node 8\n\n
  dlscale compare kind:prediction,tag:pred tag:measured --by model,layout,link\n\n
  dlscale predict --links"""


def predict(
    model: Annotated[Optional[str], typer.Argument(help="Model (checked against the --from run).", show_default=False)] = None,
    from_run: Annotated[Optional[str], typer.Option("--from", help="The one-device run (id or prefix): a `dlscale train` run, or a one-GPU figure brought in by `dlscale import`.", show_default=False)] = None,
    layouts: Annotated[Optional[str], typer.Option("--layouts", help="NODESxDEVICES_PER_NODE layouts, e.g. 1x8,2x4,4x2.", show_default=False)] = None,
    intra: Annotated[Optional[str], typer.Option("--intra", help="Intra-node link: a datasheet name (nvlink4, pcie-gen4-x16, ...), a rate, measured[:RATE] or run:ID (fitted from a collectives run); default: the newest measured one.", show_default=False)] = None,
    inter: Annotated[Optional[str], typer.Option("--inter", help="Inter-node link: a datasheet name (ib-ndr, 100gbe, ...), a rate (1gbit), measured[:RATE] or run:ID; default: the newest measured one.", show_default=False)] = None,
    algorithm: Annotated[str, typer.Option("--algorithm", help="ring (a flat ring over every rank) | hierarchical.")] = "ring",
    host_cost: Annotated[bool, typer.Option("--host-cost/--no-host-cost", help="CPU hosts: add the all-reduce's own cost under load, fitted from a measured one-node multi-rank run of the same test.")] = True,
    nics: Annotated[int, typer.Option("--nics-per-node", help="NICs per node, each at the --inter link's rate (an HGX H100 has 8 rails).")] = 1,
    overlap_cost: Annotated[Optional[float], typer.Option("--overlap-cost", help="Share of backward lost while an all-reduce is in flight, 0 (free) to 1 (none); default: fitted from a one-node multi-device run of the same test in the store, else 0.5 on GPUs, 0 on CPU.", show_default=False)] = None,
    find_unused: Annotated[Optional[bool], typer.Option("--find-unused-parameters/--no-find-unused-parameters", help="The target job's DDP flag (its buckets are then not rebuilt in ready order); default: as the --from run.", show_default=False)] = None,
    shared_host: Annotated[Optional[bool], typer.Option("--shared-host/--own-hosts", help="The nodes share the --from run's machine and its cores (a rehearsal cluster on one machine); default: when the --inter link is emulated.", show_default=False)] = None,
    links: Annotated[bool, typer.Option("--links", help="List the datasheet links with their figures and sources, and exit.")] = False,
    tag: TagOpt = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.errors import UsageError

    if links:
        _print_links(fmt)
        return
    if not from_run or not layouts:
        raise UsageError("give --from RUN (a one-device `dlscale train` run) and --layouts, e.g. 1x8,2x4")
    from dlscale import api
    from dlscale.distributed.ladder import parse_layouts

    recs = api.predict(from_run, parse_layouts(layouts), model=model, intra=intra, inter=inter,
                       algorithm=algorithm, host_cost=host_cost, nics=nics, overlap_cost=overlap_cost,
                       find_unused_parameters=find_unused, tag=tag, shared_host=shared_host, db=db)
    if fmt == Format.json:
        print_json([r.to_dict() for r in recs])
        return
    for note in sorted({n for r in recs for n in r.raw.get("notes", [])}):
        (warn if "not measured" in note else info)(note)
    out.print(_table(recs))


def _table(recs: list[Any]) -> Any:
    from rich.table import Table

    from dlscale.format import fmt_num, fmt_pct, fmt_seconds

    base = recs[0].config if recs else {}
    t = Table("layout", "devices", "throughput", "speed-up", "efficiency", "intra-node eff.", "inter-node eff.",
              "comm fraction", "exposed comm", "overlap loss", "step", "contention",
              title=f"predicted scaling: {recs[0].workload if recs else ''} from run {base.get('from_run')}",
              title_justify="left")
    for r in recs:
        m, c = r.metrics, r.config
        t.add_row(f"{c['nodes']}x{c['devices_per_node']}", str(c["world_size"]), f"{fmt_num(m.get('throughput'))}/s",
                  "-" if m.get("speedup") is None else f"{m['speedup']:.2f}x", fmt_pct(m.get("efficiency")),
                  fmt_pct(m.get("intra_node_efficiency")), fmt_pct(m.get("inter_node_efficiency")),
                  fmt_pct(m.get("comm_fraction")), fmt_seconds(m.get("exposed_comm")),
                  fmt_seconds(m.get("overlap_loss")), fmt_seconds(m.get("step_time")),
                  f"{m.get('contention', 1.0):.2f}x")
    return t


def _print_links(fmt: Format) -> None:
    from rich.table import Table

    from dlscale.predict.links import DATASHEET

    if fmt == Format.json:
        print_json({k: v.to_dict() for k, v in DATASHEET.items()})
        return
    t = Table("link", "bandwidth (GB/s, per direction)", "alpha (us)", "source", title="datasheet links",
              title_justify="left")
    for name, lk in DATASHEET.items():
        rings = ", ".join(f"{g} GPUs {bw / 1e9:g}" for g, bw in (lk.ring_bandwidth or {}).items())
        t.add_row(name, f"{lk.bandwidth / 1e9:g}" + (f" ({rings})" if rings else ""), f"{lk.alpha_s * 1e6:g}",
                  lk.source)
    out.print(t)
