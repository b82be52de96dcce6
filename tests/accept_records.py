"""Records shaped like the ones the acceptance suite makes, built by hand for the verdict engine's tests.

``server(...)`` is an 8-GPU H100 SXM server's acceptance: health, memory and GEMM on every GPU, the
GPU peer matrix, the short test on every GPU alone and on all eight; ``slow_gpu`` runs that GPU
``slow`` below its peers in training and GEMM (and reports thermal slowdown with ``thermal``), and
``weak_pair`` makes one GPU pair's copies slower. Step and call times are spread by a fixed
pattern (CV about ``jitter``), so every figure has samples and a confidence interval.
"""

from __future__ import annotations

from typing import Any

from dlscale.record import RunRecord

GPU = "NVIDIA H100 80GB HBM3"
PATTERN = (-1.0, 0.5, -0.5, 1.0, 0.0, -0.25, 0.25, 0.75, -0.75, 0.1)


def spread(mean: float, n: int, jitter: float = 0.01) -> list[float]:
    """n values around ``mean``: mean x (1 + jitter x pattern)."""
    return [mean * (1 + jitter * PATTERN[i % len(PATTERN)]) for i in range(n)]


def system(n: int = 8, host: str = "gpu-node-07") -> dict[str, Any]:
    """An inventory: n H100 SXM5 behind NVSwitch (NV18 between every pair), PCIe Gen5 x16 each."""
    return {"hostname": host,
            "accelerators": {"count": n, "devices": [{"index": i, "name": GPU} for i in range(n)],
                             "topology": {"gpu_gpu": [["X" if i == j else "NV18" for j in range(n)] for i in range(n)],
                                          "gpus": [{"index": i, "nvml_index": i, "name": GPU, "pci_device_id": 0x2330,
                                                    "pcie_gen_max": 5, "pcie_width_max": 16} for i in range(n)]}}}


def rec(kind: str, workload: str, config: dict, metrics: dict | None = None, raw: dict | None = None,
        units: dict | None = None, tag: str = "acc", sys: dict | None = None, status: str = "ok") -> RunRecord:
    r = RunRecord(kind=kind, workload=workload, config=config, system=sys or system(), metrics=metrics or {},
                  units=units or {}, raw=raw or {}, tag=tag)
    r.status = status
    return r


def health(thermal: int | None = None, n: int = 8) -> RunRecord:
    gpus = []
    for i in range(n):
        hot = i == thermal
        gpus.append({"index": i, "name": GPU, "throttle_reasons": ["hw_thermal_slowdown"] if hot else [],
                     "warnings": [f"GPU {i} is slowing its clocks now (hw_thermal_slowdown): check cooling and power "
                                  "before measuring"] if hot else []})
    return rec("health", "gpus", {}, {"gpus": n}, {"gpus": gpus})


def gemm(slow_gpu: int | None = None, slow: float = 0.10, n: int = 8, tflops: float = 788.0, reps: int = 10) -> RunRecord:
    """bf16 GEMM on every GPU: one 8192^3 case per GPU (default: the healthy H100 SXM figure, 788 TFLOP/s)."""
    flops = 2 * 8192**3
    rows, times = [], []
    for i in range(n):
        rate = tflops * (1 - slow if i == slow_gpu else 1)
        t = spread(flops / (rate * 1e12), reps)
        mean_t = sum(t) / len(t)
        rows.append({"set": "deepbench", "m": 8192, "n": 8192, "k": 8192, "a_t": 0, "b_t": 0, "precision": "bf16",
                     "device": f"cuda:{i}", "tflops": flops / mean_t / 1e12, "time_us": mean_t * 1e6, "flops": flops,
                     "reps": reps})
        times.append(t)
    return rec("micro", "gemm", {"device": "cuda", "device_name": GPU}, {}, {"rows": rows, "times_s": times})


