"""Where a job's ranks run on a node: one GPU each, and the CPUs near that GPU.

- ``check``: before dlscale's launcher starts any rank, refuse in one line what cannot measure
  anything true: more ranks on a node than the GPUs it shows (two ranks on one GPU share it and
  each reports half a GPU), and NCCL across MIG instances (MIG gives no CUDA IPC or peer access
  between instances, so NCCL has no path between them; NVIDIA's MIG user guide). Under a launcher
  the user started only the MIG rule can be checked before a rank runs (``check_mig``); two ranks
  on one GPU are found, and refused, as the ranks join (``env.init_process_group``).
- ``mode``: how the ranks are bound to CPUs. A rank on a GPU runs on the CPUs of the GPU's NUMA
  node that its job owns, bound by dlscale in the rank (``bind_rank``: every thread onto the CPUs
  NVML names for its GPU, ``nvmlDeviceGetCpuAffinity``). ``--no-cpu-binding`` turns it off; CPU-only
  runs are not bound. Under an external launcher (srun, torchrun, mpirun started by the user) its
  binding stands: ``launcher``. torchrun's own ``--numa-binding=node`` is not used: it binds to the
  NUMA node's CPUs by local rank as the agent sees them, fails the rank where those lie outside the
  job's, and leaves a rank on the few the job owns there; dlscale does what it does within the job.
- ``job_cpus``: the CPUs the job owns on this node, whatever put it there: this process's affinity
  (taskset, numactl, a container's cpuset), the cgroup cpuset of its own group
  (``cgroup.cpuset``: a container's ``cpuset.cpus.effective``, Slurm's task/cgroup), the Slurm step's
  binding of this task (``SLURM_CPU_BIND_TYPE``/``SLURM_CPU_BIND_LIST``, ``SLURM_LOCALID``), and the
  launching process's (``JOB_CPUS_ENV``, which dlscale's launcher gives its ranks with the number of
  ranks on the host, ``JOB_RANKS_ENV``). A rank's CPUs always lie within them: its GPU's CPUs the
  job owns (``plan``), or all the job's where those are none or fewer than a rank needs (its share
  of the job's CPUs over the host's ranks, at most ``RANK_MIN_CPUS``; the GPU's CPUs shared by the
  ranks whose GPUs are near them).

The mode travels to the ranks in ``env.BINDING_ENV`` (``launch_env``), and comes back from
``bind_rank`` saying which CPUs the rank took and why; every rank's CPUs are gathered when it joins
its process group (``env.init_process_group``) and the record's config holds both
(``cpu_binding``, ``rank_cpus``). No torch at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dlscale.distributed.env import BINDING_ENV, DistEnv, device_index
from dlscale.errors import UsageError
from dlscale.format import fmt_count, fmt_cpus

MODES = ("nvml", "off", "cpu", "launcher")  # records before dlscale bound every rank itself may say "torchrun"
JOB_CPUS_ENV = "DLSCALE_JOB_CPUS"  # the launching process's job CPUs (fmt_cpus), for its ranks
JOB_RANKS_ENV = "DLSCALE_JOB_RANKS"  # how many of the job's ranks share them on this host
# The fewest CPUs a rank is bound to where the job owns more: its Python thread, NCCL's proxy thread,
# the CUDA driver's threads and a loader or pin-memory thread each have one (dlscale's choice).
RANK_MIN_CPUS = 4


def uses_cuda(config: dict[str, Any]) -> bool:
    """Whether the job's ranks run on GPUs: ``--device cuda``, or auto with CUDA here."""
    device = config.get("device") or "auto"
    if device not in ("auto", "cuda"):
        return False
    import torch

    return torch.cuda.is_available()


