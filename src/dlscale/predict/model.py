"""The step model of ``dlscale predict``: one data-parallel training step, from a one-device run.

A step is compute (forward, backward, optimizer, plus host-to-device copy and data wait) measured
on one device, or derived from a published figure, and the all-reduce of DDP's gradient buckets
(``predict.grads``), which runs one bucket at a time while backward goes on. Backward pays for
that overlap: while an all-reduce is in flight it runs at ``1 - overlap_cost`` of its speed (the
collective's kernels take SMs and memory bandwidth from it). What is left of the last all-reduce
after backward ends adds to the step. Each bucket's all-reduce time comes from the alpha-beta
model of its link level (``predict.links``). docs/METRICS.md ("Prediction (`dlscale predict`):
the step model") derives every equation. Pure arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from dlscale.analysis.formulas import scaling_efficiency, speedup
from dlscale.errors import UsageError
from dlscale.predict import links
from dlscale.predict.grads import Bucket
from dlscale.predict.links import Link

ALGORITHMS = ("ring", "hierarchical")
PHASES = ("forward", "backward", "optimizer", "h2d", "data_wait")
FROM_HINT = ("`--from RUN` must be an ok one-device `dlscale train` run "
             "(`dlscale train MODEL --breakdown-steps 10` also gives the phase split) or a one-device figure "
             "brought in by `dlscale import`")
BACKWARD_RATIO = 2.0  # a layer's backward costs about twice its forward (input and weight gradients)


@dataclass(frozen=True)
class Compute:
    """One rank's compute per step, in seconds; ``other_s`` is host-to-device copy plus data wait."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    other_s: float = 0.0
    notes: tuple[str, ...] = ()  # assumptions made while deriving it (e.g. no phase breakdown)
    split: str = "measured phases"  # where the phase split came from ("assumed: ..." when no phases)

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

    def to_dict(self) -> dict[str, Any]:
        return {"forward_s": self.forward_s, "backward_s": self.backward_s, "optimizer_s": self.optimizer_s,
                "other_s": self.other_s, "split": self.split}


def _measured_step_s(rec: Any) -> float:
    """The one-device step: ``step_time_mean``, else samples per step / throughput; for an imported
    figure, its per-device batch in the figure's unit (images or samples) / throughput."""
    m, c = rec.metrics, rec.config
    if m.get("step_time_mean"):
        return float(m["step_time_mean"])
    if m.get("samples_per_step") and m.get("throughput"):
        return float(m["samples_per_step"]) / float(m["throughput"])
    if rec.imported and m.get("throughput"):
        if c.get("sample_unit", "images") not in ("images", "samples"):
            raise UsageError(f"run {rec.run_id} is a published figure in {c['sample_unit']}/s: its step needs the "
                             f"{c['sample_unit']} per device step, which an imported row does not give")
        if not c.get("batch_size"):
            raise UsageError(f"run {rec.run_id} is a published figure without a batch size: the step is batch / "
                             "throughput; import it with a batch_size column")
        return float(c["batch_size"]) / float(m["throughput"])
    raise UsageError(f"run {rec.run_id} has neither step_time_mean nor throughput and samples_per_step: {FROM_HINT}")