def memory(n: int = 8, d2d: float = 2969.0, h2d: float = 54.5, slow_gpu: int | None = None, slow: float = 0.0,
           d2h: float | None = None) -> RunRecord:
    """Device and pinned host copies on every GPU (default: the healthy H100 SXM figures; d2h: h2d's)."""
    rows, times = [], []
    nbytes = 256 * 2**20
    for i in range(n):
        for op, rate, nb in (("d2d", d2d, 2 * nbytes), ("h2d_pinned", h2d, nbytes),
                             ("d2h_pinned", h2d if d2h is None else d2h, nbytes)):
            r = rate * (1 - slow if i == slow_gpu else 1)
            t = spread(nb / (r * 1e9), 10)
            rows.append({"op": op, "where": f"cuda:{i}", "array_mib": 256, "bytes": nb,
                         "gbps": nb / (sum(t) / len(t)) / 1e9})
            times.append(t)
    return rec("micro", "memory", {"device": "cuda", "device_name": GPU}, {}, {"rows": rows, "times_s": times})


def p2p(weak_pair: tuple[int, int] | None = None, n: int = 8, rate: float = 380.0, weak: float = 0.5) -> RunRecord:
    rows, times = [], []
    nb = 40_000_000
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            r = rate * (weak if (i, j) == weak_pair else 1)
            t = spread(nb / (r * 1e9), 10)
            rows.append({"test": "unidirectional", "peer_access": "enabled", "src": i, "dst": j, "path": "p2p",
                         "bytes": nb, "gbps": nb / (sum(t) / len(t)) / 1e9})
            times.append(t)
    return rec("micro", "p2p", {"device": "cuda", "device_name": GPU}, {}, {"rows": rows, "times_s": times})


def alone(slow_gpu: int | None = None, slow: float = 0.11, n: int = 8, step: float = 0.1, batch: int = 128,
          steps: int = 30, nodes: int = 1, devices: list[str] | None = None, jitter: float = 0.01) -> RunRecord:
    """The short test on every GPU alone: rank k on cuda:k (``devices`` overrides, e.g. ["cpu"] * n)."""
    per_node = n // nodes
    idents, times, thr = [], [], []
    for k in range(n):
        dev = devices[k] if devices else f"cuda:{k % per_node}"
        idents.append({"rank": k, "node": k // per_node, "local_rank": k % per_node, "host": "gpu-node-07",
                       "device": dev, "device_name": GPU if dev.startswith("cuda") else "Intel(R) Xeon(R) Processor"})
        t = spread(step / (1 - slow) if k == slow_gpu else step, steps, jitter)
        times.append([t])
        thr.append(batch * len(t) / sum(t))
    metrics = {"throughput": sum(thr), "rank_throughputs": thr, "samples_per_step": batch * n, "world_size": n}
    return rec("train", "resnet50", {"parallel": "none", "batch_size": batch, "precision": "bf16", "world_size": n,
                                     "nodes": nodes, "devices_per_node": per_node},
               metrics, {"rank_devices": idents, "rank_step_times_s": times, "step_times_s": times[0]},
               {"rank_throughputs": "images/s", "throughput": "images/s"})


def train(step: float = 0.11, n: int = 8, batch: int = 128, steps: int = 30, energy: bool = False,
          jitter: float = 0.01, tag: str = "acc") -> RunRecord:
    t = spread(step, steps, jitter)
    thr = batch * n * len(t) / sum(t)
    metrics: dict[str, Any] = {"throughput": thr, "samples_per_step": batch * n, "world_size": n}
    units = {"throughput": "images/s"}
    if energy:
        metrics.update(energy_j=5600.0, energy_per_unit_j=0.5, avg_power_w=5600.0, price_per_hour=98.32,
                       cost_per_million_units=2.73)
        units.update(energy_j="J", energy_per_unit_j="J/image", avg_power_w="W", price_per_hour="$/h",
                     cost_per_million_units="$/10^6 images")
    return rec("train", "resnet50", {"parallel": "ddp", "batch_size": batch, "precision": "bf16", "world_size": n,
                                     "nodes": 1, "devices_per_node": n},
               metrics, {"step_times_s": [t]}, units, tag=tag)


