"""What the store's runs of the same test say about the host a prediction starts from.

Each term the step model (``predict.model``) cannot know from one device is taken from a measured
(or, for a published figure, imported) one-node run of several devices of the same test on the
same system where the store holds one, else from a stated default:

- contention: ranks sharing a host's cores and memory run their compute slower; the slowdown of
  the multi-rank run's forward and optimizer phases (which carry no communication);
- host cost (CPU runs): the all-reduce's own per-byte cost on loaded cores (``fit_host_bandwidth``);
- overlap cost (accelerator runs): the share of backward lost while an all-reduce is in flight,
  solved from the multi-device run's step (``fit_overlap``), else ``DEFAULT_OVERLAP_COST``;
- the input pipeline: the source run's loader rate, shared by the ranks of a host (``Loader``).

The lookups read records only; the fits below them are arithmetic on the step model.
docs/METRICS.md derives each term and its source.
"""

from __future__ import annotations

from typing import Any, Callable

from dlscale.errors import UsageError
from dlscale.predict.links import Link
from dlscale.predict.model import Compute, Loader, allreduce_s, predict_step

TEST_KEYS = ("batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "precision",
             "channels_last", "compile_mode", "optimizer", "optimizer_impl", "device")
DEFAULT_OVERLAP_COST = 0.5
DEFAULT_OVERLAP_SOURCE = (
    "overlap cost 0.5 (default, not measured for this system): the median of the published slowdowns of "
    "compute kernels while an NCCL collective is in flight, s = 1.76, 1.83, 2.0, 2.5, 4.0 (NVIDIA/nccl issues "
    "#1428: A100 GEMM, attention, element-wise; #338: ResNet-50 batch-norm backward 2-4x), cost = 1 - 1/s; "
    "a measured one-node multi-device run of this test on this system replaces it")


def same_test(rec: Any, base: Any) -> bool:
    """``rec`` ran ``base``'s test on ``base``'s system: the same host for measured runs, the same named
    system, model and batch for published figures."""
    if rec.workload != base.workload or rec.status != "ok" or rec.kind != "train":
        return False
    if base.imported:
        return bool(rec.imported) and all(rec.config.get(k) == base.config.get(k) for k in ("system", "batch_size"))
    return not rec.imported and rec.hostname == base.hostname and all(
        rec.config.get(k) == base.config.get(k) for k in TEST_KEYS)


def one_node_runs(store: Any, base: Any) -> list[Any]:
    """The ok runs of ``base``'s test on its system with several devices on one node, newest first."""
    return [r for r in store.query(kind="train", workload=base.workload, status="ok")
            if same_test(r, base) and (r.config.get("nodes") or 1) == 1 and (r.config.get("devices_per_node") or 1) > 1]


def _free_phases(rec: Any) -> float | None:
    m = rec.metrics
    if m.get("phase_forward") is None or m.get("phase_optimizer") is None:
        return None
    return m["phase_forward"] + m["phase_optimizer"]


def contention(store: Any, base: Any, per_host: int) -> tuple[float | None, str]:
    """Compute slowdown of ``per_host`` ranks sharing this host from a measured run's phases, else, on a
    CPU host, from its cores (``oversubscription``); (None, why) where neither is known."""
    if per_host <= 1:
        return 1.0, "one rank per host"
    f0 = _free_phases(base)
    for rec in one_node_runs(store, base):
        if rec.config.get("devices_per_node") == per_host and _free_phases(rec) and f0:
            return _free_phases(rec) / f0, f"forward+optimizer of {rec.run_id} over {base.run_id}"
    missing = f"not measured for {per_host} ranks per host (no {per_host}-rank run of this test with a breakdown)"
    factor, why = oversubscription(base, per_host)
    return (None, missing) if factor is None else (factor, f"{why}; {missing}")


SATURATED_PCT = 95.0  # the host's CPUs this busy (monitor_cpu_total_pct_mean) are all taken


def others_on_host(base: Any, threads: int, cores: int) -> float:
    """Threads' worth of other work the source run's host carried while it ran, from its monitor: where
    the host was saturated, what its rank's share says, ``t C / own - t`` (every runnable thread a
    fair share); else the busy cores that were not its own, ``total C - own``; 0 where not recorded."""
    m = base.metrics or {}
    own, total = m.get("monitor_proc_cpu_cores_mean"), m.get("monitor_cpu_total_pct_mean")
    if not own or total is None:
        return 0.0
    if total >= SATURATED_PCT:
        return max(0.0, threads * cores / own - threads)
    return max(0.0, total / 100 * cores - own)