def compute_from_record(rec: Any, backward_ratio: float | None = None) -> Compute:
    """The compute of one step from a one-device train record (a ``RunRecord`` or its dict).

    The phases are timed on instrumented steps (a device sync after each phase), which run slower
    than the measured window; they are scaled together so that they add up to the measured mean
    step time, keeping their proportions. Without them (a run with ``--breakdown-steps 0``, or a
    published figure brought in by ``dlscale import``) the step is split forward : backward =
    1 : ``backward_ratio`` (the model's counted FLOPs; ``BACKWARD_RATIO`` when not counted) with
    no optimizer or input time, and ``notes`` and ``split`` say so.
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
        r, why = (backward_ratio, "counted FLOPs") if backward_ratio else (BACKWARD_RATIO, "a layer's backward "
                                                                           "costs about twice its forward")
        split = f"assumed: forward : backward = 1 : {r:.3g} ({why}), optimizer and input time 0"
        if rec.imported:
            unit = rec.config.get("sample_unit", "images")
            what = (f"run {rec.run_id} is a published figure ({rec.config.get('system') or 'system not named'}: "
                    f"{rec.metrics['throughput']:g} {unit}/s at batch {rec.config['batch_size']} on one device): "
                    f"its step of {step:.6g} s is {split[9:]}")
        else:
            what = (f"run {rec.run_id} has no phase breakdown: its step of {step:.6g} s is {split[9:]} "
                    "(`dlscale train MODEL --breakdown-steps 10` measures it)")
        return Compute(step / (1 + r), step * r / (1 + r), 0.0, notes=(f"{what}; an assumption",), split=split)
    timed = sum(float(v or 0.0) for v in phases.values())
    k = step / timed
    other = (float(phases["h2d"] or 0.0) + float(phases["data_wait"] or 0.0)) * k
    return Compute(float(phases["forward"]) * k, float(phases["backward"]) * k, float(phases["optimizer"]) * k,
                   other, notes=(f"phases of run {rec.run_id} ({timed:.6g} s on instrumented steps) scaled by "
                                 f"{k:.4f} to its measured step of {step:.6g} s",))


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
                algorithm: str = "ring", nics: int = 1) -> float:
    """Seconds to all-reduce ``nbytes`` over ``nodes`` x ``per_node`` ranks (docs/METRICS.md).

    One node: a ring on ``intra`` (at its rate for ``per_node`` GPUs). Several nodes, ``ring``: one
    flat ring over all ranks, paced by its slowest hop; the ranks of a node are neighbours in it
    and the ring's hop out of the node is spread over the node's ``nics`` NICs (one ring per NIC),
    so alpha is the larger of the two levels and bandwidth the smaller of intra and ``nics`` x
    inter. ``hierarchical``: a reduce-scatter and an all-gather within each node (together a ring
    all-reduce on ``intra``), and between them each local rank's ring all-reduce of 1/per_node of
    the buffer across nodes; the per_node rings run at once through the node's ``nics`` NICs, so
    together they move the whole buffer at ``nics`` x inter.
    """
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown all-reduce algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if nics < 1:
        raise UsageError(f"--nics-per-node must be >= 1, got {nics}")
    _check_layout(nodes, per_node, intra, inter)
    if nodes == 1:
        return links.ring_allreduce_s(intra, nbytes, per_node) if per_node > 1 else 0.0
    rails = inter if nics == 1 else Link(f"{nics} x {inter.name}", inter.alpha_s, nics * inter.bandwidth,
                                         f"{nics} NICs per node of {inter.name}")
    if per_node == 1:
        return links.ring_allreduce_s(rails, nbytes, nodes)
    if algorithm == "hierarchical":
        return links.ring_allreduce_s(intra, nbytes, per_node) + links.ring_allreduce_s(rails, nbytes, nodes)
    hop = Link(name=f"slowest hop of {intra.name} and {rails.name}", alpha_s=max(intra.alpha_s, inter.alpha_s),
               bandwidth=min(intra.bandwidth_for(per_node), rails.bandwidth),
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
    overlap_loss_s: float = 0.0  # how much later backward ends for running beside the all-reduces


def host_cost_s(nbytes: float, ranks: int, host_bandwidth: float | None) -> float:
    """The host's own per-byte cost of an all-reduce under load: ``2(p-1)/p * S / beta_host``.

    On CPU hosts the all-reduce's copies and reductions run on the cores that run backward; under
    that load they add to the transfer rather than hide behind it. ``host_bandwidth`` None: no cost.
    """
    if not host_bandwidth or ranks < 2:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / host_bandwidth


def spread(bucket_bytes: list[int]) -> list[Bucket]:
    """Buckets ready as backward's time is spread evenly over their bytes (when nothing better is known)."""
    total, done, out = sum(bucket_bytes), 0, []
    for nbytes in bucket_bytes:
        done += nbytes
        out.append(Bucket(nbytes, done / total if total else 1.0))
    return out


