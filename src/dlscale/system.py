"""System inventory: CPU, memory, accelerators and their topology, software versions.

The same dictionary is printed by ``dlscale sysinfo`` and stored in every run record.
Everything that can be absent (NVML, CUDA, a sysfs file) is guarded and reported as null; a GPU
probe that fails in an unexpected way leaves a line in ``accelerators.notes`` instead of stopping
the run whose record this inventory is part of. The accelerators (CUDA devices matched to NVML
devices by UUID, then PCI address, and their topology) are system_gpu.py's.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from dlscale.stores.url import redact_text
from dlscale.system_gpu import accelerators_guarded

ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve",
)

# x86 ISA levels, lowest first, and the flags each adds. A cap at a level keeps the flags of that
# level and the ones below it; Arm flags (asimd, sve) are not x86 levels and no cap touches them.
ISA_LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sse4_2", ("sse4_2",)),
    ("avx", ("avx",)),
    ("avx2", ("avx2", "fma")),
    ("avx2_vnni", ("avx_vnni",)),
    ("avx512", ("avx512f", "avx512bw", "avx512vl")),
    ("avx512_vnni", ("avx512_vnni",)),
    ("avx512_bf16", ("avx512_bf16",)),
    ("avx512_fp16", ("avx512_fp16",)),
    ("amx", ("amx_tile", "amx_bf16", "amx_int8")),
)
_LEVEL_NAMES = tuple(name for name, _ in ISA_LEVELS)
# The values torch's ATen dispatcher and oneDNN take for their own caps, as dlscale levels. ATen's
# "default" is its scalar (no-AVX) kernels; oneDNN's DEFAULT/ALL mean no cap. Other values (Power,
# s390x, Arm) do not cap an x86 ISA.
_ATEN_CAPS = {"default": "sse4_2", "avx2": "avx2", "avx512": "avx512"}
_DNNL_CAPS = {"sse41": "sse4_2", "avx": "avx", "avx2": "avx2", "avx2_vnni": "avx2_vnni",
              "avx2_vnni_2": "avx2_vnni", "avx512_core": "avx512", "avx512_core_vnni": "avx512_vnni",
              "avx512_core_bf16": "avx512_bf16", "avx512_core_fp16": "avx512_fp16",
              "avx10_1_512": "avx512_fp16", "avx512_core_amx": "amx", "avx512_core_amx_fp16": "amx",
              "avx10_1_512_amx": "amx", "avx10_1_512_amx_fp16": "amx"}


def isa_cap(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The lowest x86 ISA level the environment caps this process at, and which variables said so.

    ``DLSCALE_CPU_ISA`` (a dlscale level: sse4_2, avx, avx2, avx2_vnni, avx512, avx512_vnni,
    avx512_bf16, avx512_fp16, amx) lets a test or a user run as a smaller CPU; torch's
    ``ATEN_CPU_CAPABILITY`` and oneDNN's ``DNNL_MAX_CPU_ISA`` (or ``ONEDNN_MAX_CPU_ISA``) cap the
    kernels those libraries pick, so dlscale honours them too. None: no cap.
    """
    env = os.environ if environ is None else environ
    found: list[tuple[str, str]] = []  # (level, "VAR=value")
    own = env.get("DLSCALE_CPU_ISA", "").strip()
    if own:
        level = own.lower().replace("-", "_")
        if level not in _LEVEL_NAMES:
            from dlscale.errors import UsageError

            raise UsageError(f"DLSCALE_CPU_ISA={own!r} is not an ISA level; use one of {', '.join(_LEVEL_NAMES)}")
        found.append((level, f"DLSCALE_CPU_ISA={own}"))
    aten = env.get("ATEN_CPU_CAPABILITY", "").strip()
    if aten.lower() in _ATEN_CAPS:
        found.append((_ATEN_CAPS[aten.lower()], f"ATEN_CPU_CAPABILITY={aten}"))
    for var in ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA"):
        dnnl = env.get(var, "").strip()
        if dnnl.lower() in _DNNL_CAPS:
            found.append((_DNNL_CAPS[dnnl.lower()], f"{var}={dnnl}"))
    if not found:
        return None
    level = min((lv for lv, _ in found), key=_LEVEL_NAMES.index)
    return {"level": level, "set_by": [what for _, what in found]}


