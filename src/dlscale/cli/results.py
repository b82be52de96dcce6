"""``dlscale results``: list, show and export what the store holds, and push runs into another store (no torch)."""

from __future__ import annotations

import csv
import io
import json
import sys
from enum import Enum
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from dlscale.cli.common import DbOpt, Format, FormatOpt, out, print_json
from dlscale.cli.render import train_summary_table
from dlscale.format import fmt_count, fmt_num, format_metric
from dlscale.record import flatten

app = typer.Typer(help="List, show, export and push recorded runs.", no_args_is_help=True)

TagsOpt = Annotated[Optional[list[str]], typer.Option("--tag", help="Only runs with this tag (repeatable).")]
ModelOpt = Annotated[Optional[list[str]], typer.Option("--model", "--workload", help="Only runs of this model/workload (repeatable).")]
KindOpt = Annotated[Optional[str], typer.Option("--kind", help="Only runs of this kind (train, micro, ...).")]
StatusOpt = Annotated[Optional[str], typer.Option("--status", help="ok | failed.")]


def _query(db, tag, model, kind, status, limit=None):
    from dlscale.store import Store

    with Store.open(db, create=False) as s:
        return s.query(tag=tag or None, workload=model or None, kind=kind, status=status, limit=limit)


@app.command("list", help="List runs, newest first.\n\nExample: dlscale results list --tag baseline --model resnet50")
def list_(
    tag: TagsOpt = None, model: ModelOpt = None, kind: KindOpt = None, status: StatusOpt = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows.")] = 50,
    db: DbOpt = None, fmt: FormatOpt = Format.human,
) -> None:
    if limit < 1:
        from dlscale.errors import UsageError

        raise UsageError(f"--limit must be >= 1 (rows to list, newest first), got {limit}")
    recs = _query(db, tag, model, kind, status, limit)
    if fmt == Format.json:
        print_json([_summary(r) for r in recs])
        return
    t = Table("run id", "created (UTC)", "kind", "workload", "status", "tag", "throughput", "CV", "MFU")
    for r in recs:
        m = r.metrics
        thr = m.get("throughput")
        t.add_row(
            r.run_id, r.created_at[:19].replace("T", " "), r.kind + (" (imported)" if r.imported else ""),
            r.workload, r.status if r.status == "ok" else f"[red]{r.status}[/red]", r.tag or "",
            "" if thr is None else f"{fmt_num(thr)} {r.units.get('throughput', '')}",
            format_metric("cv", m.get("cv"), "fraction") if "cv" in m else "",
            format_metric("mfu", m.get("mfu"), "fraction") if "mfu" in m else "",
        )
    out.print(t)
    if not recs:
        out.print("(no runs match)")


def _summary(r) -> dict[str, Any]:
    return {
        "run_id": r.run_id, "created_at": r.created_at, "kind": r.kind, "workload": r.workload,
        "status": r.status, "tag": r.tag, "imported": r.imported, "hostname": r.hostname,
        "throughput": r.metrics.get("throughput"), "error": r.error,
    }


