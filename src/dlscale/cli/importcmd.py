"""``dlscale import FILE`` / ``--ref NAME``: bring in results made elsewhere, marked as imported."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dlscale.cli.common import DbOpt, Format, FormatOpt, TagOpt, info, out, print_json
from dlscale.format import fmt_count

HELP = """Import results made elsewhere so they can be compared with dlscale's own runs.

FILE may be a tf_cnn_benchmarks log (header block and `total images/sec:`), Horovod synthetic
benchmark output (`Total img/sec on N GPU(s)`), or a CSV with the columns system, model
[, precision, batch_size, nodes, devices_per_node, throughput, time_to_accuracy_s,
target_accuracy, epochs, speedup, note] (docs/METRICS.md). --ref NAME imports one of the seed
papers' published datasets instead (--list-refs lists them). Imported runs are stored with
imported=true and shown as imported everywhere; a file imported twice is stored once."""

EPILOG = """Examples:\n\n
  dlscale import resnet50_8gpu.log --system DGX-1 --tag vendor\n\n
  dlscale import horovod_out.txt --system cluster-a --nodes 2 --devices-per-node 4\n\n
  dlscale import --ref seed001-table5\n\n
  dlscale import --list-refs"""


def import_(
    file: Annotated[Optional[str], typer.Argument(help="The file to import.", show_default=False)] = None,
    ref: Annotated[Optional[str], typer.Option("--ref", help="Import a shipped reference dataset by name.", show_default=False)] = None,
    list_refs: Annotated[bool, typer.Option("--list-refs", help="List the shipped reference datasets and their sources.")] = False,
    input_format: Annotated[str, typer.Option("--input-format", help="auto | tf_cnn_benchmarks | horovod | csv.")] = "auto",
    system: Annotated[Optional[str], typer.Option("--system", help="Name of the system the results came from.", show_default=False)] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="Nodes the run used (logs do not say).", show_default=False)] = None,
    devices_per_node: Annotated[Optional[int], typer.Option("--devices-per-node", help="Devices per node.", show_default=False)] = None,
    precision: Annotated[Optional[str], typer.Option("--precision", help="Precision the run used.", show_default=False)] = None,
    tag: TagOpt = None,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from pathlib import Path

    from dlscale.errors import UsageError
    from dlscale.importers import records as imp
    from dlscale.store import Store

    if list_refs:
        rows = [{"name": n, "runs": len(imp.reference_records(n)), "source": imp.reference_source(n)}
                for n in imp.reference_names()]
        if fmt == Format.json:
            print_json(rows)
            return
        t = Table("name", "runs", "source", title="reference datasets (dlscale import --ref NAME)", title_justify="left")
        for r in rows:
            t.add_row(r["name"], str(r["runs"]), r["source"])
        out.print(t)
        return
    if (file is None) == (ref is None):
        raise UsageError("give either FILE or --ref NAME (see --list-refs)")
    if ref is not None:
        recs = imp.reference_records(ref, tag)
    else:
        rows = imp.with_overrides(imp.parse_file(file, input_format), system=system, nodes=nodes,
                                  devices_per_node=devices_per_node, precision=precision)
        rows = [r if r.system else imp.with_overrides([r], system=Path(file).stem)[0] for r in rows]
        recs = [imp.to_record(r, str(Path(file).resolve()), tag or "imported", i) for i, r in enumerate(rows)]
    with Store.open(db) as store:  # checks and writes in one transaction: concurrent imports store one copy
        new = store.insert_imports(recs)
    if len(new) < len(recs):
        again = len(recs) - len(new)
        info(f"{again} of {fmt_count(len(recs), 'run')} {'was' if again == 1 else 'were'} imported before; stored once")
    if fmt == Format.json:
        print_json([r.to_dict() for r in new])
        return
    t = Table("run id", "system", "model", "devices", "throughput", "other", title=f"imported {len(new)} run(s) "
              f"(tag {recs[0].tag!r})", title_justify="left")
    from dlscale.format import fmt_num

    for r in new:
        m = r.metrics
        other = ", ".join(f"{k} {fmt_num(m[k])}" for k in ("time_to_accuracy", "epochs", "speedup") if k in m)
        t.add_row(r.run_id, str(r.config.get("system")), r.workload, fmt_num(m.get("world_size")),
                  fmt_num(m.get("throughput")), other)
    out.print(t)
