"""The acceptance suite: which checks apply to this machine, with which defaults, and the api call of each.

``plan`` resolves a spec against the machine: each check's options are its defaults here (GPU
server or CPU machine, ``quick`` or not) under the spec's own, validated by building the check's
typed configs (``spec.validate``); a check that cannot run here is listed with the reason (p2p
with fewer than two GPUs, health without NVML GPUs, collectives across nodes on one machine
without network namespaces). ``run_check`` is the thin list of ``dlscale.api`` calls: each check
makes ordinary recorded runs tagged with the acceptance id, and a failed run is kept (recorded
failed) for the verdicts.

Several nodes: ``EmulatedNodes`` (``dlscale accept --emulate-nodes K`` with the link rate and a node's own
link rate or CPU quota) lays out every check that runs ranks across nodes (``specs.LAID_OUT_ON_NODES``: the
collectives across the nodes, every node's link, the short test alone and on all, the scale
ladder) on K emulated nodes, over the machine's defaults and the spec's own options; the
built-in specs then also run the checks across nodes (``specs.NETWORK_CHECKS``).

Under a launcher (torchrun, srun, mpirun) this process is one rank of a job across nodes: the
checks that run on every rank (collectives across the nodes and every node's link, the short test
alone on every device of the cluster and on all of them) run in place, in the one process group
the rank joins; the per-node checks are left to ``dlscale accept`` on each node without a launcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlscale.accept.figures.collect import ONE_RUN_ACROSS_NODES
from dlscale.accept.plan import spec as specs
from dlscale.errors import RunFailure, UsageError
from dlscale.format import fmt_size
from dlscale.log import info

LINK = "1gbit"  # the emulated link rate where none is given
# under a launcher: the checks its ranks run in place (the rest are left to each node)
RUN_IN_PLACE = tuple(c for c in ONE_RUN_ACROSS_NODES if c in specs.CHECKS)
FAULTS = ("node_link_bandwidth", "node_cpu_quota")  # a node set apart: the emulated machine's state, not the suite
SCENARIO_RUNS = 3  # inference: LoadGen offline runs, whose spread is the figure's noise
# GPUs: the least a measured window lasts (seconds, quick and full; harness/window.py counts its steps or
# iterations from a probe), so a fast GPU's figure is not a second's worth. A training run's measured
# steps, a scale rung's, each LoadGen run, an inference batch size's forwards: WINDOW_S; a GEMM or memory
# case's timed calls on every GPU at once, a collective's (size, mode): CASE_S (many cases: the check
# measures tens of seconds in all, and its node power over them); p2p's n^2 x 6 cases: P2P_CASE_S.
# CPUs keep the counts their defaults give (their steps are slow already).
WINDOW_S = {True: 3.0, False: 5.0}
SWEEP_S = {True: 1.0, False: 2.0}
CASE_S = {"gemm": {True: 0.1, False: 0.25}, "memory": {True: 0.25, False: 1.0}, "collectives": {True: 0.5, False: 0.5}}
P2P_CASE_S = 0.05


@dataclass
class MachineFacts:
    """What planning knows of the machine it plans for: this one (``machine()``), or on Slurm the
    allocation's shape (``slurm.stand_in``)."""

    gpus: int = 0
    capability: tuple[int, int] | None = None
    launcher: str | None = None  # torchrun / srun / mpirun when this process is a rank
    world_size: int = 1
    nodes: int = 1
    no_emulation: str | None = None  # why emulated nodes cannot be made here, or None
    no_quota: str | None = None  # why CPU quotas cannot be set here, or None
    isa: dict[str, bool] = field(default_factory=dict)
    gpu_memory: int | None = None  # bytes of the smallest GPU (None: unknown): sizes the defaults that fill one


GIB = 2**30
BIG_GPU = 32 * GIB  # from here the short test runs ResNet-50 at batch 256 (dlscale's healthy rows' batch)
TOP_SIZE = 16 * GIB  # the collectives' largest message where a GPU holds it twice: the health checks' 16G


