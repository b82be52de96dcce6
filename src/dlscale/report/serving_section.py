"""The report's serving sections (kind ``serving``): tokens/s per user against tokens/s per server
(the Pareto front of each run's load points), every point's figures, and each run's SLO answer.

Reads records only.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlscale.analysis.domains import system_label
from dlscale.analysis.serving import points_of
from dlscale.format import fmt_fixed, fmt_num, fmt_seconds
from dlscale.record import RunRecord
from dlscale.report import plots
from dlscale.report.model import Figure, Section, TableData


def _label(r: RunRecord) -> str:
    c = r.config
    return f"{r.workload} at {c.get('url')} ({c.get('mode')}, {r.run_id[-8:]})"


def _verdict(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "missed")


def serving_sections(ok: Sequence[RunRecord]) -> list[Section]:
    recs = [r for r in ok if r.kind == "serving" and r.metrics.get("loads_by_point")]
    if not recs:
        return []
    series, rows = {}, []
    for r in recs:
        pts = points_of(r)
        keep = [p for p in pts if p["server"] is not None and p["user"] is not None]
        if keep:
            series[_label(r)] = ([p["server"] for p in keep], [p["user"] for p in keep],
                                 [fmt_num(p["load"]) for p in keep], [p["front"] for p in keep])
        for p in pts:
            rows.append([r.workload, system_label(r), str(r.config.get("mode")), fmt_num(p["load"]),
                         fmt_fixed(p["request_throughput"], 2), fmt_fixed(p["server"]), fmt_fixed(p["user"]),
                         fmt_seconds(p["ttft_p99_s"]), fmt_seconds(p["tpot_p99_s"]), fmt_fixed(p["goodput"], 2),
                         "yes" if p["front"] else "", _verdict(p["met"])])
    fig = Figure("serving-pareto", plots.pareto(series, "output tokens/s per server", "output tokens/s per user",
                                                 "Serving: per-user speed against server throughput"),
                 "tokens/s per user against tokens/s per server, each load point labelled, the Pareto front joined"
                 ) if series else None
    cols = ["model", "client host", "mode", "load", "requests/s", "tokens/s (server)", "tokens/s per user",
            "TTFT p99", "TPOT p99", "goodput (req/s)", "on front", "SLO"]
    points = Section(
        title="LLM serving: tokens/s per user against tokens/s per server",
        intro=("Each load point of each serving run (dlscale serve-bench): the server's output tokens/s against "
               "one user's (the mean of 1/TPOT). Raising the load moves right and down; the joined points are the "
               "run's Pareto front, where no other point is better on both. Load is requests/s (rate) or "
               "requests in flight (concurrency)."),
        figure=fig, tables=[TableData(cols, rows)])
    return [points, answers_section(recs)]


def answers_section(recs: Sequence[RunRecord]) -> Section:
    rows = []
    for r in recs:
        m = r.metrics
        slo = ", ".join(f"{k.upper()} {fmt_seconds(m.get(f'slo_{k}_s'))}" for k in ("ttft", "tpot")
                        if m.get(f"slo_{k}_s") is not None)
        rows.append([r.workload, str(r.config.get("url")), slo or "-", fmt_num(m.get("max_load_meeting_slo")),
                     str(m.get("slo_binding") or "-"), fmt_fixed(m.get("goodput"), 2), fmt_fixed(m.get("throughput")),
                     fmt_seconds(m.get("client_ttft_overhead_s")), fmt_num(m.get("energy_per_unit_j")),
                     fmt_fixed(m.get("cost_per_million_units"), 3), r.run_id])
    return Section(
        title="LLM serving at an SLO",
        intro=("Per serving run: the highest load whose p99 TTFT and p99 TPOT met the SLO (judged with a "
               "distribution-free interval of each p99), the SLO that binds above it, goodput and output tokens/s "
               "at that load, the client's own TTFT overhead (against an instant local server), J per output "
               "token where the server's energy was read, and $ per million output tokens at a price."),
        tables=[TableData(["model", "endpoint", "SLO (p99)", "max load", "binds", "goodput (req/s)", "tokens/s",
                           "client overhead", "J/token", "$/10^6 tokens", "run id"], rows)])
