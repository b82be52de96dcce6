"""Who am I in a distributed job: rank, local rank, world size, master, from the launcher's variables.

Three launchers are understood, in this order:

- torchrun / torch.distributed.run (and anything that sets the same): ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``GROUP_RANK``.
- OpenMPI ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``;
  the master comes from ``MASTER_ADDR`` (``mpirun -x MASTER_ADDR=host``) or ``--master-addr``.
- Slurm ``srun`` (a job step, i.e. ``SLURM_STEP_ID`` is set, so a batch script's own shell is
  not mistaken for rank 0): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
  ``SLURM_NODEID``, ``SLURM_STEP_NUM_NODES`` (else ``SLURM_NNODES``, the job's: a step may span fewer
  nodes), ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``), ``SLURM_STEP_TASKS_PER_NODE``; the master is
  ``MASTER_ADDR`` or the first host of ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST``.

No torch at import time.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from dlscale.errors import UsageError

DEFAULT_PORT = 29500
# Set by dlscale's launcher on emulated nodes, which share one host's devices: the host-local index
# of the node's first rank (node k of g ranks per node: k x g).
DEVICE_OFFSET_ENV = "DLSCALE_DEVICE_OFFSET"
# Set by dlscale's launcher: how its ranks are bound to CPUs (distributed/placement.py); unset under a
# launcher the user started, whose binding stands.
BINDING_ENV = "DLSCALE_CPU_BINDING"
RANK_CPUS: list[str] = []  # every rank's CPUs ("0-15,32-47"), gathered as the ranks join their process group


@dataclass(frozen=True)
class DistEnv:
    """One process's place in the job, and how the job's ranks find each other."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "openmpi" | "slurm"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def launcher_of(environ: Mapping[str, str] | None = None) -> str | None:
    """The external launcher that started this process, or None for a plain process."""
    e = os.environ if environ is None else environ
    if "RANK" in e and "WORLD_SIZE" in e:
        return "torchrun"
    if "OMPI_COMM_WORLD_RANK" in e and "OMPI_COMM_WORLD_SIZE" in e:
        return "openmpi"
    if "SLURM_PROCID" in e and "SLURM_NTASKS" in e and ("SLURM_STEP_ID" in e or "SLURM_STEPID" in e):
        return "slurm"
    return None


