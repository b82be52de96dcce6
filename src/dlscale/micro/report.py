"""Human rendering of microbenchmark records (reads records only; no torch).

Kernel runs print one row per case (their label columns, time, rate, % of peak) and the peak
each % refers to; memory prints GB/s; p2p prints p2pBandwidthLatencyTest's connectivity
(peer-access) matrix and its bandwidth and latency matrices, host-staged pairs marked;
collectives print nccl-tests' columns per collective and its footer (#wrong, then the average
busbw of each collective: busbw of different collectives is never averaged together); links print
each node's link (its fastest pair), the pair matrix at the largest size and the slowest link;
burnin prints each rank's rounds, rates, whether its results agree and what its monitor saw.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from dlscale.format import fmt_count, fmt_fixed, fmt_num, fmt_pct
from dlscale.record import RunRecord

MODES = ("out-of-place", "in-place")


def _f(x: Any, digits: int = 2) -> str:
    """nccl-tests' convention: fixed decimals, N/A where there is no value."""
    return fmt_fixed(x, digits, missing="N/A")


def header(rec: RunRecord) -> str:
    c = rec.config
    where = c.get("device_name") or c.get("device") or ""
    status = "" if rec.status == "ok" else f"  [red]{rec.status}: {rec.error}[/red]"
    return f"dlscale micro {rec.workload}  run {rec.run_id}  on {c.get('device', '')} ({where}){status}"


def kernel_table(rec: RunRecord, columns: tuple[str, ...]) -> Table:
    """gemm / conv / rnn: one row per case with time, TFLOP/s and % of the dense peak."""
    t = Table(title=header(rec), title_justify="left")
    if any("device" in r for r in rec.raw.get("rows", [])):  # every_device: which GPU each row ran on
        columns = (*columns, "device")
    for c in columns:
        t.add_column(c, justify="right")
    gpu = any("calls_per_window" in r for r in rec.raw.get("rows", []))
    for c in ("time (us)", "TFLOP/s", "% peak", "CV", "reps", *(("K", "graph", "SM MHz") if gpu else ())):
        t.add_column(c, justify="right")
    for r in rec.raw.get("rows", []):
        t.add_row(*(str(r.get(c, "")) for c in columns), _f(r.get("time_us"), 1), _f(r.get("tflops"), 4),
                  fmt_pct(r.get("pct_peak")) if r.get("pct_peak") is not None else "-", fmt_pct(r.get("cv")),
                  str(r.get("reps", "")), *(_gpu_cells(r) if gpu else ()))
    return t


def _gpu_cells(r: dict[str, Any]) -> tuple[str, ...]:
    """K (calls per timed window), whether the window was one CUDA graph replay, the SM clock."""
    graph = {"cuda-graph": "yes", "cuda-events": "no"}.get(r.get("timing", ""), "")
    return str(r.get("calls_per_window", "")), graph, str(r.get("sm_clock_mhz") or "-")


def kernel_footer(rec: RunRecord) -> list[str]:
    m = rec.metrics
    lines = [f"best {fmt_num(m.get('best_tflops'))} TFLOP/s, median {fmt_num(m.get('median_tflops'))} TFLOP/s "
             f"over {m.get('cases')} cases"]
    gpu = [r for r in rec.raw.get("rows", []) if "calls_per_window" in r]
    if gpu:
        caches = "/".join(dict.fromkeys(r.get("cache", "hot") for r in gpu))
        lines.append(f"GPU rows: median of timed windows of >= 1 ms, K back-to-back calls each "
                     f"(one CUDA graph replay where graph = yes); {caches} cache")
    for prec, src in (m.get("peak_sources") or {}).items():
        lines.append(f"{prec} peak: {src}")
    if m.get("best_pct_peak") is not None:
        lines.append(f"best case reaches {fmt_pct(m['best_pct_peak'])} of the peak")
    if m.get("measured_gemm_peak_tflops") is not None:
        pct = m.get("measured_gemm_peak_pct_isa")
        vs = (f" = {fmt_pct(pct)} of the ISA peak" if pct is not None
              else " (ISA peak unknown here: give --cpu-ghz to compare)")
        lines.append(f"measured best GEMM rate on this CPU (2048^3 probe): "
                     f"{fmt_num(m['measured_gemm_peak_tflops'])} TFLOP/s{vs}")
    return lines