class _Backward:
    """Backward's progress against the wall clock, at ``rate`` of its speed while an all-reduce flies."""

    def __init__(self, start_s: float) -> None:
        self.t, self.done, self.lost = start_s, 0.0, 0.0
        self.flights: list[tuple[float, float, float]] = []  # (start, end, backward's rate), in order

    def fly(self, start: float, end: float, rate: float) -> None:
        self.flights.append((start, end, rate))

    def _rate(self) -> tuple[float, float]:
        """(backward's rate from now, until when it holds)."""
        for start, end, rate in self.flights:
            if start <= self.t < end:
                return rate, end
            if self.t < start:
                return 1.0, start
        return 1.0, math.inf

    def advance(self, to: float) -> float:
        """Run until ``to`` seconds of backward are done; the wall time then."""
        while self.done < to:
            rate, until = self._rate()
            wall = (to - self.done) / rate if rate > 0 else math.inf
            cut = self.t + wall > until  # the rate changes first
            if cut:
                wall = until - self.t
            self.t, self.lost = self.t + wall, self.lost + wall * (1 - rate)
            self.done = min(to, self.done + wall * rate) if cut else to
        return self.t


def predict_step(compute: Compute, buckets: list[Bucket] | list[int], nodes: int, per_node: int,
                 intra: Link | None, inter: Link | None, contention: float = 1.0, algorithm: str = "ring",
                 host_bandwidth: float | None = None, overlap_cost: float = 0.0, nics: int = 1) -> StepPrediction:
    """One data-parallel step on ``nodes`` x ``per_node`` ranks (docs/METRICS.md, the step model).

    Compute runs ``contention`` times slower than measured (ranks sharing a host's cores and
    memory; 1.0 = none). Bucket i is ready once backward has done ``ready_i`` of its work (bytes
    given instead of ``Bucket``s: backward spread evenly over them); all-reduces run one at a
    time in launch order, and none starts before the buckets ahead of it. While one is in flight
    backward runs at ``1 - overlap_cost`` of its speed, and on a CPU host (``host_bandwidth``: each
    bucket's transfer ``W`` takes ``H`` more of the cores' own work, ``host_cost_s``) at ``W / (W +
    H)`` of that: the cores do the all-reduce's work instead. One rank: the step is the compute.
    """
    if not (math.isfinite(contention) and contention > 0):
        raise UsageError(f"contention must be a finite factor > 0 (1.0 = none), got {contention}")
    if not 0.0 <= overlap_cost <= 1.0:
        raise UsageError(f"the overlap cost is the share of backward lost while an all-reduce is in flight: "
                         f"give 0 (free overlap) to 1 (none), got {overlap_cost}")
    _check_layout(nodes, per_node, intra, inter)
    plan = spread(buckets) if buckets and not isinstance(buckets[0], Bucket) else list(buckets)
    c = compute.scaled(contention)
    bwd = _Backward(c.forward_s)
    schedule: list[dict[str, float]] = []
    end, launched = 0.0, 0.0
    if nodes * per_node > 1 and sum(b.nbytes for b in plan) > 0:
        for b in plan:
            launched = max(launched, b.ready)  # DDP launches its buckets in order
            ready = bwd.advance(launched * c.backward_s)
            wire = allreduce_s(b.nbytes, nodes, per_node, intra, inter, algorithm, nics)
            t = wire + host_cost_s(b.nbytes, nodes * per_node, host_bandwidth)
            start = max(ready, end)
            end = start + t
            bwd.fly(start, end, (1.0 - overlap_cost) * (wire / t if t > 0 else 1.0))
            schedule.append({"bytes": b.nbytes, "ready_s": ready, "start_s": start, "end_s": end, "allreduce_s": t})
    backward_end = bwd.advance(c.backward_s)
    exposed = max(0.0, end - backward_end) if schedule else 0.0
    comm = sum(b["allreduce_s"] for b in schedule)
    step = backward_end + exposed + c.optimizer_s + c.other_s
    return StepPrediction(step, c, comm, exposed, comm / step, schedule, bwd.lost)


