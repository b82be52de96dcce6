"""The step model of ``dlscale predict``: one data-parallel training step, from a one-device run.

A step is compute (forward, backward, optimizer, plus host-to-device copy and data wait) measured
on one device, and the all-reduce of DDP's gradient buckets, which runs one bucket at a time while
backward goes on; only what is left of the last all-reduce after backward ends adds to the step.
Each bucket's all-reduce time comes from the alpha-beta model of its link level
(``predict.links``). docs/METRICS.md ("Prediction (`dlscale predict`): the step model") derives
every equation. Pure arithmetic: torch is imported only by ``gradient_bytes``, which builds the
model on the meta device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from dlscale.analysis.formulas import scaling_efficiency, speedup
from dlscale.errors import UsageError
from dlscale.predict import links
from dlscale.predict.links import Link

BUCKET_CAP = 25 * 2**20  # DistributedDataParallel(bucket_cap_mb=25), the default
FIRST_BUCKET = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the first bucket is closed early
GRAD_BYTES_PER_ELEMENT = 4  # parameters stay fp32 under autocast (bf16/fp16), so their gradients do too
ALGORITHMS = ("ring", "hierarchical")
PHASES = ("forward", "backward", "optimizer", "h2d", "data_wait")
FROM_HINT = ("`--from RUN` must be an ok one-device `dlscale train` run "
             "(`dlscale train MODEL --breakdown-steps 10` also gives the phase split)")


@dataclass(frozen=True)
class Compute:
    """One rank's compute per step, in seconds; ``other_s`` is host-to-device copy plus data wait."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    other_s: float = 0.0
    notes: tuple[str, ...] = ()  # assumptions made while deriving it (e.g. no phase breakdown)

    def __post_init__(self) -> None:
        times = (self.forward_s, self.backward_s, self.optimizer_s, self.other_s)
        if not all(math.isfinite(t) and t >= 0 for t in times) or self.forward_s + self.backward_s <= 0:
            raise UsageError(f"compute times must be finite, >= 0 s, with forward + backward > 0; got {times}")

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s + self.other_s

    def scaled(self, factor: float) -> "Compute":
        """Every phase ``factor`` times longer (compute contention among ranks on one host)."""
        return replace(self, forward_s=self.forward_s * factor, backward_s=self.backward_s * factor,
                       optimizer_s=self.optimizer_s * factor, other_s=self.other_s * factor)


def _measured_step_s(rec: Any) -> float:
    """The measured window's mean step time: ``step_time_mean``, else samples per step / throughput."""
    m = rec.metrics
    if m.get("step_time_mean"):
        return float(m["step_time_mean"])
    if m.get("samples_per_step") and m.get("throughput"):
        return float(m["samples_per_step"]) / float(m["throughput"])
    raise UsageError(f"run {rec.run_id} has neither step_time_mean nor throughput and samples_per_step: {FROM_HINT}")


def compute_from_record(rec: Any) -> Compute:
    """The compute of one step from a one-device train record (a ``RunRecord`` or its dict).

    The phases are timed on instrumented steps (a device sync after each phase), which run slower
    than the measured window; they are scaled together so that they add up to the measured mean
    step time, keeping their proportions. Without them the step is split 1/3 forward, 2/3 backward
    (a layer's backward costs about twice its forward) with no optimizer time, and ``notes`` says so.
    """
    if isinstance(rec, dict):
        from dlscale.record import RunRecord

        rec = RunRecord.from_dict(rec)
    world = int(rec.metrics.get("world_size") or rec.config.get("world_size") or 1)
    if rec.kind != "train" or rec.status != "ok" or world != 1:
        raise UsageError(f"run {rec.run_id} is a {rec.status} {rec.kind} run on {world} rank(s): {FROM_HINT}")
    step = _measured_step_s(rec)
    phases = {p: rec.metrics.get(f"phase_{p}") for p in PHASES}
    if any(phases[p] is None for p in ("forward", "backward", "optimizer")):
        return Compute(step / 3, 2 * step / 3, 0.0, notes=(
            f"run {rec.run_id} has no phase breakdown: its step of {step:.6g} s is split as forward 1/3, "
            "backward 2/3, optimizer 0 (an assumption; `dlscale train MODEL --breakdown-steps 10` measures it)",))
    timed = sum(float(v or 0.0) for v in phases.values())
    k = step / timed
    other = (float(phases["h2d"] or 0.0) + float(phases["data_wait"] or 0.0)) * k
    return Compute(float(phases["forward"]) * k, float(phases["backward"]) * k, float(phases["optimizer"]) * k,
                   other, notes=(f"phases of run {rec.run_id} ({timed:.6g} s on instrumented steps) scaled by "
                                 f"{k:.4f} to its measured step of {step:.6g} s",))