def mig_devices(n: int) -> list[int]:
    """The CUDA devices (of the first ``n``) that are MIG instances: NVML's match where NVML answers,
    else the name CUDA gives an instance ("NVIDIA A100-SXM4-40GB MIG 1g.5gb")."""
    import torch

    from dlscale.monitor import nvml

    found = {i for i in range(n) if " MIG " in f" {torch.cuda.get_device_name(i)} "}
    nv = nvml.start()
    if nv is not None:
        try:
            found |= {i for i, g in enumerate(nvml.cuda_gpus(nv, n, [])) if g is not None and g.mig is not None}
        finally:
            nvml.stop(nv)
    return sorted(found)


def check(layout: Any, config: dict[str, Any]) -> None:
    """Before dlscale's launcher starts the ranks: refuse more ranks on this node than its GPUs, and
    NCCL over MIG instances (the module doc)."""
    if not uses_cuda(config):
        return
    import torch

    gpus = torch.cuda.device_count()
    if layout.ranks_here > gpus:
        raise UsageError(f"{fmt_count(layout.ranks_here, 'rank')} on this node but {fmt_count(gpus, 'GPU')} visible: "
                         f"dlscale runs one rank per GPU; give --nproc-per-node {gpus} or fewer (or --device cpu)")
    check_mig(layout, config, layout.world_size)


def check_mig(layout: Any, config: dict[str, Any], world: int) -> None:
    """Refuse NCCL across MIG instances. Under an external launcher this is all that can be checked before
    the ranks join: each may see GPUs of its own (``srun --gpus-per-task``), so two ranks sharing one GPU
    is found as they join (``env.init_process_group``)."""
    if not uses_cuda(config) or (layout.launch_backend or "nccl") != "nccl" or world < 2:
        return
    import torch

    mig = mig_devices(torch.cuda.device_count())
    if mig:
        raise UsageError(f"NCCL cannot run across MIG instances (CUDA device {mig[0]} is one: MIG gives no peer "
                         "access between instances); use whole GPUs (MIG mode off) or --backend gloo")


def mode(layout: Any, config: dict[str, Any]) -> str:
    """How dlscale's launcher binds the job's ranks to CPUs (``MODES``; the module doc)."""
    if not uses_cuda(config):
        return "cpu"
    return "nvml" if layout.cpu_binding else "off"


def launch_env(layout: Any, config: dict[str, Any]) -> dict[str, str]:
    """What dlscale's launcher tells its ranks: the binding mode, the job's CPUs here and how many ranks share them."""
    cpus, _ = job_cpus()
    return {BINDING_ENV: mode(layout, config), JOB_CPUS_ENV: fmt_cpus(cpus), JOB_RANKS_ENV: str(layout.ranks_here)}


def parse_cpus(text: str) -> set[int]:
    """"0-3,8" -> {0, 1, 2, 3, 8} (a cpuset or taskset list)."""
    from dlscale.system import parse_cpulist

    return set(parse_cpulist(text.strip())) if text.strip() not in ("", "-") else set()


def slurm_cpus(environ: Mapping[str, str]) -> set[int] | None:
    """The CPUs a Slurm step bound this task to by mask or map (``srun --cpu-bind=mask_cpu:0x3,0xC``:
    ``SLURM_CPU_BIND_LIST`` holds one entry per task on the node, this task's is ``SLURM_LOCALID``'s);
    None where the step bound none that way."""
    kind, listed = environ.get("SLURM_CPU_BIND_TYPE") or "", environ.get("SLURM_CPU_BIND_LIST") or ""
    entries = [e for e in listed.split(",") if e]
    if not entries or not kind.startswith(("mask_cpu", "map_cpu")):
        return None
    try:
        entry = entries[int(environ.get("SLURM_LOCALID") or 0) % len(entries)]
        if kind.startswith("map_cpu"):
            return {int(entry, 16) if entry.lower().startswith("0x") else int(entry)}
        mask = int(entry, 16)
    except ValueError:  # a list this does not read: no limit taken from it
        return None
    return {c for c in range(mask.bit_length()) if mask >> c & 1}


