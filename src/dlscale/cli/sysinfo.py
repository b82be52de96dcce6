"""``dlscale sysinfo``: the system inventory stored with every run."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from dlscale.cli.common import Format, FormatOpt, out, print_json
from dlscale.cli.render import fmt_bytes
from dlscale.format import fmt_cpus

HELP = """Show this machine's inventory (CPU, memory, accelerators, topology, versions).

CPU model, sockets/cores/threads, NUMA nodes, ISA flags, memory; accelerators with their
memory, compute capability, driver and NVML topology; torch/CUDA/cuDNN/NCCL/Python versions.

--health checks every GPU NVML sees instead: clock-throttle reasons now, ECC error counts,
retired pages or row remapping, with a warning for a GPU that should not be benchmarked.

Examples:
  dlscale sysinfo --format json
  dlscale sysinfo --health"""

HealthOpt = Annotated[bool, typer.Option("--health", help="Check each GPU's health (throttling, ECC, "
                                                           "retired pages, row remapping) instead.")]


def sysinfo(fmt: FormatOpt = Format.human, health: HealthOpt = False) -> None:
    from dlscale.system import collect

    if health:
        _print_health(fmt)
        return
    inv = collect(with_torch=True)
    if fmt == Format.json:
        print_json(inv)
        return
    cpu, sw, acc = inv["cpu"], inv["software"], inv["accelerators"]
    t = Table(title=f"dlscale sysinfo: {inv['hostname']}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("CPU", f"{cpu['model']} ({cpu['architecture']})")
    t.add_row("sockets / cores / threads", f"{cpu['sockets']} / {cpu['physical_cores']} / {cpu['logical_cpus']}")
    t.add_row("NUMA nodes", ", ".join(f"node{n['node']}: cpus {fmt_cpus(n['cpus'])}" for n in inv["numa"]) or "-")
    t.add_row("ISA", " ".join(k for k, v in cpu["isa"].items() if v) or "-")
    if cpu.get("isa_cap"):
        cap = cpu["isa_cap"]
        t.add_row("ISA cap", f"{cap['level']} (set by {', '.join(cap['set_by'])}); the CPU itself has: "
                  + (" ".join(k for k, v in cpu["isa_hardware"].items() if v) or "-"))
    t.add_row("memory", fmt_bytes(inv["memory"]["total_bytes"]))
    if acc["count"]:
        for d in acc["devices"]:
            t.add_row(f"GPU {d['index']}", f"{d['name']}, {fmt_bytes(d['memory_bytes'])}, cc {d['compute_capability']}")
        t.add_row("driver", str(acc.get("driver")))
        topo = acc.get("topology")
        if topo and topo.get("gpu_gpu"):
            t.add_row("GPU-GPU topology", "\n".join(" ".join(f"{c:>5}" for c in row) for row in topo["gpu_gpu"]))
            for g in topo.get("gpus", []):
                if "cpu_affinity" in g:
                    t.add_row(f"GPU {g['index']} CPU affinity", fmt_cpus(g["cpu_affinity"]))
                if g.get("nvlink"):
                    t.add_row(f"GPU {g['index']} NVLinks", _nvlinks(g["nvlink"]))
        for note in acc.get("notes") or []:
            t.add_row("note", note)
    else:
        t.add_row("accelerators", "none (CUDA not available)")
    t.add_row("software", ", ".join(f"{k} {v}" for k, v in sw.items() if v not in (None, False)))
    out.print(t)


def _nvlinks(nv: dict[str, Any]) -> str:
    """'16 of 18 up, 16 to NVSwitch, NVLink 4 at 25 GB/s per link and direction'."""
    gen = f", NVLink {nv['generation']} at {nv['gbps_per_link']:g} GB/s per link and direction" \
        if nv.get("generation") and nv.get("gbps_per_link") else ""
    return f"{nv['active']} of {nv.get('nominal') or nv['present']} up, {nv['to_switch']} to NVSwitch{gen}"


def _print_health(fmt: Format) -> None:
    from dlscale.monitor.health import check_host

    rep = check_host()
    if fmt == Format.json:
        print_json(rep)
        return
    if not rep["gpus"]:
        out.print(rep.get("note", "no GPU to check"), markup=False, highlight=False)
        return
    t = Table(title="dlscale sysinfo --health", title_justify="left")
    for col in ("GPU", "name", "throttle now", "ECC unc. vol/agg", "ECC corr. vol/agg", "retired SBE/DBE",
                "remapped rows", "status"):
        t.add_column(col)
    for g in rep["gpus"]:
        reasons, ecc = g.get("throttle_reasons"), g.get("ecc") or {}
        t.add_row(str(g["index"]), str(g["name"]), "-" if reasons is None else (", ".join(reasons) or "none"),
                  _pair(ecc, "uncorrected"), _pair(ecc, "corrected"), _retired(g.get("retired_pages")),
                  _remapped(g.get("remapped_rows")),
                  "LOST" if g.get("lost") else "WARN" if g["warnings"] else "unread" if g.get("unread")
                  else "check setup" if g.get("advisories") else "ok")
    out.print(t)
    out.print(_links_table(rep["gpus"]))
    for line in [f"warning: {w}" for g in rep["gpus"] for w in g["warnings"]] + \
            [f"unread: {w}" for g in rep["gpus"] for w in g.get("unread") or []] + \
            [f"setup: {w}" for g in rep["gpus"] for w in g.get("advisories") or []] + \
            [f"note: {n}" for n in rep.get("notes") or []]:
        out.print(line, markup=False, highlight=False)


def _links_table(gpus: list[dict[str, Any]]) -> Table:
    """Each GPU's links and limits: NVLinks up of the model's, their error counters, fabric, PCIe, power."""
    t = Table(title="links and limits", title_justify="left")
    for col in ("GPU", "NVLinks up", "NVLink replay/recovery/CRC", "fabric", "PCIe now (max)", "power limit (default)"):
        t.add_column(col)
    for g in gpus:
        nv, fab, p, w = g.get("nvlink") or {}, g.get("fabric"), g.get("pcie") or {}, g.get("power") or {}
        errs = nv.get("errors") or {}
        crc = None if errs.get("crc_flit") is None else errs["crc_flit"] + (errs.get("crc_data") or 0)
        t.add_row(str(g["index"]),
                  f"{nv['active']} of {nv.get('nominal') or nv['present']}" if nv else "-",
                  "/".join(_dash(v) for v in (errs.get("replay"), errs.get("recovery"), crc)) if nv else "-",
                  _fabric(fab),
                  f"Gen{_dash(p.get('gen'))} x{_dash(p.get('width'))} "
                  f"(Gen{_dash(p.get('gen_max'))} x{_dash(p.get('width_max'))})" if p.get("gen_max") else "-",
                  f"{_dash(w.get('limit_w'))} W ({_dash(w.get('default_w'))} W)" if w.get("limit_w") else "-")
    return t


def _fabric(fab: dict[str, Any] | None) -> str:
    if not fab:
        return "-"
    if "state" not in fab:  # NVML would not read it: its error
        return f"unreadable ({fab.get('error') or fab.get('unread')})"
    return f"{fab['state']}{' (' + ', '.join(fab['health']) + ')' if fab['health'] else ''}"


def _dash(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _pair(ecc: dict[str, Any], kind: str) -> str:
    return " / ".join("-" if ecc.get(f"{c}_{kind}") is None else str(ecc[f"{c}_{kind}"])
                      for c in ("volatile", "aggregate"))


def _retired(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    return f"{r.get('single_bit')}/{r.get('double_bit')}" + (" (pending)" if r.get("pending") else "")


def _remapped(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    flags = [k for k in ("pending", "failure") if r.get(k)]
    return f"{r['correctable']} corr / {r['uncorrectable']} unc" + (f" ({', '.join(flags)})" if flags else "")