def gradient_bytes(model_name: str, precision: str, shape: dict[str, Any] | None = None) -> list[int]:
    """Bytes of each trainable parameter's gradient, in the order backward produces them.

    ``shape`` holds the recorded TrainConfig fields that size the model (``model_config``, ``max_table_rows``).

    DDP expects gradients in the reverse of ``model.parameters()`` order (the layers run backwards)
    and rebuilds its buckets in that ready order after the first step. The model is built on the
    meta device (shapes only, no memory). Gradients are 4 bytes per element at every precision:
    dlscale's bf16/fp16 use autocast, which keeps the parameters, hence their gradients, in fp32.
    """
    import torch

    from dlscale import workloads
    from dlscale.config import PRECISIONS

    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    from dlscale.config import TrainConfig

    w = workloads.get(model_name)
    cfg = TrainConfig(model=model_name, **(shape or {}))  # the shape fields that size the model (llm configs, tables)
    with torch.device("meta"):
        model = w.build(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    return [GRAD_BYTES_PER_ELEMENT * p.numel() for p in reversed(params)]


def ddp_buckets(grad_bytes: list[int], bucket_cap: int = BUCKET_CAP, first_bucket: int = FIRST_BUCKET) -> list[int]:
    """DDP's gradient buckets (bytes, in launch order) for gradients in backward order.

    As ``torch.distributed._compute_bucket_assignment_by_size``: each gradient joins the open
    bucket, and the bucket closes as soon as it holds at least its cap (the first bucket's cap is
    ``first_bucket``, later ones ``bucket_cap``). So a bucket can pass its cap by its last
    gradient, and a gradient larger than the cap that arrives at an empty bucket is alone in it.
    """
    if bucket_cap <= 0 or first_bucket <= 0:
        raise UsageError(f"bucket caps must be > 0 bytes, got first {first_bucket}, then {bucket_cap}")
    out, size, cap = [], 0, first_bucket
    for nbytes in grad_bytes:
        size += nbytes
        if size >= cap:
            out.append(size)
            size, cap = 0, bucket_cap
    if size:
        out.append(size)
    return out


def _check_layout(nodes: int, per_node: int, intra: Link | None, inter: Link | None) -> None:
    if nodes < 1 or per_node < 1:
        raise UsageError(f"layout {nodes}x{per_node}: give NODESxDEVICES_PER_NODE with both >= 1 (e.g. 2x4)")
    if per_node > 1 and intra is None:
        raise UsageError(f"layout {nodes}x{per_node} has {per_node} devices per node: give --intra LINK "
                         "or record `dlscale micro collectives` on one node")
    if nodes > 1 and inter is None:
        raise UsageError(f"layout {nodes}x{per_node} spans {nodes} nodes: give --inter LINK "
                         "or record `dlscale micro collectives` across nodes")


def allreduce_s(nbytes: float, nodes: int, per_node: int, intra: Link | None, inter: Link | None,
                algorithm: str = "ring") -> float:
    """Seconds to all-reduce ``nbytes`` over ``nodes`` x ``per_node`` ranks (docs/METRICS.md).

    One node: a ring on ``intra``. Several nodes, ``ring``: one flat ring over all ranks, paced by
    its slowest hop; the ranks of a node are neighbours in the ring and share one inter-node link
    (one NIC per node), which carries the ring's one hop out of the node, so alpha is the larger
    and bandwidth the smaller of the two levels. ``hierarchical``: a reduce-scatter and an
    all-gather within each node (together a ring all-reduce on ``intra``), and between them each
    local rank's ring all-reduce of 1/per_node of the buffer across nodes; the per_node rings run
    at once through the node's one NIC, so together they move the whole buffer at its bandwidth.
    """
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown all-reduce algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    _check_layout(nodes, per_node, intra, inter)
    if nodes == 1:
        return links.ring_allreduce_s(intra, nbytes, per_node) if per_node > 1 else 0.0
    if per_node == 1:
        return links.ring_allreduce_s(inter, nbytes, nodes)
    if algorithm == "hierarchical":
        return links.ring_allreduce_s(intra, nbytes, per_node) + links.ring_allreduce_s(inter, nbytes, nodes)
    hop = Link(name=f"slowest hop of {intra.name} and {inter.name}", alpha_s=max(intra.alpha_s, inter.alpha_s),
               bandwidth=min(intra.bandwidth, inter.bandwidth),
               source="flat ring across nodes: the larger alpha, the smaller bandwidth")
    return links.ring_allreduce_s(hop, nbytes, nodes * per_node)


@dataclass
class StepPrediction:
    """A predicted step: seconds, and the share of it with an all-reduce in flight.

    ``schedule``: one dict per bucket in launch order with ``bytes``, ``ready_s``, ``start_s``,
    ``end_s``, ``allreduce_s``; times count from the start of forward.
    """

    step_s: float
    compute: Compute
    comm_s: float  # sum of the buckets' all-reduce times (all of it in flight, hidden or not)
    exposed_s: float  # what the step waits for after backward: max(0, end of the last all-reduce - backward's end)
    comm_fraction: float
    schedule: list[dict[str, float]] = field(default_factory=list)


def host_cost_s(nbytes: float, ranks: int, host_bandwidth: float | None) -> float:
    """The host's own per-byte cost of an all-reduce under load: ``2(p-1)/p * S / beta_host``.

    On CPU hosts the all-reduce's copies and reductions run on the cores that run backward; under
    that load they add to the transfer rather than hide behind it. ``host_bandwidth`` None: no cost.
    """
    if not host_bandwidth or ranks < 2:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / host_bandwidth


def predict_step(compute: Compute, buckets: list[int], nodes: int, per_node: int, intra: Link | None,
                 inter: Link | None, contention: float = 1.0, algorithm: str = "ring",
                 host_bandwidth: float | None = None) -> StepPrediction:
    """One data-parallel step on ``nodes`` x ``per_node`` ranks (docs/METRICS.md, the step model).

    Compute runs ``contention`` times slower than measured (ranks sharing a host's cores and
    memory; 1.0 = none). Bucket i is ready once backward has produced the gradients through it,
    backward's time spread evenly over the gradient bytes; all-reduces run one at a time in launch
    order. One rank: the step is the compute and nothing is communicated.
    """
    if not (math.isfinite(contention) and contention > 0):
        raise UsageError(f"contention must be a finite factor > 0 (1.0 = none), got {contention}")
    _check_layout(nodes, per_node, intra, inter)
    c = compute.scaled(contention)
    backward_end = c.forward_s + c.backward_s
    total = sum(buckets)
    schedule: list[dict[str, float]] = []
    end, done = 0.0, 0
    if nodes * per_node > 1 and total > 0:
        for nbytes in buckets:
            done += nbytes
            ready = c.forward_s + c.backward_s * done / total
            t = allreduce_s(nbytes, nodes, per_node, intra, inter, algorithm)
            t += host_cost_s(nbytes, nodes * per_node, host_bandwidth)
            start = max(ready, end)
            end = start + t
            schedule.append({"bytes": nbytes, "ready_s": ready, "start_s": start, "end_s": end, "allreduce_s": t})
    exposed = max(0.0, end - backward_end) if schedule else 0.0
    comm = sum(b["allreduce_s"] for b in schedule)
    step = c.step_s + exposed
    return StepPrediction(step, c, comm, exposed, comm / step, schedule)


def _contention_for(contention: dict[int, float] | float, per_host: int) -> float:
    if not isinstance(contention, dict):
        return float(contention)
    if per_host not in contention:
        if per_host == 1:
            return 1.0  # the measured run is one rank alone on its host
        raise UsageError(f"no contention factor for {per_host} ranks per host (have {sorted(contention)}); "
                         "give one for every devices-per-node in the layouts, or 1.0 for none")
    return float(contention[per_host])


def predict_layouts(compute: Compute, buckets: list[int], batch_per_rank: int, layouts: list[tuple[int, int]],
                    intra: Link | None, inter: Link | None, contention: dict[int, float] | float = 1.0,
                    loader_rate: float | None = None, algorithm: str = "ring",
                    shared_host: bool = False, host_bandwidth: float | None = None) -> list[dict[str, Any]]:
    """One row per layout (nodes, per_node): predicted throughput, speed-up, efficiencies, communication.

    Throughput is ``p * batch / step``, capped at ``p * loader_rate`` (each rank's input pipeline)
    when given. Speed-up and efficiency are against the predicted 1x1; intra-node efficiency is
    1xg against 1x1, inter-node efficiency nxg against n times 1xg (``analysis.formulas``, as for
    measured ladders). ``contention``: one factor, or a factor per ranks-per-host. ``shared_host``:
    the nodes are emulated on one machine, so every rank of the layout shares its cores (ranks per
    host = nodes x per_node rather than per_node). ``host_bandwidth``: the all-reduce's own per-byte
    cost on a loaded CPU host (``host_cost_s``), added to every bucket; None for none.
    """
    if batch_per_rank <= 0 or (loader_rate is not None and not loader_rate > 0):
        raise UsageError(f"batch per rank must be > 0 and loader rate > 0 samples/s, got {batch_per_rank}, "
                         f"{loader_rate}")

    def point(n: int, g: int) -> tuple[StepPrediction, float, bool, float]:
        f = _contention_for(contention, n * g if shared_host else g)
        pred = predict_step(compute, buckets, n, g, intra if g > 1 else None, inter if n > 1 else None, f, algorithm,
                            host_bandwidth)
        x = n * g * batch_per_rank / pred.step_s
        cap = n * g * loader_rate if loader_rate is not None else math.inf
        return pred, min(x, cap), x > cap, f

    base = point(1, 1)[1]
    rows = []
    for n, g in layouts:
        pred, x, input_bound, f = point(n, g)
        node_x = point(1, g)[1] if n > 1 else x
        rows.append({
            "layout": f"{n}x{g}", "nodes": n, "per_node": g, "devices": n * g, "throughput": x,
            "speedup": speedup(x, base), "efficiency": scaling_efficiency(x, base, n * g),
            "intra_node_efficiency": scaling_efficiency(node_x, base, g),
            "inter_node_efficiency": scaling_efficiency(x, node_x, n),
            "comm_fraction": pred.comm_fraction, "comm_time": pred.comm_s, "exposed_comm": pred.exposed_s,
            "step_time": pred.step_s, "contention": f, "ranks_per_host": n * g if shared_host else g,
            "input_bound": input_bound, "algorithm": algorithm,
            "buckets": len(pred.schedule), "schedule": pred.schedule,
        })
    return rows


def fit_host_bandwidth(measured_comm_s: float, buckets: list[int], per_node: int, intra: Link) -> float | None:
    """``beta_host`` from a measured one-node run of ``per_node`` ranks: the bytes its ring moved per
    step over the in-training all-reduce time the link alone does not explain,
    ``sum 2(g-1)/g S_i / (c_measured - sum T_i)``; None when the link explains all of it."""
    if per_node < 2 or not buckets:
        return None
    isolated = sum(allreduce_s(b, 1, per_node, intra, None) for b in buckets)
    extra = measured_comm_s - isolated
    if extra <= 0:
        return None
    return sum(2 * (per_node - 1) / per_node * b for b in buckets) / extra
