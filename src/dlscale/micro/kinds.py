"""Run microbenchmarks by kind: each kind's own options, one record per kind (``api.micro``).

Every kind reads its own set of options (``READS``): an option a kind does not read is a usage
error naming the kind and what it does read, never silently ignored. Kernel and memory kinds run
in this process through the micro harness; ``collectives``, ``links`` and ``burnin`` run on every
rank of a ``Layout`` through the one job module (``distributed.job``).
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import RunFailure, UsageError
from dlscale.format import fmt_count
from dlscale.log import info

COMMON = ("device", "warmup", "reps", "min_duration_s", "case_budget_s", "seed", "tag")
KERNEL = ("precisions", "full", "max_gflop", "shapes", "cpu_ghz", "cache")
READS: dict[str, tuple[str, ...]] = {
    "gemm": (*COMMON, *KERNEL, "every_device"),
    "conv": (*COMMON, *KERNEL, "channels_last"),
    "rnn": (*COMMON, *KERNEL),
    "memory": (*COMMON, "mem_mib", "every_device"),
    "p2p": (*COMMON, "mem_mib"),
    "collectives": ("sizes", "ops", "warmup", "iters", "min_duration_s", "budget", "min_busbw", "plant_wrong", "device",
                    "tag"),
    "links": ("sizes", "warmup", "iters", "budget", "device", "tag"),
    "burnin": ("duration", "gemm_size", "gemm_chain", "llm_steps", "seed", "device", "tag"),
}
RANKED = ("collectives", "links", "burnin")  # kinds that run as the ranks of a Layout (the others in this process)
ALL_ORDER = ("gemm", "conv", "rnn", "memory", "p2p", "collectives")  # links needs several nodes: not in all
CPU_ALL_SIZES = "8:1M"  # collectives in `micro all` on a CPU: small sizes (sizes= for more)


# `all` runs every kind with the options they share or that select sizes; a kind's own files and
# switches (shapes, channels_last, ops, budget) belong to that kind's own command.
READS_ALL = ("device", "precisions", "warmup", "reps", "min_duration_s", "full", "max_gflop", "cpu_ghz",
             "case_budget_s", "mem_mib", "cache", "sizes", "min_busbw", "seed", "tag")


def options_of(kind: str) -> tuple[str, ...]:
    """The option fields a kind reads."""
    return READS_ALL if kind == "all" else READS[kind]


def check_options(kind: str, options: dict[str, Any]) -> None:
    unread = sorted(set(options) - set(options_of(kind)))
    if unread:
        raise UsageError(f"micro {kind} does not read {', '.join(unread)}; it reads "
                         f"{', '.join(options_of(kind))}")


def kernel_options(kind: str, options: dict[str, Any]) -> Any:
    """The MicroOptions of a kernel/memory kind from the options it reads (``iters`` is ``reps``)."""
    from dlscale.micro.base import MicroOptions

    fields = {k: v for k, v in options.items() if k in READS[kind] and v is not None}
    if isinstance(fields.get("precisions"), str):
        fields["precisions"] = tuple(p.strip() for p in fields["precisions"].split(",") if p.strip())
    elif "precisions" in fields:
        fields["precisions"] = tuple(fields["precisions"])
    return MicroOptions(**fields)


def collective_options(options: dict[str, Any]) -> Any:
    from dlscale.micro.collectives import CollectiveOptions

    return CollectiveOptions(**{k: v for k, v in options.items() if k in READS["collectives"] and v is not None})


def link_options(options: dict[str, Any]) -> Any:
    from dlscale.micro.links import LinkOptions

    return LinkOptions(**{k: v for k, v in options.items() if k in READS["links"] and v is not None})


def burnin_options(options: dict[str, Any]) -> Any:
    from dlscale.micro.burnin import BurninOptions

    return BurninOptions(**{k: v for k, v in options.items() if k in READS["burnin"] and v is not None})


def ranked_options(kind: str, options: dict[str, Any]) -> Any:
    """The typed options of a kind that runs as ranks (``iters`` is the kernels' ``reps``)."""
    opts = {("iters" if k == "reps" else k): v for k, v in options.items()}
    return {"collectives": collective_options, "links": link_options, "burnin": burnin_options}[kind](opts)


def run_kinds(kind: str, options: dict[str, Any], layout: Any, db: str | None, price: Any = None) -> list[Any]:
    """Run ``kind`` (or every kind for ``all``); the records. A failed kind is recorded, the others
    still run, then ``RunFailure`` names every failure."""
    from dlscale.store import Store

    options = dict(options)
    if "iters" in options and kind not in RANKED:
        options.setdefault("reps", options.pop("iters"))
    check_options(kind, options)
    kinds = list(ALL_ORDER) if kind == "all" else [kind]
    plans = _plan(kinds, kind, options, layout)  # every config validated before any work
    Store.open(db).close()  # an unwritable database is a usage error before any work
    recs, failures = [], []
    for k, cfg in plans:
        try:
            rec = _run_one(k, cfg, layout, db, price)
        except RunFailure as e:  # recorded as failed: go on with the next kind
            failures.append(str(e))
            rec = _get(db, e.run_id)
        if rec is not None:
            recs.append(rec)
            if rec.status != "ok" and not any(rec.run_id in f for f in failures):
                failures.append(f"run {rec.run_id} failed: {rec.error}")
    if failures:
        raise RunFailure("; ".join(failures), records=recs)
    return recs


def _plan(kinds: list[str], asked: str, options: dict[str, Any], layout: Any) -> list[tuple[str, Any]]:
    from dlscale.layout import Layout

    plans = []
    for k in kinds:
        if k == "collectives":
            opts = dict(options)
            if asked == "all" and opts.get("sizes") is None and not _has_cuda():
                opts["sizes"] = CPU_ALL_SIZES
            if "reps" in opts:
                opts.setdefault("iters", opts.pop("reps"))
            plans.append((k, collective_options(opts)))
        elif k == "links":
            plans.append((k, link_options(options)))
            _check_several_nodes(layout)
        elif k == "burnin":
            plans.append((k, burnin_options(options)))
        else:
            plans.append((k, kernel_options(k, options)))
    if layout is not None and layout != Layout() and asked not in (*RANKED, "all"):
        raise UsageError(f"micro {asked} runs in one process; the layout options are for micro collectives, links "
                         "and burnin")
    kernel = [cfg for k, cfg in plans if k not in RANKED]
    if kernel:  # a precision the device cannot run stops here, before any work
        from dlscale.harness import device as dev
        from dlscale.micro.harness import check_cache

        target = dev.select_device(kernel[0].device)
        for p in kernel[0].precisions:
            dev.check_precision(p, target)
        for cfg in kernel:
            check_cache(cfg, target)
    return plans


def _run_one(kind: str, cfg: Any, layout: Any, db: str | None, price: Any = None) -> Any:
    if kind in RANKED:
        return run_ranked(kind, cfg, layout, db, price)
    from dlscale import micro
    from dlscale.micro.harness import run_recorded
    from dlscale.store import Store

    bench = micro.get(kind)
    if kind == "p2p":
        why = bench.unavailable()
        if why:
            info(why)  # not a failure: nothing is recorded
            return None
    info(f"dlscale micro {kind}: {bench.title}")
    with Store.open(db) as store:
        return run_recorded(bench, cfg, store, price=price)


def run_ranked(kind: str, cfg: Any, layout: Any, db: str | None, price: Any = None) -> Any:
    """Every rank of the layout runs the kind (collectives, links, burnin); rank 0's record (None off node 0)."""
    from dlscale.distributed.job import done_elsewhere, run_job
    from dlscale.layout import Layout

    layout = default_collectives_layout(layout or Layout())
    what = f"for {cfg.duration:g} s" if kind == "burnin" else f"sizes {cfg.sizes}"
    info(f"dlscale micro {kind}: {fmt_count(layout.world_size, 'rank')} ({layout.nproc_per_node} per node, "
         f"{fmt_count(layout.nodes, 'node')}{', emulated' if layout.emulate_nodes else ''}), {what}")
    config = cfg.to_dict()
    if kind == "links":  # over gloo its exchanges use CPU tensors: the launcher places the ranks by that
        from dlscale.micro.links import device_for

        config["device"] = device_for(cfg.device, layout.launch_backend)
    rec = run_job(kind, config, layout, db, price)
    if rec is None:
        info(done_elsewhere(layout))
    return rec


def _check_several_nodes(layout: Any) -> None:
    """micro links needs two nodes at least; under an external launcher the ranks find out."""
    from dlscale.distributed.env import launcher_of

    if launcher_of() is None and (layout is None or layout.nodes < 2):
        raise UsageError("micro links measures the links between nodes; give --emulate-nodes K (K >= 2) or "
                         "--nnodes K with --node-rank on each node (or start it under srun/mpirun on several nodes)")


def default_collectives_layout(layout: Any) -> Any:
    """Collectives (and links, burnin) always run as ranks: under an external launcher (srun, mpirun, torchrun) its world,
    else dlscale's launcher with the layout given (two ranks here, or one per GPU, when nothing says more)."""
    from dlscale.distributed.env import launcher_of

    if launcher_of() is not None:
        return layout
    if layout.world_size == 1 and not layout.emulate_nodes and not layout.force:
        return layout.with_(nproc_per_node=_devices_here() or 2, force=True)
    return layout.with_(force=True)


def _devices_here() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _has_cuda() -> bool:
    return _devices_here() > 0


def _get(db: str | None, run_id: str | None) -> Any:
    if not run_id:
        return None
    from dlscale.store import Store

    with Store.open(db) as s:
        return s.get(run_id)
