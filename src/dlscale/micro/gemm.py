"""GEMM: DeepBench's training matrix multiplies, C (M x N) = op(A) op(B), 2*M*N*K FLOPs per call."""

from __future__ import annotations

from typing import Any

from dlscale.micro.base import Case, MicroOptions, Plan, run_devices, size_filter
from dlscale.micro.node import at_once_sums
from dlscale.micro.shapes import load

name = "gemm"
title = "matrix multiply (DeepBench training GEMMs): TFLOP/s and % of the dense peak"
columns = ("set", "m", "n", "k", "a_t", "b_t", "precision")
PROBE = 2048  # the CPU peak probe: a square GEMM large enough to run at the BLAS's best rate
SHAPE_COLUMNS = ("m", "n", "k", "a_t", "b_t")


def gemm_flops(m: int, n: int, k: int) -> int:
    """One multiply-add per (i, j, l): 2*M*N*K."""
    return 2 * m * n * k


def dtype_of(precision: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def build_gemm(m: int, n: int, k: int, a_t: bool, b_t: bool, precision: str, device: Any):
    """Operands stored as DeepBench lays them out (A^T stored K x M when a_t) and C preallocated."""
    import torch

    dt = dtype_of(precision)
    a = torch.randn((k, m) if a_t else (m, k), device=device).to(dt)
    b = torch.randn((n, k) if b_t else (k, n), device=device).to(dt)
    c = torch.empty((m, n), device=device, dtype=dt)
    a_op, b_op = (a.t() if a_t else a), (b.t() if b_t else b)
    return lambda: torch.matmul(a_op, b_op, out=c)


def plan(opts: MicroOptions, device: Any) -> Plan:
    """Every shape in every precision; with ``every_device`` on every GPU, each shape on all of them at
    once (rows labelled ``device``; ``Case.group``: the shape and precision)."""
    out = Plan()
    shapes = load("gemm", SHAPE_COLUMNS, opts.shapes)  # read once, for every device and precision
    for where in run_devices(opts, device):
        cases = []
        for p in opts.precisions:
            for s in shapes:
                m, n, k, a_t, b_t = s["m"], s["n"], s["k"], bool(s["a_t"]), bool(s["b_t"])
                cases.append(_case("deepbench" if opts.shapes is None else "user", m, n, k, a_t, b_t, p, where))
        if opts.every_device:
            for i, c in enumerate(cases):
                c.labels["device"], c.device = str(where), where
                c.group = ("gemm", i) if where.type == "cuda" else None
        out.cases += cases
    out.cases = size_filter(out.cases, opts, device, out.notes)
    if device.type == "cpu":
        # The measured best GEMM rate on CPUs: shown beside the ISA peak (docs/METRICS.md).
        out.cases += [_case("peak-probe", PROBE, PROBE, PROBE, False, False, p, device) for p in opts.precisions]
    return out


def _case(set_: str, m: int, n: int, k: int, a_t: bool, b_t: bool, p: str, device: Any) -> Case:
    return Case(labels={"set": set_, "m": m, "n": n, "k": k, "a_t": int(a_t), "b_t": int(b_t), "precision": p},
                build=lambda: build_gemm(m, n, k, a_t, b_t, p, device), flops=gemm_flops(m, n, k), precision=p,
                capture=True)


def summarize(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """flop_summary, and on CPUs the peak probe's rate and its fraction of the ISA peak."""
    metrics, units = flop_summary(rows)
    devices = list(dict.fromkeys(r["device"] for r in rows if "device" in r))
    if devices:  # every_device: each device's best rate, aligned with ``devices``
        metrics["devices"] = devices
        metrics["best_tflops_by_device"] = [max(r["tflops"] for r in rows if r.get("device") == d) for d in devices]
        units.update(devices="devices", best_tflops_by_device="TFLOP/s")
    together = at_once_sums(rows, SHAPE_COLUMNS + ("precision",), "tflops")
    if together:  # every GPU at once: the case whose rates summed over the devices is the highest
        (m, n, k, a_t, b_t, prec), best = max(together.items(), key=lambda kv: kv[1])
        metrics["node_best_tflops"] = best
        metrics["node_best_case"] = f"{m}x{n}x{k} a_t={a_t} b_t={b_t} {prec}"
        units["node_best_tflops"] = "TFLOP/s"
    probe = [r for r in rows if r.get("set") == "peak-probe"]
    if probe:
        best = max(probe, key=lambda r: r["tflops"])
        metrics["measured_gemm_peak_tflops"] = best["tflops"]
        metrics["measured_gemm_peak_pct_isa"] = best.get("pct_peak")
        units.update(measured_gemm_peak_tflops="TFLOP/s", measured_gemm_peak_pct_isa="fraction")
    return metrics, units


def flop_summary(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """Best and median TFLOP/s over the cases, and the best fraction of peak where known."""
    from dlscale import stats

    if not rows:
        return {"best_tflops": None, "median_tflops": None, "best_pct_peak": None}, {}
    rates = [r["tflops"] for r in rows]
    pcts = [r["pct_peak"] for r in rows if r.get("pct_peak") is not None]
    return ({"best_tflops": max(rates), "median_tflops": stats.percentile(rates, 50),
             "best_pct_peak": max(pcts) if pcts else None},
            {"best_tflops": "TFLOP/s", "median_tflops": "TFLOP/s", "best_pct_peak": "fraction"})


def pass_summary(rows: list[dict[str, Any]], passes: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """``flop_summary`` plus the best TFLOP/s of each pass (fwd, bwd_data, bwd_weights)."""
    metrics, units = flop_summary(rows)
    for which in passes:
        sub = [r["tflops"] for r in rows if r["pass"] == which]
        metrics[f"best_tflops_{which}"] = max(sub) if sub else None
        units[f"best_tflops_{which}"] = "TFLOP/s"
    return metrics, units
