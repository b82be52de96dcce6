"""Records -> a Report: headline, systems, throughput, domain scaling, scaling, layouts, extras, failures.

Reads records only (the caller queried the store); never runs anything. Imported runs are
labelled "imported" wherever they appear; they are never counted as measured. Throughput is in
each record's sample unit (images/s, tokens/s, samples/s): every section that shows it has one
section (or table) per unit and one table per family, so no table, axis or sum mixes units.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from dlscale.analysis import domains
from dlscale.analysis.compare import key_value
from dlscale.analysis.domains import system_label
from dlscale.format import fmt_ci, fmt_count, fmt_fixed, fmt_pct
from dlscale.record import RunRecord
from dlscale.report import plots, sections_extra
from dlscale.report.domain_section import domain_section
from dlscale.report.efficiency_section import efficiency_section
from dlscale.report.model import Figure, Report, Section, TableData


def build(records: Sequence[RunRecord], title: str, filters: str, db: str,
          reference: Sequence[RunRecord] | None = None, reference_label: str | None = None) -> Report:
    """The report of ``records``; ``reference`` (runs of a reference system) adds scores to the domain table."""
    ok = [r for r in records if r.status == "ok"]
    failed = [r for r in records if r.status != "ok"]
    measured = [r for r in records if not r.imported]
    when = [r.created_at for r in measured] or [""]
    summary = [
        ("runs", f"{len(records)}"),
        ("measured / imported", f"{len(measured)} / {len(records) - len(measured)}"),
        ("failed", f"{len(failed)}"),
        ("models", f"{len({r.workload for r in ok})}"),
        ("systems", f"{len({system_label(r) for r in records})}"),
    ]
    train = [r for r in ok if r.kind == "train" and isinstance(r.metrics.get("throughput"), (int, float))]
    for unit, recs in domains.by_unit(r for r in train if not r.imported).items():  # one headline per unit
        best = max(recs, key=lambda r: r.metrics["throughput"])
        summary.append((f"highest measured throughput ({domains.rate_unit(unit)})",
                        f"{fmt_fixed(best.metrics['throughput'])} {_unit(best)}/s ({_config_label(best)})"))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    span = f"measured {min(when)[:16].replace('T', ' ')} to {max(when)[:16].replace('T', ' ')} UTC" if measured else "no measured runs"
    rep = Report(title=title, subtitle=f"generated {stamp} from {db}; {filters}; {span}", summary=summary)
    rep.sections.append(systems_section(records))
    for imported, heading in ((False, "Throughput per model and device count (measured)"),
                              (True, "Imported and reference results")):
        for unit, recs in domains.by_unit(r for r in train if r.imported == imported).items():
            rep.sections.append(throughput_section(recs, f"{heading}: {domains.rate_unit(unit)}"))
    for metric in ("throughput", "time_to_target"):
        dom = domain_section(ok, reference, reference_label, metric=metric)
        if dom is not None:
            rep.sections.append(dom)
    eff = efficiency_section(ok)
    if eff is not None:
        rep.sections.append(eff)
    for build_extra in sections_extra.BUILDERS:
        sec = build_extra(ok)
        rep.sections.extend([sec] if isinstance(sec, Section) else sec or [])
    rep.sections.append(failures_section(failed))
    return rep


def _unit(r: RunRecord) -> str:
    """The record's sample unit (images, tokens, samples); old records without one are their family's."""
    return domains.sample_unit(r)


def systems_section(records: Sequence[RunRecord]) -> Section:
    by: dict[str, list[RunRecord]] = {}
    for r in records:
        by.setdefault(system_label(r), []).append(r)
    rows = []
    for name, recs in sorted(by.items()):
        r = recs[0]
        s = r.system or {}
        if r.imported:
            src = str(r.config.get("source") or "")
            what = src.split(" (")[0] if src.startswith("reference:") else f"imported {r.config.get('source_format') or ''}"
            rows.append([name, what, "-", "-", "-", "-", str(len(recs))])
            continue
        cpu = s.get("cpu") or {}
        acc = s.get("accelerators") or {}
        gpus = ", ".join(d.get("name", "?") for d in acc.get("devices") or []) or "none"
        mem = (s.get("memory") or {}).get("total_bytes")
        sw = s.get("software") or {}
        rows.append([name, str(cpu.get("model") or "-"), f"{fmt_count(cpu.get('physical_cores'), 'core')} / "
                     f"{fmt_count(cpu.get('logical_cpus'), 'thread')}", "-" if not mem else f"{mem / 2**30:.1f} GiB",
                     gpus, f"torch {sw.get('torch') or '-'}", str(len(recs))])
    return Section("System inventory", "Where the runs ran (from each record's inventory); imported runs carry "
                   "only the name of the system they came from.",
                   tables=[TableData(["system", "CPU", "cores", "memory", "GPUs", "software", "runs"], rows)])


def _config_label(r: RunRecord) -> str:
    """'resnet18 / bs 8 / 32px / fp32 / 1 dev': model, per-device batch, the sample's shape, precision, devices."""
    c = r.config
    parts = [r.workload, f"bs {c.get('batch_size')}" if c.get("batch_size") else None,
             f"{c.get('image_size')}px" if c.get("image_size") else None,
             f"seq {c.get('seq_len')}" if c.get("seq_len") else None,
             f"{c.get('tokens_per_batch')} tok/batch" if c.get("tokens_per_batch") else None,
             c.get("model_config"), c.get("precision")]
    n = key_value(r, "world_size")
    nodes = key_value(r, "nodes")
    parts.append(f"{nodes}x{n // nodes if nodes and n % nodes == 0 else '?'} dev" if nodes and nodes > 1 else f"{n} dev")
    return " / ".join(str(p) for p in parts if p)