def short_batch(m: MachineFacts) -> int:
    """The short test's batch on a GPU server: 256, as dlscale's healthy rows measured it, where every GPU
    has ``BIG_GPU`` (ResNet-50 bf16 at 256 takes about a third of that); else, or unknown, 128."""
    return 256 if (m.gpu_memory or 0) >= BIG_GPU else 128


def top_size(m: MachineFacts) -> int:
    """The collectives' largest message on a GPU server: ``TOP_SIZE`` where the smallest GPU holds it twice
    (an out-of-place collective's two buffers; the exact check works in pieces), else the largest power of
    two it holds twice; 1G where the memory is unknown."""
    if not m.gpu_memory:
        return GIB
    size = TOP_SIZE
    while size > GIB and 2 * size > m.gpu_memory:
        size //= 2
    return size


@dataclass(frozen=True)
class EmulatedNodes:
    """The emulated nodes of an acceptance (``--emulate-nodes K`` and its link and per-node options),
    validated where built, as ``Layout`` validates them (rates, quotas, node numbers)."""

    emulate_nodes: int | None = None
    link_bandwidth: str | None = None
    link_latency: str | None = None
    node_link_bandwidth: Any = ()
    node_cpu_quota: Any = ()

    def __post_init__(self) -> None:
        from dlscale.layout import Layout

        lay = Layout(emulate_nodes=self.emulate_nodes, link_bandwidth=self.link_bandwidth,
                     link_latency=self.link_latency, node_link_bandwidth=self.node_link_bandwidth,
                     node_cpu_quota=self.node_cpu_quota)
        object.__setattr__(self, "node_link_bandwidth", lay.node_link_bandwidth)
        object.__setattr__(self, "node_cpu_quota", lay.node_cpu_quota)
        if self.emulate_nodes is not None and self.emulate_nodes < 2:
            raise UsageError(f"--emulate-nodes {self.emulate_nodes}: the checks across nodes need at least 2 nodes")

    def options(self) -> dict[str, Any]:
        """The layout options every check on the nodes takes (command spelling); {} without nodes."""
        if not self.emulate_nodes:
            return {}
        out: dict[str, Any] = {"emulate_nodes": self.emulate_nodes, "link_bandwidth": self.link_bandwidth or LINK}
        if self.link_latency:
            out["link_latency"] = self.link_latency
        for key in FAULTS:
            if getattr(self, key):
                out[key] = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in getattr(self, key))
        return out


@dataclass
class PlannedCheck:
    """A check that runs here, with its options resolved and its typed configs built."""

    check: str
    options: dict[str, Any]  # the check's fields (command spelling), defaults under the spec's
    configs: list[Any]  # its typed configs, built (validated)


@dataclass
class Plan:
    checks: list[PlannedCheck]
    not_run: list[tuple[str, str]]  # (check, why not here)
    machine: MachineFacts


def machine() -> MachineFacts:
    import torch

    from dlscale.distributed.cgroup import unavailable_reason as no_quota
    from dlscale.distributed.env import detect, launcher_of
    from dlscale.distributed.netns import unavailable_reason
    from dlscale.system import cpu_info

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = detect() if launcher_of() else None
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus)) if gpus else None
    return MachineFacts(gpus=gpus, capability=torch.cuda.get_device_capability(0) if gpus else None,
                   launcher=env.launcher if env else None, world_size=env.world_size if env else 1,
                   nodes=env.nnodes if env else 1, no_emulation=unavailable_reason(), no_quota=no_quota(),
                   isa=cpu_info().get("isa") or {}, gpu_memory=memory)


def defaults(check: str, m: MachineFacts, quick: bool, k: int | None = None) -> dict[str, Any]:
    """A check's options on this machine before the spec's own (docs/CLUSTER.md lists them); ``k``:
    the emulated nodes the checks on nodes run on (``EmulatedNodes``), else None."""
    return (_gpu_defaults if m.gpus else _cpu_defaults)(check, m, quick, k)


