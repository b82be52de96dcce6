"""Render a Report as one self-contained HTML file or as Markdown with PNGs beside it.

HTML: inline CSS, figures as base64 data URIs, no script and no external resource, so it opens
offline and shows the same everywhere. Every string from a record (tags, model names, errors,
host names) passes through ``html.escape`` here, in one place.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from dlscale.report.model import Report, Section, TableData

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#1d2630;margin:0;background:#f4f6f8}
main{max-width:1180px;margin:0 auto;padding:28px 32px 60px}
header h1{font-size:26px;margin:0 0 4px}header p{color:#5b6875;margin:0 0 18px;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin-bottom:10px}
.card{background:#fff;border:1px solid #dde3e9;border-radius:8px;padding:10px 16px;min-width:120px}
.card b{display:block;font-size:19px}.card span{color:#5b6875;font-size:12px}
section{background:#fff;border:1px solid #dde3e9;border-radius:8px;padding:18px 22px;margin:18px 0}
section h2{font-size:18px;margin:0 0 6px}section p.intro{color:#44505c;font-size:13px;margin:0 0 12px}
.pair{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
.pair figure{margin:0;flex:1 1 480px}.pair figure img{max-width:100%;border:1px solid #eef1f4}
.pair .tables{flex:1 1 420px;overflow-x:auto}
table{border-collapse:collapse;font-size:12px;width:100%}
th{background:#eef2f6;text-align:left;padding:5px 8px;border-bottom:1px solid #cfd7df}
td{padding:4px 8px;border-bottom:1px solid #eef1f4;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
caption{text-align:left;font-weight:600;padding:8px 0 4px;font-size:12px}
.note{color:#6b4e16;font-size:12px}section>figure{margin:12px 0 0}section>figure img{max-width:100%}
td.PASS{color:#2d7a46;font-weight:600}td.WARN{color:#9a6700;font-weight:600}td.FAIL{color:#b8433f;font-weight:700}
td.ERROR{color:#8e3b8e;font-weight:700}
footer{color:#7a8691;font-size:11px;margin-top:24px}
"""


def _is_num(s: str) -> bool:
    t = s.replace(",", "").replace("%", "").replace("x", "").replace("+", "").strip()
    try:
        float(t)
        return True
    except ValueError:
        return False


def _cell(v: str, link: str | None) -> str:
    """One table cell: numbers right-aligned, a verdict coloured, a link where the table gives one."""
    e = html.escape
    text = f'<a href="{e(link)}">{e(v)}</a>' if link else e(v)
    cls = "num" if _is_num(v) else v if v in ("PASS", "WARN", "FAIL", "ERROR") else ""
    return f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>"


def _table_html(t: TableData) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in t.columns)
    links = t.links or [[None] * len(row) for row in t.rows]
    body = "".join("<tr>" + "".join(_cell(v, lk) for v, lk in zip(row, links[i] if i < len(links) else [None] * len(row)))
                   + "</tr>" for i, row in enumerate(t.rows))
    cap = f"<caption>{e(t.caption)}</caption>" if t.caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section_html(s: Section) -> str:
    e = html.escape
    tables = "".join(_table_html(t) for t in s.tables)
    notes = "".join(f'<p class="note">{e(n)}</p>' for n in s.notes)
    if s.figure is not None:
        img = base64.b64encode(s.figure.png).decode()
        body = (f'<div class="pair"><figure><img alt="{e(s.figure.alt)}" src="data:image/png;base64,{img}"></figure>'
                f'<div class="tables">{tables}</div></div>')
    else:
        body = tables
    body += "".join(f'<figure><img alt="{e(f.alt)}" src="data:image/png;base64,{base64.b64encode(f.png).decode()}">'
                    "</figure>" for f in s.figures)
    anchor = f' id="{e(s.anchor)}"' if s.anchor else ""
    return f"<section{anchor}><h2>{e(s.title)}</h2><p class=\"intro\">{e(s.intro)}</p>{body}{notes}</section>"


def to_html(rep: Report) -> str:
    e = html.escape
    cards = "".join(f'<div class="card"><b>{e(v)}</b><span>{e(k)}</span></div>' for k, v in rep.summary)
    sections = "".join(_section_html(s) for s in rep.sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{e(rep.title)}</title>"
        f"<style>{CSS}</style></head><body><main><header><h1>{e(rep.title)}</h1><p>{e(rep.subtitle)}</p></header>"
        f"<div class=\"cards\">{cards}</div>{sections}"
        "<footer>Made by dlscale from its results database. Every figure is derived in docs/METRICS.md; imported "
        "runs are results made elsewhere and are marked as such.</footer></main></body></html>\n"
    )


def _md_cell(v: str) -> str:
    return (html.escape(str(v), quote=False).replace("|", "\\|").replace("\n", " ").replace("`", "\\`")
            .replace("*", "\\*").replace("_", "\\_").replace("[", "\\[").replace("]", "\\]"))


def _md_text(v: str) -> str:
    return html.escape(str(v), quote=False).replace("*", "\\*").replace("_", "\\_")


def to_markdown(rep: Report, fig_dir: str = "figures") -> tuple[str, dict[str, bytes]]:
    """The Markdown text and the figures it links to ({relative path: PNG bytes})."""
    lines = [f"# {_md_text(rep.title)}", "", _md_text(rep.subtitle), ""]
    lines += ["| " + " | ".join(_md_cell(k) for k, _ in rep.summary) + " |",
              "|" + "---|" * len(rep.summary),
              "| " + " | ".join(_md_cell(v) for _, v in rep.summary) + " |", ""]
    files: dict[str, bytes] = {}
    for s in rep.sections:
        lines += [f"## {_md_text(s.title)}", "", _md_text(s.intro), ""]
        if s.figure is not None:
            path = f"{fig_dir}/{s.figure.name}.png"
            files[path] = s.figure.png
            lines += [f"![{_md_text(s.figure.alt)}]({path})", ""]
        for t in s.tables:
            if t.caption:
                lines += [f"**{_md_text(t.caption)}**", ""]
            lines += ["| " + " | ".join(_md_cell(c) for c in t.columns) + " |", "|" + "---|" * len(t.columns)]
            lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in t.rows]
            lines.append("")
        for f in s.figures:
            path = f"{fig_dir}/{f.name}.png"
            files[path] = f.png
            lines += [f"![{_md_text(f.alt)}]({path})", ""]
        lines += [f"*{_md_text(n)}*" for n in s.notes]
    return "\n".join(lines) + "\n", files


def write(rep: Report, out_dir: str | Path, fmt: str, force: bool = False, db: str | None = None) -> list[Path]:
    """The report's files in ``out_dir``: each checked first (``paths.check_output``: never the database,
    an existing file only with ``force``), then each written whole or not at all."""
    from dlscale.paths import check_output, make_dir, write_atomic

    out = make_dir(out_dir)
    files: dict[Path, str | bytes] = {}
    if fmt in ("html", "both"):
        files[out / "report.html"] = to_html(rep)
    if fmt in ("md", "both"):
        text, figures = to_markdown(rep)
        files.update({out / rel: data for rel, data in figures.items()})
        files[out / "report.md"] = text
    for p in files:
        p.parent.mkdir(parents=True, exist_ok=True)
        check_output(p, "--out", db=db, force=force)
    for p, data in files.items():
        write_atomic(p, data, "--out")
    return [p for p in files if p.name in ("report.html", "report.md")]