def window_lines(rec: RunRecord) -> list[str]:
    """The node's figures where cases ran on every GPU at once, and how long the windows were sized."""
    m, raw = rec.metrics or {}, rec.raw or {}
    lines = []
    if raw.get("node"):
        node = f"every GPU at once: {m.get('node_devices')} GPUs, one thread each, timed windows opened together"
        if m.get("node_best_tflops") is not None:
            node += f"; best case summed {fmt_num(m['node_best_tflops'])} TFLOP/s ({m.get('node_best_case')})"
        if m.get("d2d_gbps_node") is not None:
            node += f"; device copy summed {fmt_num(m['d2d_gbps_node'])} GB/s"
        lines.append(node)
        lines.append(f"node power {fmt_num(m['node_avg_power_w'])} W over {fmt_num(m.get('node_metered_s'))} s of "
                     "windows (NVML, each GPU's summed)" if m.get("node_avg_power_w") is not None
                     else f"node power: none ({(raw['node'].get('energy') or {}).get('reason')})")
    sized = [r["sizing"] for r in raw.get("rows", []) if r.get("sizing")]
    if sized:
        lines.append(f"each case's timed calls last at least {sized[0]['target_s']:g} s (--min-duration; their count "
                     f"from a probe, at least {sized[0]['min_count']}; the row's sizing)")
    return lines


def memory_table(rec: RunRecord) -> Table:
    t = Table("op", "where", "array (MiB)", "GB/s (mean)", "GB/s (best)", "time (us)", "CV", "reps",
              title=header(rec), title_justify="left")
    for r in rec.raw.get("rows", []):
        t.add_row(r["op"], r["where"], str(r["array_mib"]), _f(r.get("gbps")), _f(r.get("gbps_best")),
                  _f(r.get("time_us"), 1), fmt_pct(r.get("cv")), str(r.get("reps", "")))
    return t


def p2p_connectivity_table(rec: RunRecord) -> Table:
    """p2pBandwidthLatencyTest's "P2P Connectivity Matrix": 1 where the pair has peer access."""
    from dlscale.micro.p2p import peer_access_from_rows

    m = rec.metrics.get("peer_access") or peer_access_from_rows(rec.raw.get("rows", []))
    t = Table("D\\D", *(str(j) for j in range(len(m))), title="P2P Connectivity Matrix",
              title_justify="left")
    for i, row in enumerate(m):
        t.add_row(str(i), *("?" if x is None else str(int(x)) for x in row))
    return t


def p2p_tables(rec: RunRecord) -> list[Table]:
    """p2pBandwidthLatencyTest's six matrices: {uni, bi} bandwidth (GB/s) and latency (us), P2P on/off.

    In the P2P=Enabled matrices a pair without peer access is marked ``*``: its copy was staged
    through host memory by the driver, so the figure is not a P2P one.
    """
    from dlscale.micro.p2p import matrix

    rows = rec.raw.get("rows", [])
    tables = []
    for test, field, unit in (("unidirectional", "gbps", "GB/s"), ("bidirectional", "gbps", "GB/s"),
                              ("latency", "time_us", "us")):
        for peer in ("disabled", "enabled"):
            m, paths = matrix(rows, test, peer, field), matrix(rows, test, peer, "path")
            staged = [[peer == "enabled" and p == "host-staged" for p in row] for row in paths]
            title = f"{test.capitalize()} P2P={peer.capitalize()} {'Latency' if test == 'latency' else 'Bandwidth'} Matrix ({unit})"
            caption = ("* host-staged: no peer access between these GPUs; the driver copied through host memory"
                       if any(map(any, staged)) else None)
            t = Table("D\\D", *(str(j) for j in range(len(m))), title=title, title_justify="left",
                      caption=caption, caption_justify="left")
            for i, row in enumerate(m):
                t.add_row(str(i), *(_f(v) + ("*" if staged[i][j] else "") for j, v in enumerate(row)))
            tables.append(t)
    return tables


