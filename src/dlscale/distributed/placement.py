"""Where a job's ranks run on a node: one GPU each, and the CPUs near that GPU.

- ``check``: before dlscale's launcher starts any rank, refuse in one line what cannot measure
  anything true: more ranks on a node than the GPUs it shows (two ranks on one GPU share it and
  each reports half a GPU), and NCCL across MIG instances (MIG gives no CUDA IPC or peer access
  between instances, so NCCL has no path between them; NVIDIA's MIG user guide). Under a launcher
  the user started only the MIG rule can be checked before a rank runs (``check_mig``); two ranks
  on one GPU are found, and refused, as the ranks join (``env.init_process_group``).
- ``mode``: how the ranks are bound to CPUs. A rank on a GPU runs on the CPUs of the GPU's NUMA
  node: through torchrun's own ``--numa-binding=node`` where the installed torchrun has it and
  numactl is installed (it binds through numactl), else by dlscale in the rank
  (``bind_rank``: every thread onto the CPUs NVML names for its GPU, ``nvmlDeviceGetCpuAffinity``,
  within those the process may use). ``--no-cpu-binding`` turns it off; CPU-only runs and
  emulated nodes sharing one host's GPUs through torchrun are not bound by torchrun (dlscale binds
  the latter itself). Under an external launcher (srun, torchrun, mpirun started by the user) its
  binding stands: ``launcher``.

The mode travels to the ranks in ``env.BINDING_ENV``; every rank's CPUs are gathered when it joins
its process group (``env.init_process_group``) and the record's config holds both
(``cpu_binding``, ``rank_cpus``). No torch at import time.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from dlscale.distributed.env import BINDING_ENV, DistEnv, device_index
from dlscale.errors import UsageError
from dlscale.format import fmt_count

MODES = ("torchrun", "nvml", "off", "cpu", "launcher")


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
    from dlscale import compat

    if not uses_cuda(config):
        return "cpu"
    if not layout.cpu_binding:
        return "off"
    if not layout.emulate_nodes and compat.available("torchrun_numa_binding") and shutil.which("numactl"):
        return "torchrun"
    return "nvml"


def gpu_cpus(cuda_index: int) -> list[int] | None:
    """The CPUs NVML names for CUDA device ``cuda_index`` (None: no NVML, no match, a MIG instance)."""
    from dlscale.monitor import nvml

    nv = nvml.start()
    if nv is None:
        return None
    try:
        g = nvml.cuda_handle(nv, cuda_index, [])
        return nvml.probe(nv, [], "CPU affinity", lambda: nvml.gpu_cpus(nv, g.handle)) if g is not None else None
    finally:
        nvml.stop(nv)


def bind_rank(env: DistEnv) -> str:
    """In a rank, before its work: with mode ``nvml``, every thread of this process onto its GPU's CPUs
    (those it may use of them). Returns the mode as it turned out (``BINDING_ENV`` says it on)."""
    how = os.environ.get(BINDING_ENV) or "launcher"
    if how != "nvml":
        return how
    cpus = gpu_cpus(device_index(env))
    allowed = os.sched_getaffinity(0)
    target = set(cpus or ()) & allowed
    if not target:
        how = "nvml: none (NVML gave no CPUs for the GPU)" if not cpus else \
            "nvml: none (the GPU's CPUs are outside this process's)"
    else:
        for tid in os.listdir("/proc/self/task"):  # threads started before this keep no other mask
            try:
                os.sched_setaffinity(int(tid), target)
            except OSError:  # a thread that ended meanwhile
                continue
    os.environ[BINDING_ENV] = how
    return how
