"""A data-parallel run's efficiency against the same training alone on the same devices (docs/METRICS.md,
"Data-parallel efficiency").

``E = X / (N x x1)``: X the run's throughput over its N ranks, x1 the throughput one process reaches
training alone on one of the same devices (same model, batch per device, precision, image size, memory
format, compile and optimizer). Where x1 comes from is part of the record (``dp_efficiency_source``):

- given: ``dp_reference`` names a run (the user's; the acceptance's own train_alone run; a scale ladder's
  1-device rung);
- found: the newest ok run in the store of the same test on the same host and device model that trained
  alone (``--parallel none``, or a plain process); on CPUs, whose ranks share the one device, also with the
  same ranks and threads per rank, so that the devices are shared as in the data-parallel run;
- none: ``dp_reference none``, or nothing found; the record says which, and has no efficiency.

A reference run's x1 (``per_device``) is the mean of its ranks' own throughputs where several ranks
trained alone at once (``rank_throughputs``), else its throughput over its ranks. ``notes`` names what
differs between the two runs besides the data parallelism (threads, CPU binding, rank CPUs, the GPU's SM
clock and utilisation), so that a low efficiency carries its first evidence. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlscale.analysis.formulas import scaling_efficiency
from dlscale.errors import UsageError

# what makes two short tests the same test (besides the workload): the figure's own options
SAME_TEST = ("batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "precision",
             "channels_last", "compile", "compile_mode", "optimizer", "optimizer_impl", "activation_checkpointing",
             "data", "device")
MAX_FOUND = 200  # newest train runs of the model searched for a reference
UNITS = {"dp_efficiency": "fraction", "dp_reference_throughput": "samples/s"}
# (metric, what it is, its unit, the relative difference worth a note) between a run and its reference
WATCHED = (("monitor_gpu_sm_clock_MHz_mean", "mean GPU SM clock", "MHz", 0.03),
           ("monitor_gpu_util_pct_mean", "mean GPU utilisation", "%", 0.05),
           ("monitor_gpu_power_W_mean", "mean GPU power", "W", 0.10),
           ("monitor_proc_cpu_cores_mean", "CPU cores busy", "cores", 0.25))


@dataclass(frozen=True)
class Reference:
    """Where a data-parallel run's x1 came from: the run (None: no reference), its x1, how it was chosen."""

    run_id: str | None
    per_device: float | None  # samples/s of one device training alone
    source: str  # "given: run ...", "found in the store: run ...", "none: ..."
    record: Any = None


def trains_alone(rec: Any) -> bool:
    """A record of training alone: every rank its own model (``parallel none``), or one plain process."""
    cfg = rec.config or {}
    return cfg.get("parallel") == "none" or ("launcher" not in cfg and (cfg.get("world_size") or 1) == 1)


def per_device(rec: Any) -> float | None:
    """x1 of a reference run: its ranks' mean throughput where they trained alone at once, else its
    throughput over its ranks (None: no positive figure)."""
    m, cfg = rec.metrics or {}, rec.config or {}
    ranks = [x for x in m.get("rank_throughputs") or [] if isinstance(x, (int, float)) and x > 0]
    if ranks and cfg.get("parallel") == "none":
        return sum(ranks) / len(ranks)
    thr = m.get("throughput")
    world = m.get("world_size") or cfg.get("world_size") or 1
    return thr / world if isinstance(thr, (int, float)) and thr > 0 else None


def describe(rec: Any) -> str:
    """'run 1a2b3c (2 ranks each training alone at once, tag T, 2026-11-28)'."""
    cfg = rec.config or {}
    world = (rec.metrics or {}).get("world_size") or cfg.get("world_size") or 1
    if cfg.get("parallel") == "none":
        what = f"{world} rank{'s' if world > 1 else ''} each training alone at once"
    elif "launcher" not in cfg and world == 1:
        what = "one process training alone"
    else:
        what = f"{str(cfg.get('parallel') or 'ddp').upper()} over {world} rank{'s' if world > 1 else ''}"
    tag = f", tag {rec.tag}" if rec.tag else ""
    return f"run {rec.run_id} ({what}{tag}, {str(rec.created_at)[:10]})"