def collectives_tables(rec: RunRecord) -> list[Table]:
    """nccl-tests' columns, one table per collective."""
    rows = rec.raw.get("rows", [])
    tables = []
    for op in dict.fromkeys(r["op"] for r in rows):
        t = Table(title=f"{op}  ({rec.config.get('backend')}, {fmt_count(rec.metrics.get('world_size') or rec.config.get('world_size'), 'rank')})",
                  title_justify="left")
        for c in ("size (B)", "count (elements)", "type", "redop", "root"):
            t.add_column(c, justify="right")
        for mode in MODES:
            for c in ("time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
                t.add_column(f"{mode}\n{c}" if c == "time (us)" else c, justify="right")
        for r in (r for r in rows if r["op"] == op):
            cells = [str(r["size"]), str(r["count"]), r["type"], r["redop"], str(r["root"])]
            for mode in MODES:
                x = r.get(mode)
                if x is None:
                    cells += ["N/A"] * 4
                else:
                    wrong = str(x["wrong"]) if not x["wrong"] else f"[red]{x['wrong']}[/red]"
                    cells += [_f(x["time_us"], 1), _f(x["algbw"]), _f(x["busbw"]), wrong]
            t.add_row(*cells)
        tables.append(t)
    return tables


def collectives_footer(rec: RunRecord) -> list[str]:
    """nccl-tests' footer: #wrong, then the average busbw of each collective (one line per op)."""
    m = rec.metrics
    wrong = m.get("wrong")
    floor = rec.config.get("min_busbw")
    lines = [f"Out of bounds values (#wrong) : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    for op in dict.fromkeys(r["op"] for r in rec.raw.get("rows", [])):
        avg = m.get(f"avg_busbw_{op}")
        low = "  below --min-busbw" if floor is not None and (avg is None or avg < floor) else ""
        lines.append(f"{op + ' avg busbw':<30}: {_f(avg, 3)} GB/s{low}")
    if floor is not None:
        lines.append(f"--min-busbw (per collective)  : {floor:g} GB/s")
    if m.get("link_rate"):
        used = ", ".join(f"{k.removeprefix('link_utilisation_')} {v * 100:.0f}%" for k, v in m.items()
                         if k.startswith("link_utilisation_") and v is not None)
        link = "slowest link" if rec.config.get("node_link_bandwidth") else f"link ({rec.config.get('link_bandwidth')})"
        lines.append(f"{link:<30}: {_f(m['link_rate'], 3)} GB/s; "
                     f"avg busbw / link: {used}")
    return lines


def links_tables(rec: RunRecord) -> list[Table]:
    """Each node's link (its fastest pair), then every pair's busbw at each size."""
    m = rec.metrics
    median = m.get("link_busbw_median")
    t = Table("node", "measured with", "size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "vs median",
              "shaped (GB/s)", title=f"links  ({rec.config.get('backend')}, {m.get('nodes')} nodes, "
              f"{m.get('pairs')} pair{'' if m.get('pairs') == 1 else 's'})", title_justify="left")
    for e in rec.raw.get("links", []):
        t.add_row(str(e["src_node"]), f"node {e['dst_node']}", str(e["size"]), _f(e["time_us"], 1),
                  _f(e["algbw_gbps"], 3), _f(e["busbw_gbps"], 3),
                  fmt_pct(e["busbw_gbps"] / median if median else None), _f(e.get("shaped_gbps"), 3))
    rows = rec.raw.get("rows", [])
    p = Table("pair", *(str(s) for s in dict.fromkeys(r["size"] for r in rows)),
              title="busbw (GB/s) of each pair by size (B)", title_justify="left")
    for pair in dict.fromkeys((r["src_node"], r["dst_node"]) for r in rows):
        p.add_row(f"{pair[0]}-{pair[1]}", *(_f(r["busbw_gbps"], 3) for r in rows
                                              if (r["src_node"], r["dst_node"]) == pair))
    return [t, p]


def links_footer(rec: RunRecord) -> list[str]:
    m = rec.metrics
    wrong = m.get("wrong")
    lines = [f"Out of bounds values (#wrong) : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    if m.get("slowest_link_src_node") is not None:
        lines.append(f"slowest link: node {m['slowest_link_src_node']}'s (measured with node "
                     f"{m['slowest_link_dst_node']}), {_f(m['link_busbw_min'], 3)} GB/s = "
                     f"{fmt_pct(m.get('slowest_link_fraction'))} of the median {_f(m['link_busbw_median'], 3)} GB/s")
    return lines


def burnin_tables(rec: RunRecord) -> list[Table]:
    """One row per rank: its device, rounds, rates, whether its results agree, and what the monitor saw."""
    from dlscale.micro.burnin import findings, mean

    c, ranks = rec.config, rec.raw.get("ranks", [])
    found = findings(ranks) if ranks else {}
    flops = c.get("gemm_chain", 0) * 2 * c.get("gemm_size", 0) ** 3
    tokens = c.get("llm_steps", 0) * c.get("batch_size", 0) * c.get("seq_len", 0)
    t = Table("rank", "device", "rounds", "GEMM TFLOP/s", "LLM tokens/s", "results", "power (W)", "clock (MHz)",
              "temp (C)", title=f"burnin  {c.get('precision')} GEMM chain {c.get('gemm_chain')} x {c.get('gemm_size')}^2, "
              f"llama_tiny {c.get('llm_steps')} steps, {_f(c.get('duration_s'), 0)} s", title_justify="left")
    for r in ranks:
        m, d = r.get("monitor") or {}, r.get("device") or {}
        clock = m.get("monitor_gpu_sm_clock_MHz_mean", m.get("monitor_cpu_clock_MHz_mean"))
        temp = m.get("monitor_gpu_temp_C_max", m.get("monitor_cpu_temp_C_max"))
        t.add_row(str(r["rank"]), f"{d.get('device', '?')} {d.get('device_name') or ''}".strip(), str(r["rounds"]),
                  _f(flops / mean(r["gemm_s"]) / 1e12 if r.get("gemm_s") else None, 4),
                  _f(tokens / mean(r["llm_s"]) if r.get("llm_s") else None, 0),
                  "wrong" if found.get(r["rank"]) else "agree", _f(m.get("monitor_gpu_power_W_mean"), 0),
                  _f(clock, 0), _f(temp, 0))
    return [t]


def burnin_footer(rec: RunRecord) -> list[str]:
    from dlscale.micro.burnin import device_words, findings

    ranks = rec.raw.get("ranks", [])
    found = findings(ranks) if ranks else {}
    lines = [f"{device_words(r)}: {'; '.join(found[r['rank']])}" for r in ranks if found.get(r["rank"])]
    if ranks and not lines:
        lines.append(f"every round of every rank gave the same bits ({rec.metrics.get('rounds')} rounds)")
    notes = list(dict.fromkeys(n for r in ranks for n in r.get("notes") or []))
    return lines + [f"note: {n}" for n in notes]


RANKED = {"collectives": (collectives_tables, collectives_footer), "links": (links_tables, links_footer),
          "burnin": (burnin_tables, burnin_footer)}


def print_record(rec: RunRecord, console: Any) -> None:
    """Every table and footer line of a micro record, on ``console`` (a Rich console)."""
    name = rec.workload
    if name in ("gemm", "conv", "rnn"):
        from dlscale import micro

        console.print(kernel_table(rec, tuple(micro.get(name).columns)))
        for line in kernel_footer(rec):
            console.print(line, markup=False)
    elif name == "memory":
        console.print(memory_table(rec))
    elif name == "p2p":
        console.print(header(rec))
        console.print(p2p_connectivity_table(rec))
        for t in p2p_tables(rec):
            console.print(t)
    elif name in RANKED:
        tables, footer = RANKED[name]
        console.print(header(rec))
        for t in tables(rec):
            console.print(t)
        for line in footer(rec):
            console.print(line, markup=False)
    if name in ("gemm", "conv", "rnn", "memory", "p2p"):
        for line in window_lines(rec):
            console.print(line, markup=False)
