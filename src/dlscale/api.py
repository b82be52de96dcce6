"""dlscale as a library: one function per command family, each returning run records.

Every ``dlscale`` command is a thin shell over these functions: it parses its options into the
same typed configs, calls the function and prints what comes back. From Python or a notebook::

    from dlscale import api

    rec = api.train(model="resnet18", image_size=64, steps=30)
    rec.metrics["throughput"], rec.units["throughput"]          # samples/s
    recs = api.micro("gemm", precisions=("fp32", "bf16"))
    recs = api.micro("collectives", layout=Layout(emulate_nodes=2, link_bandwidth="1gbit"), sizes="1M:4M")
    ladder = api.scale("resnet18", devices=[1, 2], image_size=64, steps=20)
    preds = api.predict(rec.run_id, [(1, 8), (2, 4)], intra="nvlink4", inter="ib-ndr")

Options are a typed config (``config=TrainConfig(...)``) or its fields as keyword arguments;
several processes are a ``Layout`` (``dlscale.layout``), launched by the one job module
(``dlscale.distributed.job``: torchrun, in place under srun/mpirun, or emulated nodes). Every run
is recorded in the results database (``db``: a path; default ``$DLSCALE_DB``, else
``~/.local/share/dlscale/results.db``) whatever happens. Bad input raises ``UsageError`` before
anything runs; a run that fails is recorded as failed and raises ``RunFailure`` naming its run id.
Progress lines go to stderr (``dlscale.log``; ``DLSCALE_QUIET=1`` silences them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dlscale.cost import as_price
from dlscale.errors import RunFailure, UsageError
from dlscale.format import fmt_count
from dlscale.layout import Layout
from dlscale.log import info

__all__ = ["Layout", "train", "tta", "micro", "scale", "sweep", "predict", "MICRO_KINDS"]

MICRO_KINDS = ("gemm", "conv", "rnn", "memory", "p2p", "collectives", "links", "burnin", "all")


def _launched() -> bool:
    from dlscale.distributed.env import launcher_of

    return launcher_of() is not None


def train(model: str | None = None, *, config: Any = None, layout: Layout | None = None, db: str | None = None,
          on_step: Callable[[str, int, int], None] | None = None, price: Any = None, **options: Any) -> Any:
    """The training-throughput short test; the run's record (None on a node other than 0).

    ``options`` are ``TrainConfig`` fields (batch_size, image_size, precision, steps, ...).
    ``on_step(phase, done, total)`` is called after each step, outside the timed interval.
    ``price``: a price per device-hour (a number, or a ``cost.Price`` from ``cost.resolve``) for the
    cost figures.
    """
    from dlscale.config import TrainConfig

    price = as_price(price)

    cfg = config if config is not None else TrainConfig(model=model, **options)
    layout = layout or Layout()
    if layout.distributed or _launched() or cfg.parallel == "fsdp":  # FSDP needs a process group, even of one
        from dlscale.distributed.job import run_job
        from dlscale.workloads.base import batch_words

        if not _launched():
            how = "every rank alone (no DDP)" if cfg.parallel == "none" else cfg.parallel.upper()
            per_rank = f", {batch_words(cfg).rstrip(', ')} per rank" if batch_words(cfg) else ""
            info(f"dlscale train {cfg.model}: {how} over {fmt_count(layout.world_size, 'rank')} "
                 f"({layout.nproc_per_node} per node, {_where(layout)}){per_rank}")
        return run_job("train", cfg.to_dict(), layout, db, price)
    return _train_here(cfg, db, on_step, price)


def _where(layout: Layout) -> str:
    if layout.emulate_nodes:
        rate = f" at {layout.link_bandwidth}" if layout.link_bandwidth else ""
        return fmt_count(layout.emulate_nodes, "emulated node") + rate
    return fmt_count(layout.nnodes, "node")


def _train_here(cfg: Any, db: str | None, on_step: Any, price: Any) -> Any:
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.store import Store
    from dlscale.system import collect_cached
    from dlscale.train.shorttest import run_short_test

    store = Store.open(db)  # an unwritable database is a usage error before any work
    device = dev.select_device(cfg.device)
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    system = collect_cached()
    from dlscale import workloads
    from dlscale.workloads.base import batch_words, shape_words

    layout = ("channels_last, " if resolved.channels_last else "NCHW, ") if workloads.get(resolved.model).images_in else ""
    info(f"dlscale train {resolved.model}: {batch_words(resolved)}{shape_words(resolved)}, "
         f"{resolved.precision}, {layout}on {device}")
    with store:
        return execute(kind="train", workload=resolved.model, config=resolved.to_dict(), tag=resolved.tag,
                       store=store, system=system, price=price,
                       body=lambda _rec: run_short_test(resolved, device, system, on_step=on_step))


def tta(model: str | None = None, *, config: Any = None, layout: Layout | None = None, db: str | None = None,
        price: Any = None, **options: Any) -> list[Any]:
    """Train to a quality target (top-1 for classifiers, the task's metric for every other family);
    the records of every run, and with ``runs`` > 1 the olympic aggregate last. ``options`` are
    ``TTAConfig`` fields (data, target_top1 or target, ...)."""
    from dataclasses import replace

    from dlscale.tta.config import TTAConfig
    from dlscale.tta.repeats import run_all
    from dlscale.store import Store

    layout = layout or Layout()
    cfg = config if config is not None else TTAConfig(model=model, world_size=layout.world_size, **options)
    if cfg.world_size != layout.world_size:
        cfg = replace(cfg, world_size=layout.world_size)
    with Store.open(db) as store:
        return run_all(cfg, layout, store, as_price(price))


def micro(kind: str, *, layout: Layout | None = None, db: str | None = None, price: Any = None,
          **options: Any) -> list[Any]:
    """Phase-1 microbenchmarks: one record per kind run (``all``: every kind; p2p is left out,
    with a line saying why, where fewer than two GPUs are visible).

    ``options`` are the kind's own fields (``micro.options_of(kind)`` lists them): e.g. precisions,
    shapes, full for gemm; mem_mib for memory; sizes, ops, min_busbw for collectives. A field the
    kind does not read is a ``UsageError``. ``layout`` lays out the ranks of collectives, links and
    burnin (duration, gemm_size, gemm_chain, llm_steps: ``micro.burnin.BurninOptions``).
    """
    from dlscale.micro.kinds import run_kinds

    if kind not in MICRO_KINDS:
        raise UsageError(f"unknown microbenchmark {kind!r}; choose one of {', '.join(MICRO_KINDS)}")
    return run_kinds(kind, options, layout, db, as_price(price))


def scale(model: str, *, devices: Sequence[int] = (1, 2), layouts: Sequence[tuple[int, int]] = (),
          emulate_nodes: int | None = None, link_bandwidth: str | None = None, link_latency: str | None = None,
          backend: str | None = None, timeout_s: float = 300.0, threads_per_rank: int | None = None,
          db: str | None = None, price: Any = None, node_link_bandwidth: Any = (), node_cpu_quota: Any = (),
          **options: Any) -> list[Any]:
    """The scaling ladder: the short test at every layout (1x1, ``layouts`` as (nodes, devices per
    node), 1xN for device counts no layout covers), then a ``scale`` summary record of the
    efficiencies and the scale-up vs scale-out table. Returns every rung's record (failed rungs
    too, status ``failed``) and the summary record last. ``options`` are ``TrainConfig`` fields;
    ``node_link_bandwidth``/``node_cpu_quota`` set emulated nodes apart as in ``Layout``."""
    from dlscale.distributed.ladder import run_ladder

    return run_ladder(model, list(devices), list(layouts), options, emulate_nodes=emulate_nodes,
                      link_bandwidth=link_bandwidth, link_latency=link_latency, backend=backend,
                      timeout_s=timeout_s, threads_per_rank=threads_per_rank, db=db, price=as_price(price),
                      node_link_bandwidth=node_link_bandwidth, node_cpu_quota=node_cpu_quota)


def sweep(file: str, *, db: str | None = None, resume: bool = False, timeout_per_run: float | None = None,
          on_start: Callable[[Any], None] | None = None, on_done: Callable[[Any], None] | None = None,
          executor: str = "local", state_dir: str | None = None, wait: bool = True) -> list[Any]:
    """Run a sweep file's points, each in its own process; one ``PointResult`` per point, whose
    ``record`` is the point's run record (points already in the store are skipped with ``resume``).
    ``executor="slurm"`` submits each point as a Slurm job (``sweep.slurm``; job ids kept under
    ``state_dir``) and, with ``wait``, records every outcome as its job ends."""
    from dlscale.store import Store
    from dlscale.sweep import driver as sweep_driver
    from dlscale.sweep import spec

    if executor not in ("local", "slurm"):
        raise UsageError(f"unknown --executor {executor!r}; choose local or slurm")
    sw = spec.load(file).with_timeout(timeout_per_run)
    with Store.open(db) as store:
        if executor == "slurm":
            from dlscale.sweep.slurm import run_slurm_sweep

            results = run_slurm_sweep(sw, store, resume, state_dir, wait, on_start=on_start, on_done=on_done)
        else:
            results = sweep_driver.run_sweep(sw, store, resume, on_start=on_start, on_done=on_done)
        for r in results:
            r.record = store.get(r.run_id) if r.run_id else None
    return results


def predict(run: str, layouts: Sequence[tuple[int, int]], *, model: str | None = None, intra: str | None = None,
            inter: str | None = None, algorithm: str = "ring", host_cost: bool = True, nics: int = 1,
            overlap_cost: float | None = None, find_unused_parameters: bool | None = None, tag: str | None = None,
            shared_host: bool | None = None, db: str | None = None) -> list[Any]:
    """Predict the data-parallel scaling of ``layouts`` ((nodes, devices per node) each) from the
    one-device run ``run`` (a ``train`` run, or a published figure brought in by ``dlscale import``)
    and link parameters (``intra``/``inter``: a datasheet link name such as "nvlink4", "ib-ndr",
    "pcie-gen4-x16" or a rate such as "1gbit"; default: fitted from the newest ``micro collectives``
    run of that level in the store). ``nics``: NICs per node (each at the inter link's rate);
    ``overlap_cost``: the share of backward lost while an all-reduce is in flight (default: fitted
    from a one-node multi-device run of the same test in the store, else 0.5 on accelerators, 0 on
    CPU); ``find_unused_parameters``: the target's DDP flag (default: as the source run); ``shared_host``:
    the nodes share the source run's machine and its cores (default: when the inter link is emulated). One
    ``prediction`` record per distinct layout."""
    from dlscale.predict.layouts import predict as run_predict

    return run_predict(run, list(layouts), model=model, intra=intra, inter=inter, algorithm=algorithm,
                       host_cost=host_cost, nics=nics, overlap_cost=overlap_cost,
                       find_unused_parameters=find_unused_parameters, tag=tag, shared_host=shared_host, db=db)


def failed(records: Sequence[Any]) -> list[Any]:
    """The failed ones among records (a helper for scripts: ``if api.failed(recs): ...``)."""
    return [r for r in records if r is not None and r.status != "ok"]


__all__ += ["failed", "RunFailure", "UsageError"]


def tune(model: str, *, budget_s: float | None = None, resume: bool = False, fix: Sequence[str] | dict[str, Any] = (),
         max_memory: str | None = None, steps: int = 10, warmup_steps: int = 3, max_batch: int = 1024,
         output: str | None = None, force: bool = False, tag: str | None = None, device: str = "auto",
         db: str | None = None, **options: Any) -> Any:
    """Search the short test's knobs (precision, batch size, memory format, torch.compile, threads,
    workers with ``data``) for the fastest configuration that fits; the ``tune`` record, whose raw
    holds the ablation table, the trials (each a recorded ``train`` run under ``tag``) and the best
    configuration, also written as YAML to ``output`` for ``dlscale train --config`` (an existing file
    only with ``force``; never a database, checked before the first trial). ``fix`` holds
    knobs left alone ("precision=fp32" or a dict); ``options`` are the model's TrainConfig shape fields."""
    from dlscale.tune.trials import parse_fix
    from dlscale.tune.trials import tune as run_tune

    fixed = dict(fix) if isinstance(fix, dict) else parse_fix(list(fix))
    return run_tune(model, db=db, budget_s=budget_s, resume=resume, fix=fixed, max_memory=max_memory, steps=steps,
                    warmup_steps=warmup_steps, max_batch=max_batch, output=output, force=force, tag=tag, device=device,
                    **options)