def oversubscription(base: Any, per_host: int) -> tuple[float | None, str]:
    """A CPU host's cores taken in turn: ``per_host`` ranks of ``t`` threads (the source run's
    ``threads_per_rank``) on its ``C`` usable cores (the source run's CPU affinity), beside ``D``
    threads' worth of other work (``others_on_host``), each get ``min(1, C / (D + per_host t))`` of a
    core, and run that much slower than the source run's one rank did (``min(1, C / (D + t))``). On an
    otherwise idle host nothing is charged below ``C`` threads (memory-bandwidth contention is not
    modelled). (None, why) for accelerator runs and where threads or cores are not recorded."""
    if base.config.get("device") != "cpu":
        return None, "not a CPU run"
    threads = base.config.get("threads_per_rank")
    cpu = (base.system or {}).get("cpu") or {}
    cores = len(cpu["affinity"]) if cpu.get("affinity") else cpu.get("logical_cpus")
    if not threads or not cores:
        return None, "threads per rank or usable cores not recorded"
    others = others_on_host(base, threads, cores)
    factor = min(1.0, cores / (others + threads)) / min(1.0, cores / (others + per_host * threads))
    what = f"{per_host} ranks x {threads} thread(s) on the {cores} usable cores of {base.run_id}'s host"
    if others > 0:
        what += f" beside {others:.2f} threads' worth of other work (its monitor)"
    return factor, what + (f": they take the cores in turn, {factor:.3f}x" if factor > 1 else ": a core each")


def host_bandwidth(store: Any, base: Any, buckets: list[int], intra: Any) -> tuple[float | None, str]:
    """The loaded CPU host's own all-reduce rate: fitted (``model.fit_host_bandwidth``) from a measured
    one-node multi-rank run of the same test on the same host, else the rate of the host's own
    one-node (loopback) all-reduce, measured by ``micro collectives`` on it (``loopback_rate``);
    (None, why) where neither is in the store, or not a CPU run."""
    from dlscale.predict.links import find_measured

    if base.config.get("device") != "cpu":
        return None, "host cost: not a CPU run (device-side collectives do not share the compute cores)"
    intra = intra or find_measured(store, "intra")
    for rec in one_node_runs(store, base):
        m = rec.metrics
        if intra is not None and m.get("allreduce_seconds_per_step"):
            bw = fit_host_bandwidth(m["allreduce_seconds_per_step"], buckets, rec.config["devices_per_node"], intra)
            if bw is None:
                return None, f"host cost: none visible in {rec.run_id} (its link explains its all-reduce time)"
            return bw, (f"host cost: {bw / 1e9:.3f} GB/s fitted from {rec.run_id}'s in-training all-reduce time "
                        f"({m['allreduce_seconds_per_step'] * 1e3:.1f} ms per step) over {intra.name}")
    return loopback_rate(store, base, intra)


def loopback_rate(store: Any, base: Any, intra: Any) -> tuple[float | None, str]:
    """The host's own per-byte cost of an all-reduce, where no training run of several ranks shows it: a
    ``micro collectives`` run of several ranks on one node of this host (its loopback: no wire at all, so
    its fitted rate is the copies, reductions and TCP stack of the cores alone). Its fitted bandwidth
    is ``beta_host``: under backward the cores that do that work are busy, so it adds to a bucket's
    transfer instead of hiding behind it."""
    fit = (intra.fit or {}) if intra is not None else {}
    run = store.get(fit["run_id"]) if fit.get("run_id") else None
    if run is None or fit.get("emulated_link") or run.hostname != base.hostname:
        return None, ("host cost: not measured (no one-node multi-rank run of this test, nor a `micro collectives` "
                      "run of several ranks on one node of this host)")
    return intra.bandwidth, (f"host cost: {intra.bandwidth / 1e9:.3f} GB/s, the loopback all-reduce rate of "
                             f"{run.run_id} on this host (the cores' own per-byte work, in series with every "
                             "bucket's transfer while backward keeps them busy)")


def _step_of(rec: Any) -> float | None:
    """A multi-device run's mean step: ``step_time_mean``, else its global batch over its throughput."""
    m, c = rec.metrics, rec.config
    if m.get("step_time_mean"):
        return float(m["step_time_mean"])
    per_step = m.get("samples_per_step") or (c.get("batch_size") or 0) * (c.get("devices_per_node") or 1)
    return per_step / m["throughput"] if per_step and m.get("throughput") else None