def links(slow_node: int | None = None, nodes: int = 3, busbw: float = 0.11, slow: float = 0.1,
          size: int = 2**21, hosts: list[str] | None = None) -> RunRecord:
    """A ``dlscale micro links`` record between emulated nodes (``hosts``: between real nodes of these
    names): every pair measured (a pair runs at its slower link), each node's link its fastest pair
    (micro/links.py builds raw["links"])."""
    from dlscale.micro.links import all_pairs, node_links, pair_row

    rows = []
    for a, b in all_pairs(nodes):
        rate = busbw * (slow if slow_node in (a, b) else 1)  # GB/s
        rows.append(pair_row(a, b, size, spread(size / (rate * 1e9), 8)))
    config = {"nodes": nodes, "node_hosts": {str(k): h for k, h in enumerate(hosts)}} if hosts else \
        {"nodes": nodes, "emulated_nodes": True}
    return rec("micro", "links", config, {}, {"rows": rows, "links": node_links(rows, nodes)})


def recorded(db, recs, name="quick", when=None, missing=None, warn_fails=False):
    """Store ``recs`` under a new acceptance id, judge them as `dlscale accept` does (``missing``: check -> why it
    did not finish), record the acceptance."""
    import types

    from dlscale.accept import acceptance as run
    from dlscale.accept.plan import spec
    from dlscale.record import new_run_id
    from dlscale.store import Store

    acc_id = f"accept-{new_run_id()}"
    with Store.open(db) as s:
        for r in recs:
            r.tag = acc_id
            if when:
                r.created_at = when
            s.insert(r)
    sp = spec.builtin(True)
    with Store.open(db) as s:
        base = run.find_baseline(s, "gpu-node-07", "h1", {f.key for f in run.collect.figures(recs)})
    sp.warn_fails = warn_fails
    verdicts = run.judge(recs, sp, base, missing=missing)
    plan = types.SimpleNamespace(checks=[types.SimpleNamespace(check="train_alone", options={})],
                                 not_run=[("p2p", "needs at least 2 GPUs")])
    rec = run._record(acc_id, sp, plan, recs, verdicts, "gpu-node-07", "h1", None, None, str(db), missing)
    return run.Acceptance(acc_id, rec, recs, verdicts, plan.not_run, warn_fails)


def inference(loadgen: float = 2000.0, raw: float = 11_000.0, runs: list[float] | None = None, batch: int = 64,
              scenario: str = "offline", energy: bool = False, tag: str = "acc", iters: int = 20) -> RunRecord:
    """``dlscale infer resnet50 --batch-sizes 64 --scenario offline --scenario-runs 3`` on one GPU: the
    sweep's raw rate at the batch (its timed batches beside it) and LoadGen's figure of each run
    (``runs``; the median is the record's). ``energy``: the raw phase at 0.027 J/image, LoadGen's own
    test at 0.097 J/image (the issue's H100 figures), priced at $2/h."""
    t = spread(batch / raw, iters)
    runs = runs if runs is not None else spread(loadgen, 3)
    metrics: dict[str, Any] = {"throughput": raw, "batch_sizes": [batch], "units_by_batch": [batch],
                               "scenario": scenario, "scenario_metric": sorted(runs)[(len(runs) - 1) // 2],
                               "scenario_metric_runs": runs, "scenario_runs": len(runs), "max_batch": batch}
    units = {"throughput": "images/s", "scenario_metric": "images/s", "scenario_metric_runs": "images/s"}
    if energy:
        metrics.update(energy_per_unit_j=0.027, avg_power_w=300.0, scenario_energy_per_unit_j=0.097,
                       scenario_avg_power_w=194.0, price_per_hour=2.0, cost_per_million_units=2.0 / 3600 * 1e6 / raw)
        units.update(energy_per_unit_j="J/image", avg_power_w="W", scenario_energy_per_unit_j="J/image",
                     scenario_avg_power_w="W", price_per_hour="$/h", cost_per_million_units="$/10^6 images")
    return rec("inference", "resnet50", {"precision": "bf16", "batch_sizes": [batch], "scenario": scenario,
                                         "samples_on": "device", "device_name": GPU},
               metrics, {"batch_times": {str(batch): t}}, units, tag=tag)