__all__ += ["tune"]


def infer(model: str | None = None, *, config: Any = None, db: str | None = None,
          on_batch: Callable[[int, dict[str, Any]], None] | None = None, price: Any = None, **options: Any) -> Any:
    """Inference throughput and latency by batch size (``dlscale infer``); the run's record (kind
    ``inference``). ``options`` are ``InferConfig`` fields (batch_sizes, precision, runtime, compile,
    iters, find_max_batch, scenario, prompt_len, output_len, decode, ...). ``on_batch(batch_size,
    figures)`` is called after each batch size is measured."""
    from dlscale.harness import device as dev
    from dlscale.harness.runner import execute
    from dlscale.infer.config import InferConfig
    from dlscale.infer.run import run_inference
    from dlscale.store import Store
    from dlscale.system import collect_cached
    from dlscale.workloads.base import shape_words

    cfg = config if config is not None else InferConfig(model=model, **options)
    store = Store.open(db)  # an unwritable database is a usage error before any work
    device = dev.select_device(cfg.device)
    resolved = cfg.resolve(device.type)
    dev.check_precision(resolved.precision, device)
    system = collect_cached()
    info(f"dlscale infer {resolved.model}: batch {','.join(map(str, resolved.batch_sizes))}, "
         f"{shape_words(resolved.train_config())}, {resolved.precision}, {resolved.runtime}"
         f"{_infer_how(resolved)} on {device}")
    with store:
        return execute(kind="inference", workload=resolved.model, config=resolved.to_dict(), tag=resolved.tag,
                       store=store, system=system, price=as_price(price),
                       body=lambda _rec: run_inference(resolved, device, on_batch))


