"""Reading MLPerf LoadGen's logs (``mlperf_log_summary.txt``, ``mlperf_log_detail.txt``) into figures.

LoadGen prints latencies in ns; they become seconds here. Each scenario's headline
(``scenario_metric``) is the figure MLPerf Inference reports from v5.0 on: the detail-log key that
MLCommons' submission checker reads for the scenario (its ``RESULT_FIELD_NEW`` table, the same for
v5.0 to v6.1). The raw figure the earlier rounds reported is kept beside it under its own name:

=============  ============================  ==================================  ========================
scenario       headline                      detail-log key                      raw figure kept beside
=============  ============================  ==================================  ========================
single-stream  early_stopping_latency_p90    early_stopping_latency_ss           latency_p90
multi-stream   early_stopping_latency_p99    early_stopping_latency_ms           latency_p99
server         completed_samples_per_s       result_completed_samples_per_sec    scheduled_samples_per_s
offline        samples_per_s                 result_samples_per_second           -
=============  ============================  ==================================  ========================

An early-stopping estimate is LoadGen's conservative bound on the percentile given how many
queries ran (the t-th highest latency, t the most over-percentile queries that n queries still
allow at 99% confidence); LoadGen logs 0 when the run was too short to make one (under 64 queries
for a 90th percentile, 662 for a 99th), and the headline is then None, with a warning.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dlscale.format import fmt_num, fmt_seconds

HEADLINE = {"single-stream": ("early_stopping_latency_p90", "early_stopping_latency_ss"),
            "multi-stream": ("early_stopping_latency_p99", "early_stopping_latency_ms"),
            "server": ("completed_samples_per_s", "result_completed_samples_per_sec"),
            "offline": ("samples_per_s", "result_samples_per_second")}
RAW = {"single-stream": "latency_p90", "multi-stream": "latency_p99", "server": "scheduled_samples_per_s"}
EARLY_STOPPING_MIN_QUERIES = {"single-stream": 64, "multi-stream": 662}  # LoadGen's minimum for one estimate

_KV = re.compile(r"^\s*(?:\*\s*)?(?P<key>[^:*][^:]*?)\s*:\s*(?P<val>.*?)\s*$")
_TARGET = re.compile(r"^(\d+(?:\.\d+)?)th percentile latency \(ns\)$")
_PERCENTILE = re.compile(r"^(\d+)\.(\d+) percentile latency \(ns\)$")
_EARLY = re.compile(r"^Early stopping (\d+(?:\.\d+)?)th percentile estimate$")
_FLAGS = {"Min duration satisfied": "min_duration_met", "Min queries satisfied": "min_queries_met",
          "Early stopping satisfied": "early_stopping_met", "Performance constraints satisfied": "latency_bound_met"}
_RATES = {"Samples per second": "samples_per_s", "Completed samples per second": "completed_samples_per_s",
          "Scheduled samples per second": "scheduled_samples_per_s",
          "QPS w/ loadgen overhead": "qps_with_loadgen_overhead",
          "QPS w/o loadgen overhead": "qps_without_loadgen_overhead"}
_LATENCIES = {"Min latency (ns)": "latency_min", "Max latency (ns)": "latency_max", "Mean latency (ns)": "latency_mean"}
# detail-log key -> (metric, unit; "rate" is the run's rate unit); an early-stopping 0 means "no estimate"
_DETAIL = {"result_query_count": ("query_count", "queries"),
           "result_overlatency_query_count": ("overlatency_query_count", "queries"),
           "early_stopping_latency_ss": ("early_stopping_latency_p90", "ns"),
           "early_stopping_latency_ms": ("early_stopping_latency_p99", "ns"),
           "result_completed_samples_per_sec": ("completed_samples_per_s", "rate"),
           "result_scheduled_samples_per_sec": ("scheduled_samples_per_s", "rate"),
           "result_samples_per_second": ("samples_per_s", "rate")}


def read_logs(summary: str, detail: str, scenario: str, sample_unit: str
              ) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(metrics, units, warnings) of one run: the summary's figures, the detail log's result keys over
    them (the keys MLPerf's checker reads), the scenario's headline and why it is missing if it is."""
    metrics, units, warnings = parse_summary(summary, scenario, sample_unit)
    found, found_units = parse_detail(detail, f"{sample_unit}/s")
    metrics.update(found)
    units.update(found_units)
    _headline(metrics, units, scenario, f"{sample_unit}/s")
    name, key = HEADLINE[scenario]
    if metrics["scenario_metric"] is None and scenario in EARLY_STOPPING_MIN_QUERIES:
        raw = RAW[scenario]
        warnings.append(
            f"{scenario}: no scenario metric: LoadGen's early-stopping estimate ({key}, what MLPerf reports) needs "
            f"at least {EARLY_STOPPING_MIN_QUERIES[scenario]} queries and this run made "
            f"{fmt_num(metrics.get('query_count'))}; {raw} {fmt_seconds(metrics.get(raw))} is the raw percentile, "
            "not that figure: lengthen the run with --duration")
    return metrics, units, warnings