def _gpu_defaults(check: str, m: MachineFacts, quick: bool, k: int | None) -> dict[str, Any]:
    low = (m.capability or (8, 0))[0] < 8  # before Ampere: no bf16, no tf32
    prec = "fp16" if low else "bf16"
    per = max(1, m.gpus // k) if k else m.gpus  # GPUs per node (emulated nodes: each its own GPUs)
    ranks = {} if m.launcher else {"nproc_per_node": per}
    short = {"model": "resnet50", "batch_size": short_batch(m), "precision": prec, "steps": 30 if quick else 50,
             "warmup_steps": 10, "breakdown_steps": 0, "min_duration": WINDOW_S[quick]}
    cell = CASE_S["collectives"][quick]
    across = {"sizes": "16M:256M" if quick else "1M:1G", "ops": "all_reduce", "min_duration": cell}
    top = fmt_size(top_size(m))  # the healthy rows' sizes: 1G..8G (Azure's tables), 16G (the health checks)
    return {
        "memory": {"min_duration": CASE_S["memory"][quick]},
        "p2p": {"min_duration": P2P_CASE_S},
        "gemm": {"precision": ["fp32", prec] if quick else ["fp32", "fp16"] if low else
                 ["fp32", "tf32", "bf16", "fp16"], "min_duration": CASE_S["gemm"][quick]},
        "collectives": {"nproc_per_node": m.gpus, "sizes": f"1G:{top}" if quick else f"1M:{top}",
                        "ops": "all_reduce" if quick else "all_reduce,all_gather,reduce_scatter", "min_duration": cell},
        "collectives_nodes": {**across, **ranks} if k else across,
        "links": {},
        "train_alone": {**short, **ranks},
        "train": {**short, **ranks},
        "scale": {**short, "steps": 30, "devices": [d for d in (1, 2, 4, 8, 16) if d < per] + [per],
                  **({"layouts": [f"{n}x{per}" for n in range(2, k + 1)]} if k else {})},
        "inference": {"model": "resnet50", "batch_sizes": [64], "precision": prec, "duration": WINDOW_S[quick],
                      "iters": 20, "min_duration": SWEEP_S[quick], "scenario_runs": SCENARIO_RUNS},
        "burnin": {"duration": 60 if quick else 300, **ranks},
    }.get(check, {})


def _cpu_defaults(check: str, m: MachineFacts, quick: bool, k: int | None) -> dict[str, Any]:
    one = {"nproc_per_node": 1, "threads_per_rank": 1}  # a rank per (emulated) node
    ranks = {} if m.launcher else one if k else {"nproc_per_node": 2, "threads_per_rank": 1}
    short = {"model": "resnet18", "image_size": 32, "batch_size": 16, "steps": 15 if quick else 30,
             "warmup_steps": 3, "breakdown_steps": 0}
    coll = {"sizes": "256K:8M", "ops": "all_reduce"}
    links = {"sizes": "256K,2M", "iters": 5, "budget": 2}  # a link 10x slow still gets its 5 timed exchanges
    bf16 = bool(m.isa.get("avx512_bf16") or m.isa.get("amx_bf16"))
    emulated = {} if m.launcher else {**one, "link_bandwidth": LINK}  # one machine, no --emulate-nodes: its own nodes
    return {
        "memory": {"mem_mib": 256} if quick else {},
        "gemm": {"precision": ["fp32"] if quick or not bf16 else ["fp32", "bf16"]},
        "collectives": {"nproc_per_node": 2, "threads_per_rank": 1, **coll},
        "collectives_nodes": {**coll, **emulated, **({} if m.launcher else {"emulate_nodes": 2})},
        "links": {**links, **emulated, **({} if m.launcher else {"emulate_nodes": 3})},  # 3: a slow one shows
        "train_alone": {**short, **ranks},
        "train": {**short, **ranks},
        "scale": {**short, "threads_per_rank": 1, **({"devices": list(range(1, k + 1)),
                                                      "layouts": [f"{n}x1" for n in range(2, k + 1)]}
                                                     if k else {"devices": [1, 2]})},
        "inference": {"model": "resnet18", "image_size": 32, "batch_sizes": [32], "duration": 2 if quick else 5,
                      "iters": 10, "warmup": 2, "scenario_runs": SCENARIO_RUNS},
        "burnin": {"duration": 10 if quick else 30, "nproc_per_node": 2, "threads_per_rank": 1},
    }.get(check, {})


def why_not(check: str, m: MachineFacts, nodes: EmulatedNodes | None = None) -> str | None:
    """Why a check cannot run on this machine (None: it can)."""
    if m.launcher and check not in RUN_IN_PLACE:
        return (f"under {m.launcher} only the checks across every rank run; run `dlscale accept` on each node "
                "without a launcher for the per-node checks")
    if check == "health" and not m.gpus:
        return "no GPU visible: NVML's health counters have nothing to report"
    if check == "p2p" and m.gpus < 2:
        return f"needs at least 2 GPUs; this machine has {m.gpus}"
    if check in ("collectives", "scale") and m.gpus == 1:
        return "needs at least 2 devices; this machine has 1 GPU"
    if check in specs.NETWORK_CHECKS and not m.launcher and not (nodes and nodes.emulate_nodes):
        if m.gpus:
            return ("one node: run `dlscale accept` under srun/torchrun/mpirun across the nodes (or with "
                    "--emulate-nodes K) for what crosses them")
        if m.no_emulation:
            return f"emulated nodes unavailable here: {m.no_emulation}"
    if check in specs.NETWORK_CHECKS and m.launcher and m.nodes < 2:
        return f"{m.launcher} started one node: nothing crosses a node"
    return None


def several_nodes(m: MachineFacts, nodes: EmulatedNodes) -> bool:
    return bool(nodes.emulate_nodes) or (m.launcher is not None and m.nodes > 1)


def check_names(spec: specs.Spec, m: MachineFacts, nodes: EmulatedNodes) -> list[str]:
    """The spec's checks in its order; a built-in spec on several nodes adds the checks across them."""
    names = list(spec.checks)
    if spec.source == "built-in" and several_nodes(m, nodes):
        names += [c for c in specs.NETWORK_CHECKS if c not in names]
        names.sort(key=list(specs.CHECKS).index)
    return names


def plan(spec: specs.Spec, quick: bool, m: MachineFacts | None = None, nodes: EmulatedNodes | None = None) -> Plan:
    """The spec's checks that run here, each with its options validated (the machine's defaults,
    under the spec's, under the emulated nodes' layout); the others with why not."""
    m = m or machine()
    nodes = nodes or EmulatedNodes()
    _check_nodes(nodes, m)
    names = check_names(spec, m, nodes)
    if nodes.emulate_nodes and not any(c in specs.LAID_OUT_ON_NODES for c in names):
        raise UsageError(f"--emulate-nodes: acceptance spec {spec.name} has no check that runs on nodes "
                         f"({', '.join(specs.LAID_OUT_ON_NODES)}); add one or leave out --emulate-nodes")
    checks, not_run = [], []
    for name in names:
        why = why_not(name, m, nodes)
        if why is not None:
            not_run.append((name, why))
            continue
        layout = nodes.options() if name in specs.LAID_OUT_ON_NODES else {}
        options = {**defaults(name, m, quick, nodes.emulate_nodes), **spec.checks.get(name, {}), **layout}
        checks.append(PlannedCheck(name, options, specs.validate(spec, name, options)))
    return Plan(checks, not_run, m)


def _check_nodes(nodes: EmulatedNodes, m: MachineFacts) -> None:
    """Emulated nodes this machine can make (before anything runs)."""
    if not nodes.emulate_nodes:
        return
    if m.launcher:
        raise UsageError(f"under {m.launcher} the nodes are the launcher's: leave out --emulate-nodes and its link "
                         "and quota options")
    if m.no_emulation:
        raise UsageError(f"--emulate-nodes: {m.no_emulation}")
    if nodes.node_cpu_quota and m.no_quota:
        raise UsageError(m.no_quota)


# -- the api calls --------------------------------------------------------------------------------------
def run_check(p: PlannedCheck, tag: str, db: str | None) -> list[Any]:
    """Run one check through ``dlscale.api``; its records (failed runs too)."""
    info(f"dlscale accept: {p.check}")
    try:
        return [r for r in _call(p, tag, db) if r is not None]
    except RunFailure as e:
        if e.records:
            return list(e.records)
        if e.run_id:
            from dlscale.store import Store

            with Store.open(db) as s:
                return [s.get(e.run_id)]
        raise


def _call(p: PlannedCheck, tag: str, db: str | None) -> list[Any]:
    from dataclasses import replace

    from dlscale import api

    if p.check == "health":
        from dlscale.accept.nodehealth import xid_history

        return [api.health(tag=tag, db=db, xids_since=xid_history.since(db))]
    if p.check == "inventory":
        return [api.inventory(tag=tag, db=db)]
    command, kind, _ = specs.CHECKS[p.check]
    price = price_of(p.options)
    if command == "micro":
        micro_opts = p.configs[0]
        fields = {k: v for k, v in vars(micro_opts).items() if k in _given_micro_fields(p.options)}
        if p.check in ("gemm", "memory"):
            fields["every_device"] = True
        layout = p.configs[1] if len(p.configs) > 1 else None
        return api.micro(kind, layout=layout, db=db, tag=tag, price=price, **fields)
    if command == "infer":
        return [api.infer(config=replace(p.configs[0], tag=tag, scenario="offline"), db=db, price=price)]
    if command == "serve-bench":
        return [api.serve_bench(config=replace(p.configs[0], tag=tag), db=db, price=price)]
    cfg, layout = p.configs
    if p.check == "scale":
        return api.scale(cfg.model, devices=p.options.get("devices") or [1, 2],
                         layouts=_layouts(p.options.get("layouts")), emulate_nodes=layout.emulate_nodes,
                         link_bandwidth=layout.link_bandwidth, link_latency=layout.link_latency,
                         node_link_bandwidth=layout.node_link_bandwidth, node_cpu_quota=layout.node_cpu_quota,
                         threads_per_rank=layout.threads_per_rank, db=db, price=price,
                         **{**_train_fields(cfg, p.options), "tag": tag})
    cfg = replace(cfg, tag=tag, parallel="none" if p.check == "train_alone" else cfg.parallel)
    if p.check == "train" and cfg.parallel != "none" and cfg.dp_reference is None:
        cfg = replace(cfg, dp_reference=alone_run(tag, db))
    return [api.train(config=cfg, layout=layout, db=db, price=price)]


def alone_run(tag: str, db: str | None) -> str | None:
    """The run id of this acceptance's train_alone run, recorded ok: the data-parallel efficiency's reference
    (None where it has none, or this rank cannot read the store: the run finds its own, as it says)."""
    from dlscale.store import Store

    try:
        with Store.open(db, create=False) as store:
            runs = store.query(tag=tag, kind="train", status="ok")
    except UsageError:
        return None
    alone = [r for r in runs if (r.config or {}).get("parallel") == "none"]
    return alone[0].run_id if alone else None


def price_of(options: dict[str, Any]) -> Any:
    """A check's price (``price_per_hour``, or ``system`` of ``systems_file``, as the commands take
    them: ``cost.resolve``), None without one: its runs record their cost figures at it."""
    from dlscale import cost
    from dlscale.sweep.fields import COST

    return cost.resolve(**{COST[k].field: options[k] for k in COST if k in options})


def _given_micro_fields(options: dict[str, Any]) -> set[str]:
    """The MicroOptions/CollectiveOptions fields the check's options set (sweep names -> config fields)."""
    from dlscale.sweep.fields import MICRO

    names = {MICRO[k].field for k in options if k in MICRO and MICRO[k].config == "micro"}
    return names | {"iters"} if "reps" in names else names  # the kernels' reps is the collectives' iters


def _train_fields(cfg: Any, options: dict[str, Any]) -> dict[str, Any]:
    from dlscale.sweep.fields import TRAIN

    return {TRAIN[k].field: getattr(cfg, TRAIN[k].field) for k in options if k in TRAIN and TRAIN[k].config == "train"
            and k != "model"}


def _layouts(v: Any) -> list[tuple[int, int]]:
    from dlscale.distributed.ladder import parse_layouts

    return parse_layouts(",".join(map(str, v)) if isinstance(v, list) else v) if v else []
