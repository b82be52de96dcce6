"""Rich tables for the step breakdown, the verdict, the monitoring summary and the profile (no torch)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from dlscale.format import fmt_bytes, fmt_count, fmt_num, fmt_pct, fmt_seconds

PHASE_LABELS = {"data_wait": "data-wait", "h2d": "host-to-device copy", "forward": "forward",
                "backward": "backward (compute)", "optimizer": "optimizer", "comm": "communication (exposed)"}
KEYS = {"data_wait_share", "compute_rate", "loader_rate", "loader_workers", "decode_rate_per_core",
        "input_cores_needed", "images_skipped", "verdict", "verdict_reason", "breakdown_steps",
        "profile_trace", "profile_comm_share"}


def is_breakdown_key(k: str) -> bool:
    """Metrics shown by these tables rather than in the generic list."""
    return k in KEYS or k.startswith(("phase_", "monitor_"))


def breakdown_tables(rec: Any) -> list[Table]:
    if rec.status != "ok":
        return []
    tables = [t for t in (_breakdown(rec), _monitor(rec), _profile(rec)) if t is not None]
    return tables


def _breakdown(rec: Any) -> Table | None:
    m = rec.metrics
    if "verdict" not in m:
        return None
    t = Table("phase", "time per step", "share", title=f"step breakdown ({m.get('breakdown_steps', 0)} instrumented "
              "steps after the window)", title_justify="left")
    for p, label in PHASE_LABELS.items():
        if f"phase_{p}" in m:
            t.add_row(label, fmt_seconds(m[f"phase_{p}"]), fmt_pct(m.get(f"phase_{p}_share")))
    t.add_section()
    unit = rec.config.get("sample_unit", "samples")
    t.add_row("data-wait in the measured window", "", fmt_pct(m.get("data_wait_share")))
    if m.get("compute_rate") is not None:
        t.add_row("compute rate (input excluded)", f"{fmt_num(m['compute_rate'])} {unit}/s per rank", "")
    if m.get("loader_rate") is not None:
        t.add_row(f"loader rate ({m.get('loader_workers')} worker(s), no training)", f"{fmt_num(m['loader_rate'])} {unit}/s", "")
        t.add_row("decode+augment per core", f"{fmt_num(m.get('decode_rate_per_core'))} {unit}/s", "")
        t.add_row("cores the input pipeline needs", f"[bold]{fmt_num(m.get('input_cores_needed'))}[/bold] "
                  "(to feed the compute rate)", "")
        if m.get("monitor_children_cpu_cores_mean") is not None:
            t.add_row("cores the loader workers used (monitor)", f"{fmt_num(m['monitor_children_cpu_cores_mean'])} mean, "
                      f"{fmt_num(m.get('monitor_children_cpu_cores_max'))} max", "")
        t.add_row("unreadable images skipped", fmt_num(m.get("images_skipped")), "")
    t.add_section()
    colour = "green" if m["verdict"] == "compute-bound" else "yellow"
    t.add_row("verdict", f"[bold {colour}]{m['verdict']}[/bold {colour}]: {m.get('verdict_reason', '')}", "")
    return t


def _monitor(rec: Any) -> Table | None:
    m, u = rec.metrics, rec.units
    names = sorted({k[len("monitor_"):-len("_mean")] for k in m if k.startswith("monitor_") and k.endswith("_mean")})
    if not names:
        return None
    t = Table("quantity", "mean", "max", "unit", title=f"resources during the measured window "
              f"({fmt_count(m.get('monitor_samples'), 'sample')} every {fmt_num(m.get('monitor_interval'))} s)", title_justify="left")
    for n in names:
        unit = u.get(f"monitor_{n}_mean", "")
        f = fmt_bytes if unit == "bytes" else fmt_num
        t.add_row(n, f(m[f"monitor_{n}_mean"]), f(m.get(f"monitor_{n}_max")), "" if unit == "bytes" else unit)
    if m.get("monitor_gpu_energy") is not None:
        t.add_row("gpu_energy (whole run)", fmt_num(m["monitor_gpu_energy"]), "", "J")
    return t


def _profile(rec: Any) -> Table | None:
    rows = rec.raw.get("profile_top_ops")
    if not rows:
        return None
    m = rec.metrics
    t = Table("op", "calls", "self time", "share", title=f"profile: top ops ({fmt_pct(m.get('profile_comm_share'))} "
              f"in communication); trace {m.get('profile_trace')}", title_justify="left")
    for r in rows:
        t.add_row(r["op"][:60], fmt_num(r["calls"]), fmt_seconds(r["self_s"]), fmt_pct(r["share"]))
    return t