def resolve(store: Any, cfg: Any, host: str | None, device: str, world: int, threads: int | None) -> Reference:
    """The reference of a data-parallel run of ``cfg`` (a resolved TrainConfig) on ``world`` ranks of
    ``threads`` threads on ``host``'s devices named ``device`` (the module doc). A given run id that is
    not in the store is a UsageError."""
    given = cfg.dp_reference
    if given == "none":
        return Reference(None, None, "none: not asked for (--dp-reference none)")
    if given not in (None, "auto"):
        rec = store.get(given)
        x1 = per_device(rec) if rec.status == "ok" else None
        if x1 is None:
            raise UsageError(f"--dp-reference {given}: run {rec.run_id} is a {rec.status} {rec.kind} run with no "
                             "throughput; give an ok train run of the same training alone")
        return Reference(rec.run_id, x1, f"given: {describe(rec)}", rec)
    mine = {k: v for k, v in cfg.to_dict().items() if k in SAME_TEST}
    for rec in store.query(kind="train", workload=cfg.model, status="ok", limit=MAX_FOUND):
        c = rec.config or {}
        if rec.imported or not trains_alone(rec) or (rec.system or {}).get("hostname") != host:
            continue
        if any(k in c and c[k] != v for k, v in mine.items()) or c.get("device_name") != device:
            continue
        if cfg.device == "cpu" and ((rec.metrics or {}).get("world_size") or 1, c.get("threads_per_rank")) != (
                world, threads):
            continue
        x1 = per_device(rec)
        if x1 is not None:
            return Reference(rec.run_id, x1, f"found in the store: {describe(rec)}", rec)
    where = "on this host" + (f" with {world} ranks of {threads} thread(s)" if cfg.device == "cpu" else "")
    return Reference(None, None, f"none: no ok run of the same test training alone {where} in the store "
                                 "(run it with --parallel none, or give --dp-reference RUN)")


def figures(metrics: dict[str, Any], config: dict[str, Any], ref: Reference) -> tuple[dict[str, Any], list[str]]:
    """The efficiency figures of a data-parallel run (its ``metrics`` and ``config`` as recorded) against
    ``ref``, and the notes on what else differs between the two runs."""
    world = metrics.get("world_size") or config.get("world_size") or 1
    thr = metrics.get("throughput")
    eff = scaling_efficiency(thr, ref.per_device, world) if ref.per_device and thr else None
    out = {"dp_efficiency": eff, "dp_reference_throughput": ref.per_device, "dp_reference_run_id": ref.run_id,
           "dp_efficiency_source": ref.source}
    return out, notes(metrics, config, ref.record) if ref.record is not None else []


def notes(metrics: dict[str, Any], config: dict[str, Any], ref: Any) -> list[str]:
    """What differs between a data-parallel run and its reference run besides the data parallelism: the test's
    own options, threads per rank, CPU binding and rank CPUs, and the monitor's GPU clock, utilisation and
    power and the CPU cores busy where they differ by more than ``WATCHED``'s margin."""
    rc, rm = ref.config or {}, ref.metrics or {}
    out = [f"{k} {rc.get(k)!r} in the reference (this run: {config.get(k)!r})" for k in (*SAME_TEST, "device_name")
           if k in config and k in rc and config[k] != rc[k]]
    for k, what in (("threads_per_rank", "threads per rank"), ("cpu_binding", "CPU binding")):
        if k in rc and rc.get(k) != config.get(k):
            out.append(f"{what} {config.get(k)} (reference: {rc.get(k)})")
    mine, theirs = config.get("rank_cpus") or [], rc.get("rank_cpus") or []
    if mine and theirs and mine[:1] != theirs[:1]:
        out.append(f"rank 0's CPUs {mine[0]} (reference: {theirs[0]})")
    for k, what, unit, margin in WATCHED:
        a, b = metrics.get(k), rm.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 and abs(a - b) > margin * b:
            out.append(f"{what} {a:,.4g} {unit} (reference: {b:,.4g})")
    return out


def apply(out: Any, config: dict[str, Any], ref: Reference) -> None:
    """Add the efficiency figures to rank 0's outcome (``out``: harness.runner.Outcome; ``config``: the
    record's config as it will be stored), the notes in its raw ``dp_efficiency_notes``."""
    got, why = figures(out.metrics, config, ref)
    out.metrics.update(got)
    out.units.update({**UNITS, "dp_reference_throughput": f"{config.get('sample_unit') or 'samples'}/s"})
    out.raw["dp_efficiency_notes"] = why
