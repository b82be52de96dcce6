"""One rank of ``dlscale micro links`` (the ``links`` family of ``distributed.job``): measure every
pair of nodes in turn, then (rank 0) record the run. Which pairs and what each figure means is
``micro/links.py``.

Per (pair, size), as ``micro collectives`` times a collective: the pair's two ranks (each node's
local rank 0) exchange once, timed, and the slower end's time sets how many more warm-up
exchanges and timed iterations fit in ``--budget`` seconds (at most ``--warmup`` and ``--iters``,
at least one iteration); a barrier of every rank; the iterations back to back, each timed on both
ends (a device synchronisation closes it on GPUs); then the receive buffer is poisoned (-1) and
one more exchange is compared element for element with the peer's exact values. Every other rank
waits in the barrier and the sums that gather the times, so only the pair's links carry data.
"""

from __future__ import annotations

import time
from typing import Any

from dlscale.micro.collectives import parse_sizes, values
from dlscale.micro.links import (UNITS, LinkOptions, all_pairs, device_for, node_links, pair_row, shaped_rates,
                                 summarize, two_node_warning)


class WrongLinkData(RuntimeError):
    pass


def leaders(world: list[tuple[int, int, str]]) -> dict[int, int]:
    """{node: the rank that measures its link}: the lowest rank of each node, from (rank, node, host) of every rank."""
    out: dict[int, int] = {}
    for rank, node, _ in sorted(world):
        out.setdefault(node, rank)
    return out


def node_hosts(world: list[tuple[int, int, str]]) -> dict[str, str]:
    """{node: its host name} where the nodes are different hosts (real nodes; emulated ones share one)."""
    hosts = {node: host for _, node, host in sorted(world)}
    return {str(k): h for k, h in sorted(hosts.items())} if len(set(hosts.values())) == len(hosts) > 1 else {}


def sweep(opts: LinkOptions, rank: int, nodes: dict[int, int], device: Any, record: Any | None = None) -> list[dict]:
    """Every (pair, size) in turn; the rows (complete on rank 0)."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def reduce(xs: list[float], op: Any = dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(xs, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    rows: list[dict[str, Any]] = []
    if record is not None:
        record.raw["rows"] = rows  # kept on the record if the sweep fails part-way
    for i, j in all_pairs(len(nodes)):
        ends = (nodes[i], nodes[j])
        peer = ends[1] if rank == ends[0] else ends[0] if rank == ends[1] else None
        for size in parse_sizes(opts.sizes):
            count = size // 4
            ex = Exchange(rank, peer, count, device, sync) if peer is not None else None
            first = ex.once() if ex else 0.0
            fit = int(opts.budget / reduce([first], dist.ReduceOp.MAX)[0])
            for _ in range(min(opts.warmup - 1, fit) if ex else 0):
                ex.once()
            n_iters = max(1, min(opts.iters, fit))
            dist.barrier()
            times = [ex.once() for _ in range(n_iters)] if ex else [0.0] * n_iters
            wrong = ex.wrong() if ex else 0
            summed = reduce([*times, float(wrong)])  # the two ends' figures (every other rank adds 0)
            rows.append(pair_row(i, j, count * 4, [t / 2 for t in summed[:-1]], int(summed[-1])))
            del ex
    return rows


class Exchange:
    """One end of a pair: send this rank's values to the peer while receiving the peer's."""

    def __init__(self, rank: int, peer: int, count: int, device: Any, sync: Any):
        import torch

        self.peer, self.count, self.device, self.sync = peer, count, device, sync
        self.send = values(rank, 0, count, device)
        self.recv = torch.empty(count, dtype=torch.float32, device=device)

    def once(self) -> float:
        """One exchange, both directions at once; its seconds on this end."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.isend, self.send, self.peer), dist.P2POp(dist.irecv, self.recv, self.peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        self.sync()
        return time.perf_counter() - t0

    def wrong(self) -> int:
        """Elements received that differ from the peer's exact values (after poisoning the buffer)."""
        self.recv.fill_(-1)
        self.once()
        return int((self.recv != values(self.peer, 0, self.count, self.device)).sum().item())


def body(opts: LinkOptions, rank: int, nodes: dict[int, int], device: Any, layout: Any):
    from dlscale.harness.runner import Outcome

    def run(rec: Any) -> Any:
        rows = sweep(opts, rank, nodes, device, rec)
        links = node_links(rows, len(nodes))
        if layout.emulate_nodes:
            shaped_rates(links, layout.node_rate)
        metrics = summarize(links, rows, len(nodes))
        if metrics["wrong"]:
            bad = sorted({f"{r['src_node']}-{r['dst_node']}" for r in rows if r["wrong"]})
            raise WrongLinkData(f"{metrics['wrong']} wrong element(s) received between nodes {', '.join(bad)}: the "
                                "data that crossed the link differs from what was sent")
        return Outcome(metrics=metrics, units=dict(UNITS), raw={"rows": rows, "links": links},
                       warnings=two_node_warning(len(nodes)))

    return run


def run_rank(spec: Any, env: Any) -> Any:
    """This rank's part; rank 0 records the run and returns the record (the others None)."""
    import torch.distributed as dist

    from dlscale.distributed.worker import rank_layout_config
    from dlscale.errors import UsageError
    from dlscale.micro.coll_worker import join, record

    opts, layout = LinkOptions(**spec.config), spec.layout_config
    backend, device = join(env, layout, device_for(opts.device, layout.launch_backend))
    import socket

    world: list[Any] = [None] * env.world_size
    dist.all_gather_object(world, (env.rank, env.node_rank, socket.gethostname().split(".")[0]))
    nodes = leaders(world)
    if len(nodes) < 2:
        raise UsageError("micro links measures the links between nodes and this job has one node; give "
                         "--emulate-nodes K (K >= 2) or run it on several nodes (--nnodes, srun, mpirun)")
    if env.rank != 0:
        sweep(opts, env.rank, nodes, device)
        return None
    config = {"sizes": opts.sizes, "warmup": opts.warmup, "iters": opts.iters, "budget_s": opts.budget,
              "type": "float", "device": device.type, "pairs": "all",
              "node_ranks": {str(k): r for k, r in nodes.items()}, "node_hosts": node_hosts(world),
              **rank_layout_config(env, backend, layout)}
    return record(spec, "links", config, opts.tag, body(opts, 0, nodes, device, layout))
