"""``dlscale predict MODEL --from RUN --layouts ...``: scaling of layouts you do not have."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dlscale.cli.common import DbOpt, Format, FormatOpt, TagOpt, info, out, print_json, warn

HELP = """Predict data-parallel scaling from a one-device run and link parameters, and record it.

A model of one step: the measured run's forward, backward and optimizer time; the gradient buckets
DDP all-reduces, in the order backward produces them; each bucket's ring all-reduce time from an
alpha-beta model of the link it crosses (fitted from `dlscale micro collectives` runs in the store,
or a datasheet link given with --intra/--inter); the part of communication backward does not hide.
Prints per layout the predicted throughput, efficiency, intra- and inter-node efficiency and
communication fraction; each layout is stored as a `prediction` record, so that
`dlscale compare kind:prediction tag:MEASURED --by model,layout,link` shows the error per layout."""

EPILOG = """Examples:\n\n
  dlscale predict resnet50 --from RUN_ID --layouts 1x8,2x4,4x2 --intra nvlink4 --inter ib-ndr\n\n
  dlscale predict resnet18 --from RUN_ID --layouts 1x2,2x1 --inter 1gbit --tag pred\n\n
  dlscale compare kind:prediction,tag:pred tag:measured --by model,layout,link\n\n
  dlscale predict --links"""


def predict(
    model: Annotated[Optional[str], typer.Argument(help="Model (checked against the --from run).", show_default=False)] = None,
    from_run: Annotated[Optional[str], typer.Option("--from", help="The measured one-device `dlscale train` run (id or prefix).", show_default=False)] = None,
    layouts: Annotated[Optional[str], typer.Option("--layouts", help="NODESxDEVICES_PER_NODE layouts, e.g. 1x8,2x4,4x2.", show_default=False)] = None,
    intra: Annotated[Optional[str], typer.Option("--intra", help="Intra-node link: a datasheet name (nvlink4, pcie-gen4-x16, ...), a rate, measured[:RATE] or run:ID (fitted from a collectives run); default: the newest measured one.", show_default=False)] = None,
    inter: Annotated[Optional[str], typer.Option("--inter", help="Inter-node link: a datasheet name (ib-ndr, 100gbe, ...), a rate (1gbit), measured[:RATE] or run:ID; default: the newest measured one.", show_default=False)] = None,
    algorithm: Annotated[str, typer.Option("--algorithm", help="ring (a flat ring over every rank) | hierarchical.")] = "ring",
    host_cost: Annotated[bool, typer.Option("--host-cost/--no-host-cost", help="CPU hosts: add the all-reduce's own cost under load, fitted from a measured one-node multi-rank run of the same test.")] = True,
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
                       algorithm=algorithm, host_cost=host_cost, tag=tag, db=db)
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
              "comm fraction", "exposed comm", "step", "contention",
              title=f"predicted scaling: {recs[0].workload if recs else ''} from run {base.get('from_run')}",
              title_justify="left")
    for r in recs:
        m, c = r.metrics, r.config
        t.add_row(f"{c['nodes']}x{c['devices_per_node']}", str(c["world_size"]), f"{fmt_num(m.get('throughput'))}/s",
                  "-" if m.get("speedup") is None else f"{m['speedup']:.2f}x", fmt_pct(m.get("efficiency")),
                  fmt_pct(m.get("intra_node_efficiency")), fmt_pct(m.get("inter_node_efficiency")),
                  fmt_pct(m.get("comm_fraction")), fmt_seconds(m.get("exposed_comm")), fmt_seconds(m.get("step_time")),
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
        t.add_row(name, f"{lk.bandwidth / 1e9:g}", f"{lk.alpha_s * 1e6:g}", lk.source)
    out.print(t)
