"""``dlscale report --out DIR``: a self-contained HTML (and/or Markdown) report of the store."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from dlscale.cli.common import DbOpt, info, out
from dlscale.format import fmt_count

HELP = """Write an HTML/Markdown report of the runs in the results database.

System inventory, throughput per model
and device count (one section per sample unit: images/s, tokens/s, samples/s; one table per
family), seed 000's domain scaling table (speed-up over the smallest device count, efficiency,
and with --reference the score over a reference system), scaling efficiency against ideal,
scale-up vs scale-out, time-to-accuracy curves and monitoring series where such runs exist, and
failed runs with their errors. Every
plot has its data table beside it. The HTML file is self-contained (plots embedded, no network
needed); the Markdown version links PNGs written next to it. Reads the database only."""

EPILOG = """Examples:\n\n
  dlscale report --out report/\n\n
  dlscale report --tag small-cpu --tag ref:seed001-scaling --out report/ --format both\n\n
  dlscale report --tag ladder --reference tag:reference-box --out report/"""


class ReportFormat(str, Enum):
    html = "html"
    md = "md"
    both = "both"


def report(
    out_dir: Annotated[str, typer.Option("--out", "-o", help="Directory to write report.html / report.md into.")],
    tag: Annotated[Optional[list[str]], typer.Option("--tag", help="Only runs with this tag (repeatable).")] = None,
    model: Annotated[Optional[list[str]], typer.Option("--model", help="Only runs of this model (repeatable).")] = None,
    title: Annotated[str, typer.Option("--title", help="The report's title.")] = "dlscale training performance report",
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="html | md | both.")] = ReportFormat.html,
    reference: Annotated[Optional[str], typer.Option("--reference", help="Score the domain table over this selection's runs (MLPerf v0.5 style), e.g. tag:p100 or ref:seed001-scaling,system:NAME.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the report's files in --out if they exist (never a "
                                        "database).")] = False,
    db: DbOpt = None,
) -> None:
    from dlscale.analysis.select import select
    from dlscale.errors import UsageError
    from dlscale.report import build, render
    from dlscale.store import Store

    with Store.open(db, create=False) as store:
        records = store.query(tag=tag or None, workload=model or None)
        ref = select(store, reference) if reference else None
        path = store.path
    if not records:
        raise UsageError(f"no runs in {path} match; run `dlscale train`/`dlscale sweep` or `dlscale import` first")
    filters = "tags " + ", ".join(tag) if tag else "all tags"
    if model:
        filters += "; models " + ", ".join(model)
    if reference:
        filters += f"; reference {reference}"
    rep = build.build(records, title, filters, str(path), reference=ref, reference_label=reference)
    try:
        written = render.write(rep, out_dir, fmt.value, force=force, db=db)
    except OSError as e:
        raise UsageError(f"cannot write the report into {out_dir}: {e.strerror}") from None
    info(f"report of {fmt_count(len(records), 'run')}")
    for p in written:
        out.print(str(p), markup=False, highlight=False)
