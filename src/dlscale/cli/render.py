"""Human rendering of run records as Rich tables (no torch).

The number formatters live in ``dlscale.format``; they are re-exported here so that CLI modules
importing them from ``dlscale.cli.render`` keep working.
"""

from __future__ import annotations

from rich.table import Table

from dlscale.cli.breakdown_view import is_breakdown_key
from dlscale.format import fmt_bytes, fmt_ci, fmt_num, fmt_pct, fmt_seconds, fmt_si, format_metric
from dlscale.record import RunRecord

__all__ = ["fmt_bytes", "fmt_num", "fmt_pct", "fmt_seconds", "fmt_si", "format_metric", "train_summary_table"]


def train_summary_table(rec: RunRecord) -> Table:
    """The short test's headline figures for one run."""
    m, c, u = rec.metrics, rec.config, rec.units
    title = f"dlscale {rec.kind} {rec.workload}  [{rec.status}]"
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("run id", rec.run_id)
    if c.get("device_name"):
        t.add_row("device", f"{c.get('device')} ({c['device_name']})")
    t.add_row("config", _config_words(c, m))
    if rec.status != "ok":
        t.add_row("error", f"[red]{rec.error}[/red]")
        return t
    unit = c.get("sample_unit", "samples")
    ci = m.get("throughput_ci95")
    spread = (f"95% CI {fmt_ci(ci[0], ci[1])}, over {m.get('throughput_ci_method')}" if ci
              else "no 95% CI: fewer than 2 measured samples")
    if ci and fmt_ci(ci[0], ci[1]).startswith(">="):
        spread += f"; {m.get('measured_steps')} measured steps vary too much to bound it: run more --steps"
    t.add_row("throughput", f"[bold]{fmt_num(m.get('throughput'))} {unit}/s[/bold]  ({spread})")
    if m.get("dp_efficiency_source"):
        eff = m.get("dp_efficiency")
        words = (f"{fmt_pct(eff)} of {m.get('world_size')} x {fmt_num(m.get('dp_reference_throughput'))} {unit}/s "
                 "training alone" if eff is not None else "none")
        t.add_row("data-parallel efficiency", f"{words}  ({m['dp_efficiency_source']})")
    t.add_row("step time p50 / p90 / p99",
              " / ".join(fmt_seconds(m.get(k)) for k in ("step_time_p50", "step_time_p90", "step_time_p99")))
    cv = m.get("cv")
    t.add_row("step time CV", fmt_pct(cv) + ("" if m.get("stable", True) else "  [yellow](above 2%: unstable)[/yellow]"))
    t.add_row(f"FLOPs per {unit.rstrip('s')} (fwd+bwd)", fmt_si(m.get("flops_per_sample"), "FLOP")
              + (f"  ({m['flops_method']})" if m.get("flops_method") else ""))
    t.add_row("achieved", fmt_si(m.get("achieved_flops"), "FLOP/s"))
    t.add_row("MFU", f"{fmt_pct(m.get('mfu'))}  ({m.get('peak_kind') or 'no'} peak "
              f"{fmt_si(m.get('peak_flops'), 'FLOP/s')}: {m.get('peak_flops_source')})")
    t.add_row("peak memory", f"{fmt_bytes(m.get('peak_memory_bytes'))} ({m.get('peak_memory_kind')})")
    for what, words in energy_cost_rows(rec):
        t.add_row(what, words)
    for k in sorted(k for k in set(m) - _SHOWN if not is_breakdown_key(k)):  # those have their own tables
        t.add_row(k, format_metric(k, m[k], u.get(k)))
    return t