def detect(environ: Mapping[str, str] | None = None, master_addr: str | None = None,
           master_port: int | None = None) -> DistEnv | None:
    """Rank, local rank, world size, local world size and master from the environment.

    Returns None when no launcher started this process. ``master_addr``/``master_port``
    (e.g. from ``--master-addr``) are used where the environment does not say. A value that
    is missing or not an integer is a ``UsageError`` naming the variable.
    """
    e = os.environ if environ is None else environ
    kind = launcher_of(e)
    if kind is None:
        return None
    if kind == "torchrun":
        world = _int(e, "WORLD_SIZE")
        local_world = _int(e, "LOCAL_WORLD_SIZE", default=world)
        env = DistEnv(
            rank=_int(e, "RANK"), local_rank=_int(e, "LOCAL_RANK", default=0), world_size=world,
            local_world_size=local_world, node_rank=_int(e, "GROUP_RANK", default=_int(e, "RANK") // max(local_world, 1)),
            nnodes=max(1, world // max(local_world, 1)),
            master_addr=e.get("MASTER_ADDR") or master_addr or "127.0.0.1",
            master_port=_int(e, "MASTER_PORT", default=master_port or DEFAULT_PORT), launcher=kind,
        )
    elif kind == "openmpi":
        world = _int(e, "OMPI_COMM_WORLD_SIZE")
        local_world = _int(e, "OMPI_COMM_WORLD_LOCAL_SIZE", default=world)
        rank = _int(e, "OMPI_COMM_WORLD_RANK")
        addr = e.get("MASTER_ADDR") or master_addr
        if not addr and world > local_world:
            raise UsageError("started by mpirun across nodes but no master is known; "
                             "export MASTER_ADDR to the ranks (mpirun -x MASTER_ADDR=host) or pass --master-addr")
        env = DistEnv(
            rank=rank, local_rank=_int(e, "OMPI_COMM_WORLD_LOCAL_RANK", default=0), world_size=world,
            local_world_size=local_world, node_rank=_int(e, "OMPI_COMM_WORLD_NODE_RANK", default=rank // max(local_world, 1)),
            nnodes=max(1, -(-world // max(local_world, 1))), master_addr=addr or "127.0.0.1",
            master_port=_int(e, "MASTER_PORT", default=master_port or DEFAULT_PORT), launcher=kind,
        )
    else:
        # a step's own counts first: SLURM_NNODES and SLURM_NTASKS are the job's where the step is smaller
        world = _int(e, "SLURM_STEP_NUM_TASKS", default=_int(e, "SLURM_NTASKS"))
        nnodes = _int(e, "SLURM_STEP_NUM_NODES", default=_int(e, "SLURM_NNODES", default=1))
        per_node = e.get("SLURM_STEP_TASKS_PER_NODE") or e.get("SLURM_TASKS_PER_NODE") or ""
        node_rank = _int(e, "SLURM_NODEID", default=0)
        local_world = tasks_on_node(per_node, node_rank) if per_node else -(-world // nnodes)
        nodelist = e.get("SLURM_STEP_NODELIST") or e.get("SLURM_JOB_NODELIST") or e.get("SLURM_NODELIST") or ""
        hosts = expand_hostlist(nodelist) if nodelist else []
        env = DistEnv(
            rank=_int(e, "SLURM_PROCID"), local_rank=_int(e, "SLURM_LOCALID", default=0), world_size=world,
            local_world_size=local_world, node_rank=node_rank, nnodes=nnodes,
            master_addr=e.get("MASTER_ADDR") or master_addr or (hosts[0] if hosts else "127.0.0.1"),
            master_port=_int(e, "MASTER_PORT", default=master_port or DEFAULT_PORT), launcher=kind,
        )
    if not 0 <= env.rank < env.world_size:
        raise UsageError(f"{kind}: rank {env.rank} is outside world size {env.world_size}")
    return env


def export(env: DistEnv) -> None:
    """Set the variables torch.distributed's ``env://`` rendezvous reads (for mpirun and srun)."""
    os.environ.update({
        "RANK": str(env.rank), "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank),
        "LOCAL_WORLD_SIZE": str(env.local_world_size), "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
    })


def host_rank(env: DistEnv, environ: Mapping[str, str] | None = None) -> int:
    """This rank's index among the ranks on this host: the local rank, shifted by the emulated node's
    offset where several emulated nodes share the host (``DEVICE_OFFSET_ENV``)."""
    e = os.environ if environ is None else environ
    return _int(e, DEVICE_OFFSET_ENV, default=0) + env.local_rank


def device_index(env: DistEnv, environ: Mapping[str, str] | None = None) -> int:
    """The CUDA device this rank owns: its host rank modulo the visible devices."""
    import torch

    return host_rank(env, environ) % max(1, torch.cuda.device_count())


def default_backend(device_type: str) -> str:
    """nccl on CUDA devices, gloo on CPUs."""
    return "nccl" if device_type == "cuda" else "gloo"


def check_backend(backend: str | None, launcher: str | None = None) -> None:
    """Refuse a ``--backend`` that cannot run here, before any rank starts: unknown, nccl without
    CUDA, mpi in a PyTorch built without MPI, or mpi under dlscale's own launcher (``launcher``
    "torchrun": an MPI process group takes each rank's place from mpirun, not from torchrun)."""
    if backend is None:
        return
    if backend not in ("gloo", "nccl", "mpi"):
        raise UsageError(f"unknown --backend {backend!r}; choose gloo, nccl or mpi")
    import torch
    import torch.distributed as dist

    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("--backend nccl needs CUDA devices; use gloo on CPU")
    if backend == "mpi" and not dist.is_mpi_available():
        raise UsageError(f"--backend mpi: this PyTorch {torch.__version__} was built without MPI "
                         "(torch.distributed.is_mpi_available() is False); use gloo (CPUs) or nccl (GPUs), "
                         "or a PyTorch built from source with MPI")
    if backend == "mpi" and launcher == "torchrun":
        raise UsageError("--backend mpi needs ranks started by mpirun (MPI gives each rank its place); run "
                         "`mpirun -np N dlscale ...` without --nproc-per-node, or use gloo or nccl")


def init_process_group(env: DistEnv, backend: str | None = None, device_type: str = "cpu",
                       timeout_s: float = 300.0) -> str:
    """Join the job's process group over ``env://``; returns the backend used.

    ``backend`` None picks nccl on CUDA, gloo on CPU. A process that joined already (one rank of a
    launcher's job running several runs, as ``dlscale accept`` does) keeps its group: joining the
    same store twice would wait on the first join's keys. ``timeout_s`` bounds the rendezvous and
    every collective: a rank that crashes or hangs makes the others fail after at most this long
    instead of waiting forever.
    """
    import torch
    import torch.distributed as dist

    backend = backend or default_backend(device_type)
    if dist.is_initialized():  # a launcher's rank running several jobs in one process (dlscale accept): one group
        if dist.get_backend() != backend:
            raise UsageError(f"this rank already joined its job's process group with {dist.get_backend()}; a later "
                             f"run in the same process cannot use {backend}: give --backend {dist.get_backend()}")
        if device_type == "cuda" and torch.cuda.is_available():
            torch.cuda.set_device(device_index(env))
        return backend
    check_backend(backend)
    if device_type == "cuda" and torch.cuda.is_available():  # every rank owns its device, whatever the backend
        torch.cuda.set_device(device_index(env))
    export(env)
    timeout = timedelta(seconds=timeout_s)
    with stdout_to_stderr():  # gloo of some torch releases (2.9) prints its connection banner to stdout
        if backend == "mpi":  # MPI's own transport and rendezvous: no store, no interface to choose
            dist.init_process_group(backend=backend, init_method="env://", rank=env.rank, world_size=env.world_size,
                                    timeout=timeout)
        else:
            _join_over_store(env, backend, timeout)
    _gather_places(env.world_size, device_type)
    return backend


def _join_over_store(env: DistEnv, backend: str, timeout: timedelta) -> None:
    """The process group over the rendezvous store, once the ranks have met there (``peers.join``: the
    interface chosen and every pair of nodes tried); a failure to make it names every rank's address."""
    import torch.distributed as dist

    from dlscale.distributed import peers

    store = peers.join(env, backend, timeout.total_seconds())
    try:
        dist.init_process_group(backend=backend, store=store, rank=env.rank, world_size=env.world_size,
                                timeout=timeout)
    except Exception as e:  # noqa: BLE001 - the same failure, with the addresses the ranks advertised
        first = (str(e).strip().splitlines() or [""])[0]
        raise RuntimeError(f"{type(e).__name__}: {first[:500]}; advertised: {peers.addresses(peers.JOINED)}") from e


def _gpu_id() -> str | None:
    """The current CUDA device as the driver names it: its UUID, else its PCI address (None: neither)."""
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    if getattr(p, "uuid", None) is not None:
        return str(p.uuid)
    parts = [getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    return ":".join(map(str, parts)) if all(x is not None for x in parts) else None


def _gather_places(world: int, device_type: str) -> None:
    """Every rank's host, GPU and CPUs (its affinity now, after any binding), gathered as the ranks join:
    the record's ``RANK_CPUS``, and a one-line refusal where two ranks share one GPU (under a launcher
    that gave several ranks the same devices; dlscale's own launcher refuses that before starting)."""
    import socket

    import torch.distributed as dist

    from dlscale.format import fmt_cpus

    mine = {"host": socket.gethostname(), "gpu": _gpu_id() if device_type == "cuda" else None,
            "cpus": fmt_cpus(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    seen: list[Any] = [None] * world
    dist.all_gather_object(seen, mine)
    RANK_CPUS[:] = [s["cpus"] for s in seen]
    first: dict[tuple[str, str], int] = {}
    for rank, s in enumerate(seen):
        if s["gpu"] is None:
            continue
        other = first.setdefault((s["host"], s["gpu"]), rank)
        if other != rank:
            raise UsageError(f"ranks {other} and {rank} share one GPU ({s['host']}, {s['gpu']}): dlscale runs one "
                             "rank per GPU; give each rank its own (fewer ranks per node, or srun --gpus-per-task 1)")


def binding() -> str:
    """How this rank is bound to CPUs: the mode dlscale's launcher chose (placement.py), else the
    external launcher's own."""
    return os.environ.get(BINDING_ENV) or "launcher"


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at 2 for the block: what C++ code prints there (a backend's banner)
    goes to the log stream, so stdout keeps only dlscale's data (a rank under mpirun or srun has no
    launcher that collects its output)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def tasks_on_node(spec: str, node: int) -> int:
    """Slurm's compressed tasks-per-node list, e.g. '2(x3),1' -> node 0..2 have 2, node 3 has 1."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise UsageError(f"cannot read Slurm tasks-per-node {spec!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    if node >= len(counts):
        raise UsageError(f"Slurm tasks-per-node {spec!r} has no entry for node {node}")
    return counts[node]


def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm's compressed host list, e.g. 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?(?:,|$)", nodelist):
        prefix, ranges = m.group(1), m.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for r in ranges.split(","):
            a, _, b = r.partition("-")
            if b:
                hosts.extend(f"{prefix}{i:0{len(a)}d}" for i in range(int(a), int(b) + 1))
            else:
                hosts.append(prefix + a)
    return hosts


def _int(e: Mapping[str, str], name: str, default: int | None = None) -> int:
    v = e.get(name)
    if v is None or v == "":
        if default is None:
            raise UsageError(f"the launcher did not set {name}")
        return default
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"{name}={v!r} is not an integer") from None