def effective_isa(flags: set[str], cap: dict[str, Any] | None) -> dict[str, bool]:
    """The ISA flags this process may use: the CPU's flags less every level above ``cap``."""
    isa = {f: (f in flags) for f in ISA_FLAGS}
    if cap is not None:
        above = ISA_LEVELS[_LEVEL_NAMES.index(cap["level"]) + 1:]
        for _, level_flags in above:
            for f in level_flags:
                isa[f] = False
    return isa


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model name, sockets, physical cores, logical CPUs and flags from /proc/cpuinfo."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    model, flags = None, set()
    sockets, cores = set(), set()
    for b in blocks:
        fields = {}
        for line in b.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                fields[k.strip()] = v.strip()
        model = model or fields.get("model name") or fields.get("Model") or fields.get("cpu model")
        flags |= set((fields.get("flags") or fields.get("Features") or "").split())
        pid = fields.get("physical id", "0")
        sockets.add(pid)
        cores.add((pid, fields.get("core id", fields.get("processor"))))
    return {
        "model": model,
        "sockets": len(sockets) or None,
        "physical_cores": len(cores) or None,
        "logical_cpus": len(blocks) or None,
        "flags": flags,
    }


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (a container's cpuset, taskset, numactl, Slurm's or
    dlscale's binding), not the machine's count, which ``os.cpu_count()`` gives. Every thread and worker
    count dlscale picks divides this."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cpu_info() -> dict[str, Any]:
    info = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    flags = info.pop("flags")
    if not info["model"]:
        info["model"] = platform.processor() or None
    try:
        import psutil

        info["physical_cores"] = info["physical_cores"] or psutil.cpu_count(logical=False)
        info["logical_cpus"] = info["logical_cpus"] or psutil.cpu_count(logical=True)
        freq = psutil.cpu_freq()
        info["max_mhz"] = round(freq.max, 1) if freq and freq.max else None
    except Exception:  # noqa: BLE001 - the inventory reports what it can
        info["max_mhz"] = None
    m = re.search(r"@\s*([\d.]+)\s*GHz", info["model"] or "")
    info["nominal_ghz"] = float(m.group(1)) if m else None
    info["affinity"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cap = isa_cap()
    info["isa"] = effective_isa(flags, cap)
    if cap is not None:  # the record says the CPU could do more than this run was allowed to use
        info["isa_cap"] = cap
        info["isa_hardware"] = {f: (f in flags) for f in ISA_FLAGS}
    info["architecture"] = platform.machine()
    return info


def numa_info() -> list[dict[str, Any]]:
    nodes = []
    base = Path("/sys/devices/system/node")
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = parse_cpulist(_read(str(d / "cpulist")) or "")
        mem = _read(str(d / "meminfo")) or ""
        m = re.search(r"MemTotal:\s+(\d+)\s+kB", mem)
        nodes.append({"node": int(d.name[4:]), "cpus": cpus, "memory_bytes": int(m.group(1)) * 1024 if m else None})
    return nodes


def memory_info() -> dict[str, Any]:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total_bytes": vm.total, "available_bytes": vm.available}
    except Exception:  # noqa: BLE001
        return {"total_bytes": None, "available_bytes": None}


def _pkg_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def software_info(with_torch: bool = True) -> dict[str, Any]:
    from dlscale import __version__

    sw: dict[str, Any] = {
        "dlscale": __version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "torchvision": _pkg_version("torchvision"),
        "timm": _pkg_version("timm"),
    }
    if with_torch:
        import torch

        sw["torch"] = torch.__version__
        sw["cuda"] = torch.version.cuda
        sw["hip"] = getattr(torch.version, "hip", None)
        sw["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        from dlscale import nccl

        sw["nccl"] = nccl.version() if torch.cuda.is_available() else None
        sw["mkldnn"] = torch.backends.mkldnn.is_available()
        sw["torch_threads"] = torch.get_num_threads()
    return sw


def machine_id() -> str | None:
    """The machine's stable id (systemd's /etc/machine-id, else D-Bus's copy): what a CPU machine's figures
    are keyed by across runs, as a GPU's are by its NVML UUID and serial (a CPU has neither); None where
    neither file is (a container may lack both)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def collect(with_torch: bool = True) -> dict[str, Any]:
    """The whole inventory. ``with_torch=False`` skips what needs torch (fast, for tests)."""
    inv: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "machine_id": machine_id(),
        "cpu": cpu_info(),
        "numa": numa_info(),
        "memory": memory_info(),
        "software": software_info(with_torch),
        "argv": [redact_text(a) for a in sys.argv],  # a database URL's password never enters a record
        "slurm": slurm_context(),
    }
    inv["accelerators"] = accelerators_guarded() if with_torch else None
    return inv


def slurm_context() -> dict[str, Any] | None:
    """The Slurm job this process runs in (job and step id, its nodes, this node's rank), or None outside one:
    a record written inside a sweep point's job or an acceptance's names the job that ran it."""
    env = os.environ
    if not env.get("SLURM_JOB_ID"):
        return None
    keys = {"job_id": "SLURM_JOB_ID", "step_id": "SLURM_STEP_ID", "nodelist": "SLURM_JOB_NODELIST",
            "nnodes": "SLURM_JOB_NUM_NODES", "node_id": "SLURM_NODEID", "partition": "SLURM_JOB_PARTITION"}
    return {k: env[v] for k, v in keys.items() if env.get(v)}


_CACHE: dict[str, Any] | None = None


def collect_cached() -> dict[str, Any]:
    """The inventory, collected once per process (NVML and /proc reads are not free)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = collect(with_torch=True)
    import copy

    return copy.deepcopy(_CACHE)