def energy_cost_rows(rec: RunRecord) -> list[tuple[str, str]]:
    """The energy line (or why there is none) and the cost line with the price it came from: the one
    formatter of every run command's human output (train, tta, infer, micro)."""
    m, u, raw = rec.metrics, rec.units, rec.raw
    rows = []
    e = raw.get("energy")
    cases = [r for r in raw.get("rows") or [] if isinstance(r, dict) and r.get("energy_j") is not None]
    if m.get("energy_j") is not None:
        to_target = (f", {fmt_num(m['energy_to_target_kwh'])} kWh to the target"
                     if m.get("energy_to_target_kwh") is not None else "")
        rows.append(("energy (measured window)",
                     f"{fmt_num(m['energy_j'])} J, {fmt_num(m.get('energy_per_unit_j'))} {u.get('energy_per_unit_j')}, "
                     f"{fmt_num(m.get('units_per_joule'))} {u.get('units_per_joule')}, {fmt_num(m.get('avg_power_w'))} W "
                     f"average{to_target}  ({_source(e)})"))
    elif cases:  # a microbenchmark: each case over its own timed calls
        best = max((r["gflops_per_j"] for r in cases if r.get("gflops_per_j") is not None), default=None)
        rows.append(("energy (per case)",
                     f"{len(cases)} of {len(raw['rows'])} case(s) measured, {fmt_num(sum(r['energy_j'] for r in cases))} J "
                     f"over their timed calls" + (f", up to {fmt_num(best)} GFLOP/J" if best is not None else "")
                     + f"  ({_source(e)}; each case's in --format json)"))
    elif e and e.get("reason"):
        rows.append(("energy", f"absent: {e['reason']}"))
    c = raw.get("cost")
    if c:
        figs = [f"{fmt_num(m[k])} {u.get(k)}{words}" for k, words in (
            ("cost_per_million_units", ""), ("cost_to_target", " to the target"), ("cost_of_run", " for the whole run"))
            if m.get(k) is not None]
        rows.append(("cost", f"{', '.join(figs) or 'no figure'} at {fmt_num(c['price_per_hour'])} $/device-hour x "
                             f"{c['devices']} device(s) ({c['source']})"))
    return rows


def energy_cost_lines(rec: RunRecord) -> list[str]:
    """``energy_cost_rows`` as lines ("cost: ..."), below outputs that are not a two-column table."""
    return [f"{what}: {words}" for what, words in energy_cost_rows(rec)]


def _source(e: dict | None) -> str:
    return f"{e.get('source') or '?'}: {', '.join(e.get('domains') or [])}" if e else "?"


def _config_words(c: dict, m: dict) -> str:
    """The run's shape in words: batch x ranks, the family's shape fields, precision, format, steps."""
    from dlscale.workloads.base import SHAPE_FIELDS

    shape = [f"{c['image_size']}px" if k == "image_size" else f"{k.replace('_', ' ')} {c[k]}"
             for k in SHAPE_FIELDS if c.get(k) is not None]
    fmt = ("channels_last" if c.get("channels_last") else "NCHW") if c.get("image_size") else None
    par = f"{c['parallel']}" if c.get("parallel") and m.get("world_size", 1) > 1 or c.get("parallel") == "fsdp" else None
    parts = [f"{c.get('family') or 'classification'}: batch {c.get('batch_size')} x {m.get('world_size', 1)} rank(s)",
             *shape, c.get("precision"), fmt, par, "compiled" if c.get("compile") else None,
             "activation checkpointing" if c.get("activation_checkpointing") else None,
             f"{c.get('warmup_steps')} warm-up + {_steps_words(c, m)} x {c.get('repeat')} repeat(s)"]
    return ", ".join(str(p) for p in parts if p)


def _steps_words(c: dict, m: dict) -> str:
    """The measured steps: as asked, or with --min-duration how many the window took to last it."""
    if c.get("min_duration_s") is None or not m.get("measured_steps"):
        return f"{c.get('steps')} steps"
    return (f"{c.get('steps')}+ steps ({m['measured_steps']} measured in all, each window >= "
            f"{c['min_duration_s']:g} s)")


_SHOWN = {
    "throughput", "throughput_ci95", "throughput_ci_method", "step_time_p50", "step_time_p90", "step_time_p99",
    "cv", "stable", "flops_per_sample", "achieved_flops", "mfu", "peak_flops", "peak_flops_source",
    "peak_memory_bytes", "peak_memory_kind", "world_size", "repeat_throughputs", "step_time_mean",
    "step_time_min", "step_time_max", "samples_per_step", "measured_steps", "window_seconds",
    "flops_per_sample_forward", "peak_flops_isa_estimate", "flops_method", "loss_first", "loss_last", "cv_repeats", "peak_kind",
    "energy_j", "energy_per_unit_j", "units_per_joule", "avg_power_w", "price_per_hour", "cost_per_million_units",
    "cost_to_target", "cost_of_run", "dp_efficiency", "dp_reference_throughput", "dp_reference_run_id",
    "dp_efficiency_source",
}