def job_cpus(environ: Mapping[str, str] | None = None) -> tuple[set[int], list[str]]:
    """The CPUs the job owns here and where each limit came from (the module doc): this process's
    affinity, its cgroup's cpuset, the Slurm step's binding, the launching process's."""
    from dlscale.distributed import cgroup

    e = os.environ if environ is None else environ
    cpus, said = set(os.sched_getaffinity(0)), ["this process's affinity"]
    limits: list[tuple[set[int] | None, str]] = []
    found = cgroup.cpuset()
    if found is not None:
        limits.append((parse_cpus(found[0]), found[1]))
    limits.append((slurm_cpus(e), "the Slurm step's binding"))
    if e.get(JOB_CPUS_ENV):
        limits.append((parse_cpus(e[JOB_CPUS_ENV]), "the launching process's"))
    for limit, where in limits:
        if limit is not None and limit & cpus:
            cpus &= limit
            said.append(where)
        elif limit is not None:  # a list in other numbers than the kernel's (Slurm's abstract ids): not a limit
            said.append(f"not {where} ({fmt_cpus(limit)}: none of them is this process's)")
    return cpus, said


def gpu_cpu_sets(cuda_indices: list[int]) -> dict[int, set[int] | None]:
    """The CPUs NVML names for each CUDA device (None: no NVML, no match, a MIG instance), in one NVML session."""
    from dlscale.monitor import nvml

    nv = nvml.start()
    if nv is None:
        return dict.fromkeys(cuda_indices)
    try:
        out: dict[int, set[int] | None] = {}
        for i in cuda_indices:
            g = nvml.cuda_handle(nv, i, [])
            found = nvml.probe(nv, [], "CPU affinity", lambda g=g: nvml.gpu_cpus(nv, g.handle)) if g else None
            out[i] = set(found) if found else None
        return out
    finally:
        nvml.stop(nv)


def plan(near: set[int] | None, job: set[int], ranks: int, sharing: int = 1) -> tuple[set[int], str]:
    """A rank's CPUs and why: its GPU's CPUs within the job's (``near``: NVML's for the GPU), unless those
    are none, or, divided among the ``sharing`` ranks whose GPUs are near the same CPUs, fewer than a
    rank needs: its share of the job's CPUs (over the host's ``ranks``), at most ``RANK_MIN_CPUS``; then
    all the job's. Never a CPU outside ``job``."""
    mine = (near or set()) & job
    need = min(RANK_MIN_CPUS, max(1, len(job) // max(1, ranks)))
    if not near:
        return set(job), "nvml: the job's CPUs (NVML gave no CPUs for the GPU)"
    if not mine:
        return set(job), "nvml: the job's CPUs (the GPU's CPUs are outside the job's)"
    if len(mine) // max(1, sharing) < need:
        return set(job), (f"nvml: the job's CPUs (the job owns {len(mine)} of the GPU's CPUs for "
                          f"{fmt_count(sharing, 'rank')}, fewer than the {need} a rank needs)")
    return mine, "nvml"


def bind_rank(env: DistEnv) -> str:
    """In a rank, before its work: with mode ``nvml``, every thread of this process onto the CPUs ``plan``
    gives it within the job's (``job_cpus``). Returns the mode as it turned out, saying which CPUs where
    they are not the GPU's (``BINDING_ENV`` says it on)."""
    import torch

    how = os.environ.get(BINDING_ENV) or "launcher"
    if how != "nvml":
        return how
    job, _ = job_cpus()
    ranks = int(os.environ.get(JOB_RANKS_ENV) or env.local_world_size or 1)
    devices = max(1, torch.cuda.device_count())
    me = device_index(env)
    near = gpu_cpu_sets(sorted({r % devices for r in range(ranks)} | {me}))
    mine = (near.get(me) or set()) & job
    sharing = sum(1 for r in range(ranks) if mine & (near.get(r % devices) or set())) or 1
    target, how = plan(near.get(me), job, ranks, sharing)
    for tid in os.listdir("/proc/self/task"):  # threads started before this keep no other mask
        try:
            os.sched_setaffinity(int(tid), target)
        except OSError:  # a thread that ended meanwhile
            continue
    os.environ[BINDING_ENV] = how
    return how