def _infer_how(cfg: Any) -> str:
    """', decode MODE' for an LLM prefill/decode run, ', compiled' for a compiled forward sweep."""
    return f", decode {cfg.decode}" if cfg.decode else ", compiled" if cfg.compile else ""


__all__ += ["infer"]


def health(*, tag: str | None = None, db: str | None = None, xids_since: dict[str, Any] | None = None) -> Any:
    """Every GPU's health as NVML reports it now (``dlscale sysinfo --health``), recorded as a run of
    kind ``health``: per GPU its clock-throttle reasons, ECC counts, retired pages and remapped rows,
    links, the kernel's Xids since ``xids_since`` (a previous read's mark, ``raw.kernel_xids.until``;
    None: this boot's whole log), and the warnings they raise (``raw.gpus[i].warnings``). A GPU that
    reports a problem is not a failed run: the acceptance suite judges it (``dlscale accept``)."""
    from dlscale.harness.runner import Outcome, execute
    from dlscale.monitor.health import check_host
    from dlscale.store import Store

    def body(_rec: Any) -> Any:
        report = check_host(kernel=True, since=xids_since)
        found = [w for g in report["gpus"] for w in g["warnings"]]
        return Outcome(metrics={"gpus": len(report["gpus"]), "health_warnings": len(found)},
                       units={"gpus": "GPUs", "health_warnings": "warnings"}, raw=report, warnings=found)

    with Store.open(db) as store:
        return execute(kind="health", workload="gpus", config={}, tag=tag, store=store, body=body)