def _throughput_row(system: str, imported: bool, label: str, recs: Sequence[RunRecord]) -> tuple[list[str], float, Any]:
    """One configuration's table row, its mean throughput and its 95% interval (one run only)."""
    thr = [r.metrics["throughput"] for r in recs]
    mean = sum(thr) / len(thr)
    ci = recs[0].metrics.get("throughput_ci95") if len(recs) == 1 else None
    ci = tuple(ci) if isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci) else None
    cvs = [r.metrics.get("cv") for r in recs if isinstance(r.metrics.get("cv"), (int, float))]
    mfus = [r.metrics.get("mfu") for r in recs if isinstance(r.metrics.get("mfu"), (int, float))]
    row = [label, system + (" (imported)" if imported else ""), fmt_fixed(mean),
           fmt_ci(ci[0], ci[1], fmt_fixed) if ci else "-", fmt_pct(max(cvs), 1) if cvs else "-",
           fmt_pct(sum(mfus) / len(mfus), 1) if mfus else "-", str(len(recs))]
    return row, mean, ci


def throughput_section(train: Sequence[RunRecord], title: str) -> Section:
    """Throughput of runs in ONE sample unit: a bar chart in that unit and one table per family."""
    units = set(domains.by_unit(train))
    if len(units) != 1:
        raise ValueError(f"throughput_section takes runs of one sample unit, got {sorted(units)}")
    rate = domains.rate_unit(units.pop())
    groups: dict[tuple, list[RunRecord]] = {}
    for r in train:
        groups.setdefault((domains.family(r), system_label(r), r.imported, _config_label(r)), []).append(r)
    systems = sorted({k[1] for k in groups})
    rows: dict[str, list[list[str]]] = {}
    labels, values, errors, colors = [], [], [], []
    for (fam, system, imported, label), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][3], kv[0][1])):
        row, mean, ci = _throughput_row(system, imported, label, recs)
        rows.setdefault(fam, []).append(row)
        labels.append(label if len(systems) == 1 else f"{label} @ {system}"[:70])
        values.append(mean)
        errors.append(ci)
        colors.append(systems.index(system))
    png = plots.hbars(labels, values, errors, colors, systems, f"throughput ({rate})", title)
    intro = ("Results made elsewhere (imported logs, CSVs and the seed papers' published figures), shown for "
             "comparison; nothing here was measured on this machine." if train[0].imported else
             f"Short-test throughput ({rate} over the measured steps, warm-up excluded) with its 95% interval; "
             "several runs of one configuration are averaged. CV above 2% marks a noisy figure.")
    unit = rate.split("/")[0]
    stem = ("imported" if train[0].imported else "throughput") + ("" if unit == "images" else f"-{unit}")
    columns = ["configuration", "system", rate, "95% CI", "step CV", "MFU", "runs"]
    return Section(
        title, intro, figure=Figure(stem, png, f"bar chart of throughput ({rate}) per configuration"),
        tables=[TableData(columns, rows[f], caption=f"{f} ({rate})") for f in rows],
    )


def failures_section(failed: Sequence[RunRecord]) -> Section:
    rows = [[r.run_id, r.kind, r.workload, r.tag or "", r.created_at[:19].replace("T", " "), r.error or "(no error text)"]
            for r in failed]
    intro = ("Runs that started and failed, with the error each recorded (out of memory, crash, NaN loss, timeout)."
             if failed else "No failed runs among the runs selected.")
    return Section("Failed runs", intro,
                   tables=[TableData(["run id", "kind", "workload", "tag", "created (UTC)", "error"], rows)] if rows else [])
