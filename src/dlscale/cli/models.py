"""``dlscale models``: the registered workloads."""

from __future__ import annotations

from rich.table import Table

from dlscale.cli.common import Format, FormatOpt, out, print_json

HELP = "List the models dlscale can run (random init; weights are never downloaded)."


def models(fmt: FormatOpt = Format.human) -> None:
    from dlscale import workloads

    rows = [w.describe() for w in workloads.all_workloads()]
    if fmt == Format.json:
        print_json(rows)
        return
    t = Table("model", "source", "native size", "min size", "classes", "description")
    for r in rows:
        t.add_row(r["name"], r["source"], str(r["native_image_size"]), str(r["min_image_size"]),
                  str(r["num_classes"]), r["description"])
    out.print(t)
