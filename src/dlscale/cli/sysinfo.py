"""``dlscale sysinfo``: the system inventory stored with every run."""

from __future__ import annotations

from rich.table import Table

from dlscale.cli.common import Format, FormatOpt, out, print_json
from dlscale.cli.render import fmt_bytes

HELP = """Show this machine's inventory (CPU, memory, accelerators, topology, versions).

CPU model, sockets/cores/threads, NUMA nodes, ISA flags, memory; accelerators with their
memory, compute capability, driver and NVML topology; torch/CUDA/cuDNN/NCCL/Python versions.

Example: dlscale sysinfo --format json"""


def sysinfo(fmt: FormatOpt = Format.human) -> None:
    from dlscale.system import collect

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
    t.add_row("NUMA nodes", ", ".join(f"node{n['node']}: cpus {_ranges(n['cpus'])}" for n in inv["numa"]) or "-")
    t.add_row("ISA", " ".join(k for k, v in cpu["isa"].items() if v) or "-")
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
                    t.add_row(f"GPU {g['index']} CPU affinity", _ranges(g["cpu_affinity"]))
    else:
        t.add_row("accelerators", "none (CUDA not available)")
    t.add_row("software", ", ".join(f"{k} {v}" for k, v in sw.items() if v not in (None, False)))
    out.print(t)


def _ranges(cpus: list[int]) -> str:
    if not cpus:
        return "-"
    parts, start, prev = [], cpus[0], cpus[0]
    for c in cpus[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if start != prev else str(start))
        if c is not None:
            start = prev = c
    return ",".join(parts)