def overlap(store: Any, base: Any, compute: Any, buckets: list[Any], intra: Any, given: float | None,
            host_bw: float | None, factors: dict[int, tuple[float | None, str]]) -> tuple[float, str, Any]:
    """(overlap cost, where it came from, the run it was fitted from or None).

    Given: as given. CPU runs: 0 (the host-cost term carries the all-reduce's cost to backward
    there). Accelerator runs (and published figures): solved from the newest one-node run of the
    most devices of the same test on the same system (``fit_overlap``, with its contention
    where its phases measured it; where the cost alone cannot explain the run, the contention it
    solves is put in ``factors``), else ``DEFAULT_OVERLAP_COST``.
    """
    if given is not None:
        return given, f"overlap cost {given:g}: given (--overlap-cost)", None
    if base.config.get("device") == "cpu":
        return 0.0, "overlap cost 0: a CPU run (the host-cost term carries the all-reduce's cost to backward)", None
    runs = sorted((r for r in one_node_runs(store, base) if _step_of(r)),
                  key=lambda r: r.config["devices_per_node"], reverse=True)
    if not runs or intra is None:
        return DEFAULT_OVERLAP_COST, DEFAULT_OVERLAP_SOURCE, None
    rec = runs[0]
    g = rec.config["devices_per_node"]
    measured_c = contention(store, base, g)[0]
    cost, c, how = fit_overlap(compute, buckets, g, intra, _step_of(rec), measured_c, host_bw)
    if measured_c is None and c != 1.0:
        factors[g] = (c, f"fitted from {rec.run_id} with overlap cost 1: its extra time the link does not explain")
    return cost, (f"overlap cost {cost:.3f} fitted from {rec.run_id} (1x{g}, {_step_of(rec) * 1e3:.1f} ms per step) "
                  f"over {intra.name}: {how}"), rec


def loader(base: Any) -> tuple[Any, str]:
    """The source run's input pipeline as a ``model.Loader`` (its rate, workers and the host's cores); None
    where the run had no ``--data`` loader."""
    m = base.metrics
    if not m.get("loader_rate"):
        return None, "input pipeline: no loader rate in the source run (it read no --data), so no cap"
    cpu = (base.system or {}).get("cpu") or {}
    cores = len(cpu["affinity"]) if cpu.get("affinity") else cpu.get("logical_cpus")
    ld = Loader(float(m["loader_rate"]), int(m.get("loader_workers") or 0), cores)
    return ld, (f"input pipeline: {ld.rate:.4g} samples/s from {ld.workers} worker(s) on a host of "
                f"{cores or 'unknown'} cores, shared by the ranks of each host")


# -- the fits (arithmetic) ------------------------------------------------------------------


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target for f increasing, by bisection (to 1e-12 of the interval)."""
    for _ in range(80):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_overlap(compute: Compute, buckets: list[Any], per_node: int, intra: Link, measured_step_s: float,
                contention: float | None = None, host_bandwidth: float | None = None) -> tuple[float, float, str]:
    """(overlap cost, contention, how) that make the step model give a measured one-node run of
    ``per_node`` ranks its measured mean step.

    With ``contention`` measured (its forward and optimizer phases), only the overlap cost is
    solved, in [0, 1]. Without it, contention is taken as 1 and the overlap cost solved; where even
    an overlap cost of 1 (backward waits for every all-reduce) leaves the run slower than the
    model, the rest is contention, solved with the cost at 1. A run faster than the model with
    free overlap gives cost 0.
    """
    if per_node < 2:
        raise UsageError(f"fitting the overlap cost needs a run of 2 or more ranks on one node, got {per_node}")

    def step(cost: float, c: float) -> float:
        return predict_step(compute, buckets, 1, per_node, intra, None, c, host_bandwidth=host_bandwidth,
                            overlap_cost=cost).step_s

    c = 1.0 if contention is None else contention
    if step(0.0, c) >= measured_step_s:
        return 0.0, c, "the run is as fast as the model with free overlap or faster: overlap cost 0"
    if step(1.0, c) <= measured_step_s:
        if contention is not None:
            return 1.0, c, ("even with no overlap (cost 1) the model is faster than the run, whose contention "
                            "was measured: the rest is not explained")
        c = _solve(lambda x: step(1.0, x), measured_step_s, 1.0, 64.0)
        return 1.0, c, (f"even with no overlap (cost 1) the link explains only part of the run's extra time: "
                        f"the rest is contention {c:.4f}")
    cost = _solve(lambda x: step(x, c), measured_step_s, 0.0, 1.0)
    return cost, c, f"overlap cost {cost:.3f} solved with contention {c:.4f}"


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
