"""``dlscale compare A B``: per-model % difference (seed 001 Tables 5-6) and relative scores."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dlscale.cli.common import DbOpt, Format, FormatOpt, out, print_json

HELP = """Compare two selections of runs group by group (by model unless --by says otherwise).

Prints % difference = (A - B) / B for each group, positive when A is higher (seed 001, Tables
5-6), using the mean of the metric over each group's ok runs. With --reference REF it also prints
each selection's relative score over REF, MLPerf v0.5 style: X / X_ref for throughputs,
T_ref / T for times. A selector is filters joined by commas: tag:NAME (or a bare tag),
system:NAME, model:NAME, run:ID+ID, ref:DATASET (a shipped reference dataset), imported:yes|no."""

EPILOG = """Examples:\n\n
  dlscale compare ref:seed001-table5,system:SN-8xV100-16GB-SXM2 ref:seed001-table5,system:MN-C4140-K-V100-SXM2\n\n
  dlscale compare tag:after tag:before --by model,batch_size\n\n
  dlscale compare tag:mybox tag:baseline --reference ref:seed001-scaling,system:C4140-K-V100-SXM2 --by model,world_size"""


def compare(
    a: Annotated[str, typer.Argument(help="Selection A (e.g. tag:after).", show_default=False)],
    b: Annotated[str, typer.Argument(help="Selection B, the baseline (e.g. tag:before).", show_default=False)],
    by: Annotated[str, typer.Option("--by", help="Group by these fields (comma-separated): model, batch_size, precision, image_size, world_size, nodes, layout, link, system.")] = "model",
    metric: Annotated[str, typer.Option("--metric", help="The metric compared (a key of the runs' metrics).")] = "throughput",
    reference: Annotated[Optional[str], typer.Option("--reference", help="Also score A and B relative to this selection (MLPerf v0.5 style).", show_default=False)] = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.analysis import compare as cmp
    from dlscale.cli.select import select
    from dlscale.store import Store

    keys = [k.strip() for k in by.split(",") if k.strip()]
    cmp.check_keys(keys)
    with Store.open(db) as store:
        ra, rb = select(store, a), select(store, b)
        rref = select(store, reference) if reference else None
    hib = cmp.higher_is_better([*ra, *rb], metric)
    rows = cmp.pct_table(ra, rb, keys, metric)
    scores = cmp.score_table({"A": ra, "B": rb}, rref, keys, metric, hib) if rref is not None else None
    if fmt == Format.json:
        print_json({"a": a, "b": b, "by": keys, "metric": metric, "formula": "(A - B) / B",
                    "rows": rows, "reference": reference, "higher_is_better": hib, "scores": scores})
        return
    out.print(pct_rich_table(rows, keys, metric, a, b))
    if scores is not None:
        rule = "X / X_ref" if hib else "T_ref / T"
        t = Table(*keys, f"reference {metric}", "A score", "B score",
                  title=f"relative score over the reference ({rule}; MLPerf v0.5 style)\nreference = {reference}",
                  title_justify="left")
        for r in scores:
            t.add_row(*[_s(r[k]) for k in keys], _num(r["reference"]), _x(r["A"]), _x(r["B"]))
        out.print(t)


def pct_rich_table(rows, keys, metric: str, a: str, b: str) -> Table:
    t = Table(*keys, f"A {metric}", f"B {metric}", "% difference", "runs A/B (imported)",
              title=f"% difference = (A - B) / B   (seed 001 Tables 5-6; positive: A higher)\nA = {a}\nB = {b}",
              title_justify="left")
    for r in rows:
        pct = r["pct_difference"]
        t.add_row(*[_s(r[k]) for k in keys], _num(r["a"]), _num(r["b"]),
                  "-" if pct is None else f"{pct * 100:+.2f}%",
                  f"{r['n_a']}/{r['n_b']}" + (f" ({r['imported_a']}/{r['imported_b']})" if r["imported_a"] or r["imported_b"] else ""))
    return t


def _s(v) -> str:
    return "-" if v is None else str(v)


def _num(v) -> str:
    from dlscale.format import fmt_num

    return fmt_num(v)


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x" if v >= 0.1 else f"{v:.2g}x"