def _contention_for(contention: dict[int, float] | float, per_host: int) -> float:
    if not isinstance(contention, dict):
        return float(contention)
    if per_host not in contention:
        if per_host == 1:
            return 1.0  # the measured run is one rank alone on its host
        raise UsageError(f"no contention factor for {per_host} ranks per host (have {sorted(contention)}); "
                         "give one for every devices-per-node in the layouts, or 1.0 for none")
    return float(contention[per_host])


@dataclass(frozen=True)
class Loader:
    """The source run's input pipeline: ``rate`` samples/s from ``workers`` loader processes (0: the
    training process decodes) on a host with ``cores`` cores (None: not known).

    The host's cores are shared by every rank on it and their workers: ``host_rate(g)`` is the
    rate per loader slot, ``rate / slots(1)``, times ``slots(g) = min(g * workers, cores - g)``
    (each rank's own process keeps a core), or ``min(g, cores)`` with no workers; ``slots`` >= 1.
    """

    rate: float
    workers: int = 1
    cores: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0) or self.workers < 0 or (self.cores or 1) < 1:
            raise UsageError(f"a loader needs a rate > 0 samples/s, workers >= 0 and cores >= 1; got {self.rate}, "
                             f"{self.workers}, {self.cores}")

    def slots(self, ranks: int) -> int:
        if self.workers == 0:
            return ranks if self.cores is None else min(ranks, self.cores)
        return ranks * self.workers if self.cores is None else max(1, min(ranks * self.workers, self.cores - ranks))

    def host_rate(self, ranks: int) -> float:
        """Samples/s one host delivers to its ``ranks`` ranks together."""
        return self.rate / self.slots(1) * self.slots(ranks)


def predict_layouts(compute: Compute, buckets: list[Bucket] | list[int], batch_per_rank: int,
                    layouts: list[tuple[int, int]], intra: Link | None, inter: Link | None,
                    contention: dict[int, float] | float = 1.0, loader: Loader | None = None,
                    algorithm: str = "ring", shared_host: bool = False, host_bandwidth: float | None = None,
                    overlap_cost: float = 0.0, nics: int = 1) -> list[dict[str, Any]]:
    """One row per layout (nodes, per_node): predicted throughput, speed-up, efficiencies, communication.

    Throughput is ``p * batch / step``, capped at what the hosts' input pipelines deliver
    (``loader``: each host's rate shared by its ranks) when given. Speed-up and efficiency are
    against the predicted 1x1; intra-node efficiency is 1xg against 1x1, inter-node efficiency
    nxg against n times 1xg (``analysis.formulas``, as for measured ladders). ``contention``: one
    factor, or a factor per ranks-per-host. ``shared_host``: the nodes are emulated on one
    machine, so every rank of the layout shares its cores (ranks per host = nodes x per_node
    rather than per_node). ``host_bandwidth``: the all-reduce's own per-byte cost on a loaded CPU
    host (``host_cost_s``), added to every bucket; None for none.
    """
    if batch_per_rank <= 0:
        raise UsageError(f"batch per rank must be > 0, got {batch_per_rank}")

    def point(n: int, g: int) -> tuple[StepPrediction, float, bool, float]:
        per_host, hosts = (n * g, 1) if shared_host else (g, n)
        f = _contention_for(contention, per_host)
        pred = predict_step(compute, buckets, n, g, intra if g > 1 else None, inter if n > 1 else None, f, algorithm,
                            host_bandwidth, overlap_cost, nics)
        x = n * g * batch_per_rank / pred.step_s
        cap = hosts * loader.host_rate(per_host) if loader is not None else math.inf
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
            "overlap_loss": pred.overlap_loss_s, "step_time": pred.step_s, "contention": f,
            "ranks_per_host": n * g if shared_host else g, "input_bound": input_bound, "algorithm": algorithm,
            "buckets": len(pred.schedule), "schedule": pred.schedule,
        })
    return rows
