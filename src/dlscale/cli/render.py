"""Human rendering of run records: number formatting and Rich tables (no torch)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from dlscale.record import RunRecord


def fmt_num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x == 0:
            return "0"
        if abs(x) >= 1e7 or abs(x) < 1e-3:
            return f"{x:.{digits}g}"
        if abs(x) >= 100:
            return f"{x:,.1f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        return f"{x:.{digits}g}"
    return str(x)


def fmt_si(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for factor, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= factor:
            return f"{n / factor:.2f} {name}"
    return f"{int(n)} B"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def format_metric(name: str, value: Any, unit: str | None) -> str:
    """One metric value with its unit, formatted for a person."""
    if value is None:
        return "-"
    if isinstance(value, list) and len(value) == 2 and unit == "samples/s" and name.endswith("ci95"):
        return f"[{fmt_num(value[0])}, {fmt_num(value[1])}] samples/s"
    if isinstance(value, list):
        return ", ".join(fmt_num(v) for v in value[:8]) + (" ..." if len(value) > 8 else "")
    if unit == "s":
        return fmt_seconds(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "fraction":
        return fmt_pct(value)
    if unit in ("FLOP", "FLOP/s", "B/s", "bit/s"):
        return fmt_si(value, unit)
    if unit:
        return f"{fmt_num(value)} {unit}"
    return fmt_num(value)


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
    t.add_row(
        "config",
        f"batch {c.get('batch_size')} x {m.get('world_size', 1)} rank(s), {c.get('image_size')}px, {c.get('precision')}, "
        f"{'channels_last' if c.get('channels_last') else 'NCHW'}{', compiled' if c.get('compile') else ''}, "
        f"{c.get('warmup_steps')} warm-up + {c.get('steps')} steps x {c.get('repeat')} repeat(s)",
    )
    if rec.status != "ok":
        t.add_row("error", f"[red]{rec.error}[/red]")
        return t
    unit = c.get("sample_unit", "samples")
    ci = m.get("throughput_ci95") or [None, None]
    t.add_row("throughput", f"[bold]{fmt_num(m.get('throughput'))} {unit}/s[/bold]  "
              f"(95% CI {fmt_num(ci[0])} - {fmt_num(ci[1])}, over {m.get('throughput_ci_method')})")
    t.add_row("step time p50 / p90 / p99",
              " / ".join(fmt_seconds(m.get(k)) for k in ("step_time_p50", "step_time_p90", "step_time_p99")))
    cv = m.get("cv")
    t.add_row("step time CV", fmt_pct(cv) + ("" if m.get("stable", True) else "  [yellow](above 2%: unstable)[/yellow]"))
    t.add_row("FLOPs per sample (fwd+bwd)", fmt_si(m.get("flops_per_sample"), "FLOP"))
    t.add_row("achieved", fmt_si(m.get("achieved_flops"), "FLOP/s"))
    t.add_row("MFU", f"{fmt_pct(m.get('mfu'))}  (peak {fmt_si(m.get('peak_flops'), 'FLOP/s')}: {m.get('peak_flops_source')})")
    t.add_row("peak memory", f"{fmt_bytes(m.get('peak_memory_bytes'))} ({m.get('peak_memory_kind')})")
    from dlscale.cli.breakdown_view import is_breakdown_key  # shown in their own tables

    for k in sorted(k for k in set(m) - _SHOWN if not is_breakdown_key(k)):
        t.add_row(k, format_metric(k, m[k], u.get(k)))
    return t


_SHOWN = {
    "throughput", "throughput_ci95", "throughput_ci_method", "step_time_p50", "step_time_p90", "step_time_p99",
    "cv", "stable", "flops_per_sample", "achieved_flops", "mfu", "peak_flops", "peak_flops_source",
    "peak_memory_bytes", "peak_memory_kind", "world_size", "repeat_throughputs", "step_time_mean",
    "step_time_min", "step_time_max", "samples_per_step", "measured_steps", "window_seconds",
    "flops_per_sample_forward", "peak_flops_isa_estimate", "loss_first", "loss_last", "cv_repeats",
}
