"""What an acceptance hands over: a JSON document, JUnit XML, the HTML report, every record, a manifest.

``write`` fills the output folder::

    verdicts.json        the verdict document (the same as ``dlscale accept --format json``)
    junit.xml            one test case per verdict, for CI systems (FAIL: a failure; ERROR: an error;
                         WARN: a failure only with warn_fails; NO EXPECTATION: skipped)
    report.html          the verdict table first, each check linked to its runs and history plots
    records/RUN_ID.json  every run of the acceptance, the acceptance's own record too
    manifest.json        the sha256 of every file above, the records' and the report's by name

A folder written again (a health check's fixed ``--out``) first loses the records its old manifest
lists, so it holds one acceptance. ``verify`` recomputes every sum and names each file that is
missing, changed or not listed.
"""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, WARN, counts
from dlscale.errors import UsageError

MANIFEST = "manifest.json"


def document(acc: Any) -> dict[str, Any]:
    """The acceptance as one JSON-ready document: outcome, counts, every verdict, what did not run."""
    rec = acc.record
    return {"acceptance_id": acc.id, "run_id": rec.run_id, "created_at": rec.created_at, "outcome": acc.outcome,
            "exit_code": acc.exit_code, "counts": counts(acc.verdicts), "system": rec.config.get("system"),
            "spec": (rec.config.get("spec") or {}).get("name"), "warn_fails": acc.warn_fails,
            "verdicts": [v.to_dict() for v in acc.verdicts],
            "not_run": [{"check": c, "why": w} for c, w in acc.not_run],
            "check_runs": (rec.raw or {}).get("check_runs") or {},
            "out_dir": str(acc.out_dir) if acc.out_dir else None,
            **({"node_action": acc.node_action} if getattr(acc, "node_action", None) else {})}


def junit_xml(acc: Any) -> str:
    """JUnit XML: a test case per verdict (classname ``dlscale.accept.CHECK``): FAIL (and WARN with
    warn_fails) a <failure>, ERROR an <error>, NO EXPECTATION <skipped>."""
    bad = {FAIL, WARN} if acc.warn_fails else {FAIL}
    n = counts(acc.verdicts)
    failures, errors = str(sum(n[s] for s in bad)), str(n[ERROR])
    suites = ET.Element("testsuites", name="dlscale accept", tests=str(len(acc.verdicts)), failures=failures,
                        errors=errors, skipped=str(n[NO_EXPECTATION]))
    suite = ET.SubElement(suites, "testsuite", name=f"dlscale accept {acc.id}", tests=str(len(acc.verdicts)),
                          failures=failures, errors=errors, skipped=str(n[NO_EXPECTATION]),
                          timestamp=acc.record.created_at, hostname=str(acc.record.config.get("system") or ""))
    for v in acc.verdicts:
        name = f"{v.figure}{' on ' + v.subject if v.subject else ''}{' vs ' + v.expectation if v.expectation else ''}"
        case = ET.SubElement(suite, "testcase", classname=f"dlscale.accept.{v.check}", name=name, time="0")
        text = _detail(v)
        if v.status in bad:
            ET.SubElement(case, "failure", message=f"{v.status}: {v.reason}", type=v.status).text = text
        elif v.status == ERROR:
            ET.SubElement(case, "error", message=f"{ERROR}: {v.reason}", type=ERROR).text = text
        elif v.status == NO_EXPECTATION:
            ET.SubElement(case, "skipped", message=f"{NO_EXPECTATION}: {v.reason}")
        ET.SubElement(case, "system-out").text = f"{v.status}: {text}"
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _detail(v: Any) -> str:
    parts = [v.reason]
    if v.measured is not None:
        parts.append(f"measured {v.measured:.6g} {v.unit}")
    if v.expected is not None:
        parts.append(f"expected {v.expected:.6g} {v.unit} ({v.expectation}: {v.source})")
    if v.related:
        parts.append("related: " + "; ".join(v.related))
    parts.append("runs: " + ", ".join(v.run_ids))
    return "; ".join(p for p in parts if p)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_json(rec: Any) -> str:
    return json.dumps(rec.to_dict(), indent=1, sort_keys=True, default=str) + "\n"


def write(acc: Any, db: str | None) -> list[Path]:
    """Write the output folder (module doc); the files written, the manifest last."""
    from dlscale.accept.outputs.report import build_html

    out = Path(acc.out_dir)
    try:
        _forget_old(out)
        (out / "records").mkdir(parents=True, exist_ok=True)
        files: list[Path] = []
        for rec in [*acc.records, acc.record]:
            p = out / "records" / f"{rec.run_id}.json"
            p.write_text(record_json(rec))
            files.append(p)
        (out / "verdicts.json").write_text(json.dumps(document(acc), indent=2, default=str) + "\n")
        (out / "junit.xml").write_text(junit_xml(acc))
        (out / "report.html").write_text(build_html(acc, _history(acc, db)))
        files += [out / "verdicts.json", out / "junit.xml", out / "report.html"]
        manifest = {"acceptance_id": acc.id, "run_id": acc.record.run_id, "created_at": acc.record.created_at,
                    "outcome": acc.outcome, "report": {"report.html": sha256(out / "report.html")},
                    "records": {p.stem: sha256(p) for p in files if p.parent.name == "records"},
                    "files": {str(p.relative_to(out)): sha256(p) for p in files}}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"cannot write the acceptance's outputs into {out}: {e.strerror}; give --out DIR") from None
    return files + [out / MANIFEST]


def _forget_old(out: Path) -> None:
    """Remove the records an earlier acceptance's manifest in ``out`` lists (and only those)."""
    try:
        listed = json.loads((out / MANIFEST).read_text()).get("files") or {}
    except (OSError, ValueError, AttributeError):
        return
    for rel in listed:
        p = out / rel
        if p.parent == out / "records" and p.suffix == ".json":
            p.unlink(missing_ok=True)


def _history(acc: Any, db: str | None) -> list[Any]:
    """The accept records of this system (the store's), this acceptance's included."""
    from dlscale.accept.sources.history import series
    from dlscale.store import Store

    with Store.open(db) as store:
        accs = [r for r in store.query(kind="accept", status="ok")
                if (r.config or {}).get("system") == acc.record.config.get("system")]
    if all(r.run_id != acc.record.run_id for r in accs):
        accs.append(acc.record)
    return series(accs)


def verify(folder: str | Path) -> tuple[int, list[str]]:
    """(files that match, problems): every file the manifest lists must be there with its sha256, and
    every record file must be listed."""
    d = Path(folder)
    try:
        manifest = json.loads((d / MANIFEST).read_text())
    except FileNotFoundError:
        raise UsageError(f"{d}: no {MANIFEST}; give the folder `dlscale accept` wrote (its --out)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{d / MANIFEST}: cannot read it: {e}") from None
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise UsageError(f"{d / MANIFEST}: no files listed; it is not a manifest of dlscale accept")
    problems, good = [], 0
    for rel, want in sorted(files.items()):
        p = d / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif sha256(p) != want:
            problems.append(f"{rel}: changed (sha256 {sha256(p)[:16]}..., manifest {str(want)[:16]}...)")
        else:
            good += 1
    for p in sorted((d / "records").glob("*.json")) if (d / "records").is_dir() else []:
        if str(p.relative_to(d)) not in files:
            problems.append(f"{p.relative_to(d)}: not in the manifest")
    for name, want in (manifest.get("report") or {}).items():
        if files.get(name) != want:
            problems.append(f"{name}: its sum in the manifest's report entry differs from its files entry")
    return good, problems