@app.command("show", help="Show one run in full: config, metrics with units, system, raw data summary.\n\nExample: dlscale results show 20261122T0140")
def show(
    run_id: Annotated[str, typer.Argument(help="Run id or an unambiguous prefix.", show_default=False)],
    db: DbOpt = None, fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.store import Store

    with Store.open(db, create=False) as s:
        rec = s.get(run_id)
    if fmt == Format.json:
        print_json(rec.to_dict())
        return
    if rec.kind == "train":
        from dlscale.cli.breakdown_view import breakdown_tables

        out.print(train_summary_table(rec))
        for t in breakdown_tables(rec):
            out.print(t)
    if rec.kind == "data" and rec.status == "ok":
        from dlscale.cli.data import data_table

        out.print(data_table(rec))
    elif rec.kind == "micro":
        from dlscale.micro.report import print_record

        print_record(rec, out)
    elif rec.kind == "tta":
        from dlscale.cli.tta import summary_tables

        for t in summary_tables(rec):
            out.print(t)
    head = Table(title=f"run {rec.run_id}", show_header=False, title_justify="left")
    head.add_column("what", style="bold")
    head.add_column("value")
    for k in ("kind", "workload", "status", "error", "tag", "imported", "created_at", "finished_at", "dlscale_version"):
        head.add_row(k, fmt_num(getattr(rec, k)))
    head.add_row("config hash", rec.config_hash)
    for w in rec.warnings:
        head.add_row("warning", f"[yellow]{w}[/yellow]")
    out.print(head)
    out.print(_kv_table("config", rec.config))
    mt = Table("metric", "value", "unit", title="metrics", title_justify="left")
    for k, v in rec.metrics.items():
        mt.add_row(k, format_metric(k, v, rec.units.get(k)), rec.units.get(k, ""))
    out.print(mt)
    out.print(_kv_table("system", flatten(rec.system)))
    rt = Table("series", "length", "first values", title="raw data", title_justify="left")
    for k, v in flatten(rec.raw).items():  # nested series (e.g. the monitor's columns) as dotted names
        flat = [x for row in v for x in (row if isinstance(row, list) else [row])] if isinstance(v, list) else [v]
        rt.add_row(k, str(len(flat)), ", ".join(fmt_num(x) for x in flat[:6]) + (" ..." if len(flat) > 6 else ""))
    out.print(rt)


def _kv_table(title: str, d: dict[str, Any]) -> Table:
    t = Table(show_header=False, title=title, title_justify="left")
    t.add_column("key", style="bold")
    t.add_column("value")
    for k, v in d.items():
        t.add_row(k, json.dumps(v, default=str) if isinstance(v, (list, dict)) else fmt_num(v))
    return t


class ExportFormat(str, Enum):
    csv = "csv"
    json = "json"
    parquet = "parquet"


@app.command("export", help="Export runs as CSV (one row a run: columns, config.*, metrics.*), JSON (full records) or Parquet (the CSV columns plus every record part as JSON; needs --out). --out never replaces the database it reads or any database, and an existing file only with --force; the file is written whole or not at all.\n\nExample: dlscale results export --format csv --tag baseline --out runs.csv")
def export(
    fmt: Annotated[ExportFormat, typer.Option("--format", "-f", help="csv | json | parquet.")] = ExportFormat.csv,
    out_path: Annotated[Optional[str], typer.Option("--out", "-o", help="Write here instead of stdout (a new file; an existing one with --force).", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists (never a database).")] = False,
    tag: TagsOpt = None, model: ModelOpt = None, kind: KindOpt = None, status: StatusOpt = None,
    db: DbOpt = None,
) -> None:
    from dlscale.paths import check_output, write_atomic

    if out_path:
        check_output(out_path, "--out", db=db, force=force)
    elif force:
        from dlscale.errors import UsageError

        raise UsageError("--force replaces an existing --out file: give --out FILE, or drop --force")
    recs = _query(db, tag, model, kind, status)
    if fmt == ExportFormat.parquet:  # binary: a file, never the terminal
        from dlscale.report.parquet import write_parquet

        write_parquet(recs, out_path)
        return
    text = export_text(recs, fmt.value)
    if out_path:
        write_atomic(out_path, text, "--out")
    else:
        sys.stdout.write(text)


def export_text(recs, fmt: str) -> str:
    if fmt == "json":
        return json.dumps([r.to_dict() for r in recs], indent=2, default=str) + "\n"
    # the record's flat row; lists (and dicts among the metrics) as JSON text in their cell
    rows = [{k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.flat().items()} for r in recs]
    cols: list[str] = []
    for row in rows:
        cols.extend(k for k in row if k not in cols)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


@app.command("history", help="Each acceptance figure over time: one row per figure (check, figure, device), one column "
             "per acceptance, the value and its verdict. --device follows one device by its identity (a GPU's NVML "
             "UUID or serial, a CPU machine's id) over every acceptance that saw it, whichever server it sat in."
             "\n\nExamples: dlscale results history system:gpu-node-07; dlscale results history --device GPU-8f2e")
def history(
    selector: Annotated[Optional[str], typer.Argument(help="Which acceptances: a selector whose runs include `accept` "
                                                           "runs, e.g. system:HOST, kind:accept, tag:ACCEPTANCE_ID, "
                                                           "model:SPEC_NAME (with --device: default kind:accept).",
                                                      show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="One device's own series: its GPU UUID or serial, "
                                                  "or a machine id (or a prefix of 4+ characters).",
                                                  show_default=False)] = None,
    last: Annotated[int, typer.Option("--last", help="Show the newest this many acceptances (JSON: all).")] = 6,
    db: DbOpt = None, fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.accept.sources.history import device_series, series
    from dlscale.analysis.select import select
    from dlscale.errors import UsageError
    from dlscale.store import Store

    if not selector and not device:
        raise UsageError("`dlscale results history` needs a SELECTOR (e.g. system:HOST) or --device ID")
    with Store.open(db, create=False) as s:
        accs = [r for r in select(s, selector or "kind:accept") if r.kind == "accept"]
    if not accs:
        raise UsageError(f"selector {selector or 'kind:accept'!r} matches no acceptance (kind accept); run `dlscale "
                         "accept` first, or see `dlscale results list --kind accept`")
    ident = None
    if device:
        ident, found = device_series(accs, device)
        if ident is None:
            raise UsageError(f"no acceptance saw a device {device!r} (a GPU's UUID or serial, a machine id); the "
                             "ids are in `dlscale results show ACCEPTANCE_RUN --format json` under raw.devices")
    else:
        found = series(accs)
    if fmt == Format.json:
        doc = [x.to_dict() for x in found]
        print_json({"device": ident, "series": doc} if device else doc)
        return
    order = sorted({(p.created_at, p.acceptance) for x in found for p in x.points})[-max(1, last):]
    title = (f"history of device {device} ({', '.join(str(v) for v in ident.values() if v)})" if ident else
             f"acceptance history of {selector} ({fmt_count(len(accs), 'acceptance')})")
    t = Table("check", "figure", "on", "unit", *(c[:16].replace("T", " ") for c, _ in order), title=title,
              title_justify="left")
    mark = {"PASS": "", "WARN": " [yellow]W[/yellow]", "FAIL": " [red]F[/red]", "ERROR": " [magenta]E[/magenta]",
            "NO EXPECTATION": " (new)"}
    for x in found:
        at = {p.acceptance: p for p in x.points}
        t.add_row(x.check, x.figure, x.subject or "system", x.unit,
                  *(("-" if at.get(a) is None or at[a].value is None else fmt_num(at[a].value))
                    + (mark.get(at[a].status, "") if at.get(a) else "") for _, a in order))
    out.print(t)


PUSH_CHUNK = 100  # runs per transaction: a lost connection re-sends at most this many
FromDbOpt = Annotated[Optional[str], typer.Option(
    "--db", help="The store to copy from: a file path or a postgresql:// URL. Default: $DLSCALE_DB, else ~/.local/share/dlscale/results.db.",
    show_default=False)]


@app.command("push", help="Copy runs into another store, e.g. a node's SQLite file into the team's PostgreSQL, skipping runs already there (by run id): pushing twice adds nothing.\n\nExample: dlscale results push --db /scratch/node.db --to postgresql://alice@db.lab/dlscale --tag sweep1")
def push(
    to: Annotated[str, typer.Option("--to", help="The store to copy into: a postgresql:// URL (password in PGPASSWORD or ~/.pgpass) or a file path.", show_default=False)],
    tag: TagsOpt = None, model: ModelOpt = None, kind: KindOpt = None, status: StatusOpt = None,
    db: FromDbOpt = None, fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.store import Store

    recs = _query(db, tag, model, kind, status)
    recs.reverse()  # oldest first: an interrupted push leaves the newest runs to the next one
    pushed: list[str] = []
    with Store.open(to) as dest:
        for i in range(0, len(recs), PUSH_CHUNK):
            pushed.extend(r.run_id for r in dest.insert_new(recs[i:i + PUSH_CHUNK]))
        where = dest.location
    if fmt == Format.json:
        print_json({"to": where, "pushed": len(pushed), "already_there": len(recs) - len(pushed), "run_ids": pushed})
        return
    out.print(f"pushed {len(pushed)}, already there {len(recs) - len(pushed)} (into {where})", markup=False)