def summary_fields(text: str) -> dict[str, str]:
    """Every ``label : value`` line of mlperf_log_summary.txt (first occurrence wins)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _KV.match(line)
        if m and m.group("key") not in fields:
            fields[m.group("key")] = m.group("val")
    return fields


def parse_summary(text: str, scenario: str, sample_unit: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(metrics, units, warnings) from mlperf_log_summary.txt: ns become seconds, Yes/NO become booleans."""
    fields = summary_fields(text)
    metrics: dict[str, Any] = {"scenario": scenario, "result": fields.get("Result is")}
    metrics["valid"] = metrics["result"] == "VALID"
    units: dict[str, str] = {}
    rate_unit = f"{sample_unit}/s"
    for key, val in fields.items():
        name, unit, value = _field(key, val, rate_unit)
        if name is not None:
            metrics[name], units[name] = value, unit
    if "target_latency (ns)" in fields and scenario == "server":
        metrics["latency_bound_s"], units["latency_bound_s"] = int(fields["target_latency (ns)"]) / 1e9, "s"
    if "target_qps" in fields and scenario in ("server", "offline"):
        metrics["target_qps"], units["target_qps"] = float(fields["target_qps"]), "queries/s"
    if "samples_per_query" in fields:
        metrics["samples_per_query"], units["samples_per_query"] = int(fields["samples_per_query"]), "samples"
    if int(fields.get("max_query_count", "0") or 0) and scenario == "server":
        metrics["max_query_count"], units["max_query_count"] = int(fields["max_query_count"]), "queries"
    _headline(metrics, units, scenario, rate_unit)
    return metrics, units, _reasons(text, fields)


def parse_detail(detail: str, rate_unit: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The result keys of mlperf_log_detail.txt (``:::MLLOG {json}`` lines): counts, estimates, rates."""
    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    for line in detail.splitlines():
        if not line.startswith(":::MLLOG") or not any(f'"{k}"' in line for k in _DETAIL):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG"):])
        except ValueError:
            continue
        if entry.get("key") not in _DETAIL or not isinstance(entry.get("value"), (int, float)):
            continue
        name, unit = _DETAIL[entry["key"]]
        value = entry["value"]
        if unit == "ns":
            value, unit = (value / 1e9 if value else None), "s"
        metrics[name], units[name] = value, rate_unit if unit == "rate" else unit
    return metrics, units


def _headline(metrics: dict[str, Any], units: dict[str, str], scenario: str, rate_unit: str) -> None:
    """The scenario's MLPerf figure as ``scenario_metric``, its LoadGen key, and the raw figure's name."""
    name, key = HEADLINE[scenario]
    metrics.update(scenario_metric_name=name, scenario_metric=metrics.get(name), mlperf_result_key=key)
    units["scenario_metric"] = "s" if name.startswith("early_stopping") else rate_unit
    if scenario in RAW:
        metrics["scenario_raw_name"] = RAW[scenario]


def _pct_name(whole: str, frac: str) -> str:
    """'99', '90' -> latency_p99_9; '50', '00' -> latency_p50 (LoadGen prints two decimals)."""
    frac = frac.rstrip("0")
    return f"latency_p{int(whole)}" + (f"_{frac}" if frac else "")


def _field(key: str, val: str, rate_unit: str) -> tuple[str | None, str, Any]:
    """(metric name, unit, value) of one summary line, or (None, '', None) for lines not kept."""
    try:
        if key in _FLAGS:
            return _FLAGS[key], "bool", val.strip().lower() == "yes"
        if key in _RATES:
            unit = "queries/s" if key.startswith("QPS") else rate_unit
            return _RATES[key], unit, float(val)
        if key in _LATENCIES:
            return _LATENCIES[key], "s", int(val) / 1e9
        if m := _PERCENTILE.match(key):
            return _pct_name(m.group(1), m.group(2)), "s", int(val) / 1e9
        if m := _TARGET.match(key):  # the scenario's own percentile (90.0th single-, 99.0th multi-stream), raw
            return _pct_name(*m.group(1).partition(".")[::2]), "s", int(val) / 1e9
        if m := _EARLY.match(key):  # LoadGen's early-stopping estimate of that percentile
            return "early_stopping_" + _pct_name(*m.group(1).partition(".")[::2]), "s", int(val) / 1e9
    except ValueError:
        pass
    return None, "", None


def _bullets(block: str) -> list[str]:
    """The ``* ...`` items of a summary section, continuation lines joined to their item."""
    items: list[str] = []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("*"):
            items.append(line.lstrip("* ").strip())
        elif line and items:
            items[-1] += " " + line
    return items


def _reasons(text: str, fields: dict[str, str]) -> list[str]:
    """LoadGen's reasons a run is INVALID, its recommendations, and its warning/error counts."""
    out = [f"LoadGen: {key} : NO" for key in _FLAGS if fields.get(key, "").lower() == "no"]
    results = text.split("Additional Stats", 1)[0]
    recommended, _, early = results.partition("Early Stopping Result:")
    if "Recommendations:" in recommended:
        out += [f"LoadGen recommends: {b}" for b in _bullets(recommended.split("Recommendations:", 1)[1])]
    if fields.get("Early stopping satisfied", "").lower() == "no":
        out += [f"LoadGen early stopping: {b}" for b in _bullets(early.split("=====", 1)[0])]
    for line in text.splitlines():
        if re.search(r"(warning|error)s? encountered", line, re.I) and not line.strip().startswith("No "):
            out.append(f"LoadGen: {line.strip()}")
    return out
