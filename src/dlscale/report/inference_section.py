"""Report sections for inference runs (kind ``inference``): throughput and latency by batch size,
and the LoadGen scenario results.

One section per sample unit (an axis never mixes images/s with tokens/s). Each run is a line of
throughput against batch size, and a table row per batch size with its latency percentiles; a
scenario run adds a row to the scenario table with LoadGen's own metric and its validity. Reads
records only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.analysis import domains
from dlscale.analysis.domains import system_label
from dlscale.format import fmt_ci, fmt_fixed, fmt_num, fmt_seconds
from dlscale.record import RunRecord
from dlscale.report import plots
from dlscale.report.model import Figure, Section, TableData

COLUMNS = ["model", "system", "runtime", "precision", "batch", "throughput", "95% CI", "latency p50", "p90", "p99",
           "max"]


def _label(r: RunRecord) -> str:
    c = r.config
    return f"{r.workload} on {system_label(r)}, {c.get('runtime', 'torch')}, {c.get('precision')}" + (
        ", compiled" if c.get("compile") else "")


def _at(series: Any, i: int) -> Any:
    return series[i] if isinstance(series, list) and i < len(series) else None


def batch_rows(r: RunRecord) -> list[list[str]]:
    """One row per batch size of one inference run."""
    m, c = r.metrics, r.config
    rows = []
    for i, b in enumerate(m.get("batch_sizes") or []):
        ci = _at(m.get("throughput_ci95_by_batch"), i)
        rows.append([r.workload, system_label(r), str(c.get("runtime", "torch")), str(c.get("precision")), str(b),
                     fmt_fixed(_at(m.get("throughput_by_batch"), i)),
                     fmt_ci(ci[0], ci[1], fmt_fixed) if isinstance(ci, list) and len(ci) == 2 else "-",
                     *(fmt_seconds(_at(m.get(f"latency_{q}_by_batch"), i)) for q in ("p50", "p90", "p99", "max"))])
    return rows


def throughput_by_batch_section(recs: Sequence[RunRecord], unit: str) -> Section:
    rate = domains.rate_unit(unit)
    series = {}
    for r in recs:
        xs, ys = r.metrics.get("batch_sizes") or [], r.metrics.get("throughput_by_batch") or []
        if xs and len(xs) == len(ys):
            series[_label(r)] = ([float(x) for x in xs], [float(y) for y in ys])
    rows = [row for r in recs for row in batch_rows(r)]
    fig = Figure(f"inference-{unit}", plots.lines(series, "batch size", rate, f"Inference throughput ({rate})"),
                 f"inference throughput against batch size, {rate}") if series else None
    return Section(
        title=f"Inference throughput and latency by batch size: {rate}",
        intro=("Forward passes under torch.inference_mode (or onnxruntime), warm-up excluded; latency is per batch. "
               "The best batch is the one with the highest throughput; latency grows with the batch."),
        figure=fig, tables=[TableData(COLUMNS[:5] + [f"throughput ({rate})"] + COLUMNS[6:], rows)])


def scenario_rows(recs: Sequence[RunRecord]) -> list[list[str]]:
    rows = []
    for r in recs:
        m = r.metrics
        if not m.get("scenario"):
            continue
        unit = r.units.get("scenario_metric", "")
        value = m.get("scenario_metric")
        shown = fmt_seconds(value) if unit == "s" else f"{fmt_num(value)} {unit}".strip()
        rows.append([r.workload, system_label(r), str(m["scenario"]), str(m.get("scenario_metric_name", "")), shown,
                     "valid" if m.get("valid") else "INVALID", str(m.get("samples_on") or "-"), r.run_id])
    return rows


def inference_sections(ok: Sequence[RunRecord]) -> list[Section]:
    """The inference sections of a report; none when the store holds no inference runs."""
    inf = [r for r in ok if r.kind == "inference"]
    out = [throughput_by_batch_section(recs, unit) for unit, recs in domains.by_unit(inf).items()
           if any(r.metrics.get("batch_sizes") for r in recs)]
    rows = scenario_rows(inf)
    if rows:
        out.append(Section(
            title="MLPerf LoadGen scenarios",
            intro=("Each scenario's figure as MLPerf Inference reports it, from LoadGen's logs: single-stream "
                   "LoadGen's early-stopping estimate of the 90th-percentile latency, multi-stream that of the "
                   "99th, server completed samples/s under the latency bound, offline samples/s. An INVALID run "
                   "broke a scenario rule (see its summary in the record). Samples on: where the query sample "
                   "library held the samples (the device, or pinned host memory copied in per batch)."),
            tables=[TableData(["model", "system", "scenario", "metric", "value", "LoadGen", "samples on", "run id"],
                              rows)]))
    return out