__all__ += ["health"]


def inventory(*, tag: str | None = None, db: str | None = None) -> Any:
    """This node's inventory counted (the acceptance's ``inventory`` check), recorded as a run of kind
    ``inventory``: the GPUs CUDA sees, the GPUs NVML lists on the host, the logical CPUs and the
    memory (GiB), with every GPU's name; the record's system is the whole inventory. No load."""
    import os

    from dlscale.harness.runner import Outcome, execute
    from dlscale.monitor import nvml
    from dlscale.store import Store
    from dlscale.system import collect_cached

    def body(rec: Any) -> Any:
        inv = rec.system or {}
        acc = inv.get("accelerators") or {}
        nv, notes = nvml.start(), []
        listed = len(nvml.host_gpus(nv, notes)) if nv is not None else 0
        if nv is not None:
            nvml.stop(nv)
        metrics = {"gpus": int(acc.get("count") or 0), "nvml_gpus": listed,
                   "cpus": int((inv.get("cpu") or {}).get("logical_cpus") or 0),
                   "memory_gib": round(((inv.get("memory") or {}).get("total_bytes") or 0) / 2**30, 1)}
        raw = {"gpu_names": [d.get("name") for d in acc.get("devices") or []],
               "notes": notes + (acc.get("notes") or []), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        return Outcome(metrics=metrics, units={"gpus": "GPUs", "nvml_gpus": "GPUs", "cpus": "CPUs",
                                               "memory_gib": "GiB"}, raw=raw)

    with Store.open(db) as store:
        return execute(kind="inventory", workload="node", config={}, tag=tag, store=store, system=collect_cached(),
                       body=body)


__all__ += ["inventory"]


def serve_bench(url: str | None = None, model: str | None = None, *, config: Any = None, db: str | None = None,
                price: Any = None, **options: Any) -> Any:
    """LLM serving under load against an OpenAI-compatible server at ``url`` (``dlscale serve-bench``); the run's
    record (kind ``serving``). ``options`` are ``ServeConfig`` fields: api, stream, rates or concurrencies,
    burstiness, requests, duration, warmup, timeout, prompt_len, output_len, shared_prefix, prefixes, dataset,
    tokenizer, slo (a preset or "ttft=S,tpot=S"), slo_ttft, slo_tpot, find_max, ... The API key is read from the
    environment variable ``api_key_env`` (default OPENAI_API_KEY where set; a variable named must be set) and
    never recorded."""
    from dlscale.harness.runner import execute
    from dlscale.serve.config import ServeConfig
    from dlscale.serve.serving_run import run_serving
    from dlscale.store import Store

    cfg = config if config is not None else ServeConfig(url=url, model=model, **options)
    store = Store.open(db)  # an unwritable database is a usage error before any work
    loads = ",".join(f"{x:g}" for x in cfg.loads)
    info(f"dlscale serve-bench {cfg.model} at {cfg.base_url}: /v1/{'chat/' if cfg.api == 'chat' else ''}completions"
         f"{', streamed' if cfg.stream else ''}, {cfg.mode} {loads}{' (search)' if cfg.find_max else ''}"
         f"{f', at most {cfg.cap} in flight' if cfg.cap else ''}, "
         f"{cfg.requests} requests per point, prompts {cfg.prompt_len}, outputs {cfg.output_len} tokens")
    with store:
        return execute(kind="serving", workload=cfg.model, config=cfg.to_dict(), tag=cfg.tag, store=store,
                       price=as_price(price), body=lambda rec: run_serving(cfg, rec))


__all__ += ["serve_bench"]
