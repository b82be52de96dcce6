"""``dlscale models``: the registered workloads."""

from __future__ import annotations

from rich.table import Table

from dlscale.cli.common import Format, FormatOpt, out, print_json

HELP = ("List the models dlscale can run by family, with the unit their throughput is counted in and their "
        "default shape (random init; weights are never downloaded).")


def models(fmt: FormatOpt = Format.human) -> None:
    from dlscale import workloads

    rows = [w.describe() for w in workloads.all_workloads()]
    if fmt == Format.json:
        print_json(rows)
        return
    t = Table("model", "family", "unit", "source", "default shape", "description")
    from dlscale.workloads.base import FAMILIES

    order = list(FAMILIES)
    for r in sorted(rows, key=lambda r: (order.index(r["family"]) if r["family"] in order else len(order), r["name"])):
        t.add_row(r["name"], r["family"], r["sample_unit"], r["source"], r["defaults"], r["description"])
    out.print(t)

