"""The table of `benchmarks/gpu_check.sh`: each dlscale figure beside its peer, from the JSON the
check's steps left in its folder (DIR/NAME.json, DIR/steps.tsv). Prints Markdown on stdout.

    python benchmarks/gpu_check_table.py gpu-check-20261126-2300/

A ratio is dlscale's figure over the peer's (above 1: dlscale measured more) for rates; for the
LLM request it is the peer's request time over dlscale's (above 1: dlscale's request was faster).
A step that failed, timed out or was skipped shows its state instead of a figure; the last line names
the steps --quick dropped and those the budget skipped for time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(folder: Path, name: str) -> Any:
    """The step's JSON (the last JSON document on its stdout), or None."""
    path = folder / f"{name}.json"
    if not path.is_file():
        return None
    text = path.read_text().strip()
    for start in (0, text.rfind("\n{"), text.rfind("\n[")):
        try:
            return json.loads(text[start:])
        except ValueError:
            continue
    return None


def metric(doc: Any, *keys: str) -> float | None:
    """The first of ``keys`` a run record (or the first record of a list) has as a number."""
    rec = doc[0] if isinstance(doc, list) and doc else doc
    metrics = (rec or {}).get("metrics") or {}
    for key in keys:
        if isinstance(metrics.get(key), (int, float)):
            return float(metrics[key])
    return None


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def rows(folder: Path) -> list[tuple[str, str, str, str]]:
    out = []
    for side in ("a", "b"):
        mine = metric(load(folder, f"train_{side}"), "throughput")
        peer = (load(folder, f"peer_train_{side}") or {}).get("images_per_s")
        out.append((f"short test ({side}), images/s", fmt(mine), f"training loop {fmt(peer)}", ratio(mine, peer)))
    gemm = load(folder, "gemm")
    peer_mm = load(folder, "peer_matmul") or {}
    prec = peer_mm.get("precision", "bf16")
    mine = metric(gemm, f"best_tflops_{prec}", "best_tflops")
    out.append((f"GEMM best {prec}, TFLOP/s", fmt(mine), f"torch.matmul {peer_mm.get('n', '?')}^3 "
                f"{fmt(peer_mm.get('tflops'))}", ratio(mine, peer_mm.get("tflops"))))
    memory = load(folder, "memory")
    peer_copy = load(folder, "peer_copy") or {}
    mine = metric(memory, "d2d_gbps", "copy_gbps")
    out.append(("device copy, GB/s (read+write)", fmt(mine), f"copy_ of {peer_copy.get('bytes', 0) / 2**20:,.0f} MiB "
                f"{fmt(peer_copy.get('gbps'))}", ratio(mine, peer_copy.get("gbps"))))
    lg = load(folder, "loadgen")
    offline, raw = metric(lg, "samples_per_s"), metric(lg, "throughput")
    out.append(("LoadGen offline, samples/s", fmt(offline), f"raw batches, same run {fmt(raw)}", ratio(offline, raw)))
    eager = load(folder, "decode_eager")
    compiled = load(folder, "decode_compiled")
    e_tps, c_tps = metric(eager, "decode_tokens_per_s"), metric(compiled, "decode_tokens_per_s")
    out.append(("LLM decode b1 compiled, tokens/s", fmt(c_tps), f"eager {fmt(e_tps)}", ratio(c_tps, e_tps)))
    graph = load(folder, "decode_graph")
    if graph is not None:
        g_tps = metric(graph, "decode_tokens_per_s")
        out.append(("LLM decode b1 CUDA graph, tokens/s", fmt(g_tps), f"eager {fmt(e_tps)}", ratio(g_tps, e_tps)))
    peer_gen = load(folder, "peer_generate") or {}
    c_req = metric(compiled, "request_latency_s")
    if c_req is None:
        rec = compiled[0] if isinstance(compiled, list) and compiled else compiled
        by = ((rec or {}).get("metrics") or {}).get("request_latency_s_by_batch") or [None]
        c_req = by[0]
    out.append(("LLM request b1 compiled, ms", fmt(c_req and c_req * 1e3),
                f"transformers generate (static cache) {fmt(peer_gen.get('request_s') and peer_gen['request_s'] * 1e3)}",
                ratio(peer_gen.get("request_s"), c_req)))
    for n in (1, 2):
        acc = load(folder, f"accept_{n}") or {}
        counts = ", ".join(f"{k} {v}" for k, v in (acc.get("counts") or {}).items())
        out.append((f"accept --quick ({n})", acc.get("outcome", "-"), counts or "-", ""))
    py = load(folder, "pytest_gpu")
    if py is not None:
        out.append(("pytest -m gpu", "passed" if py.get("pytest_rc") == 0 else f"rc {py.get('pytest_rc')}", "", ""))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: gpu_check_table.py FOLDER (what benchmarks/gpu_check.sh wrote)", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    env = load(folder, "env") or {}
    gpus = ((env.get("accelerators") or {}).get("devices") or [{}])
    device = gpus[0].get("name") or (env.get("cpu") or {}).get("model") or "?"
    sw = env.get("software") or {}
    print(f"device: {device}; torch {sw.get('torch', '?')}, CUDA {sw.get('cuda')}, driver "
          f"{(env.get('accelerators') or {}).get('driver')}\n")
    if not (env.get("accelerators") or {}).get("count"):
        print("no GPU: a dry run at toy sizes (--device cpu); its ratios show the steps ran, they are no figures\n")
    print("| what | dlscale | peer | ratio |\n| --- | --- | --- | --- |")
    for what, mine, peer, r in rows(folder):
        print(f"| {what} | {mine} | {peer} | {r} |")
    print("\n" + steps_line(folder))
    return 0


LEFT_OUT = ("dropped (--quick)", "skipped (time)")  # by the check's budget (gpu_check.sh), not failures


def steps_line(folder: Path) -> str:
    """How the steps ended: how many ran ok, which were dropped by --quick or skipped for time (each
    named), which did not end ok, and the seconds they took."""
    path = folder / "steps.tsv"
    steps = [ln.split("\t") for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []
    parts = [f"{sum(1 for s in steps if s[1:2] == ['ok'])} of {len(steps)} ran ok"]
    for how in LEFT_OUT:
        names = [s[0] for s in steps if s[1:2] == [how]]
        if names:
            parts.append(f"{how}: {', '.join(names)}")
    bad = [f"{s[0]} ({s[1]})" for s in steps if len(s) > 1 and s[1] != "ok" and s[1] not in LEFT_OUT]
    parts.append(f"not ok: {', '.join(bad)}" if bad else "none failed")
    return "steps: " + "; ".join(parts) + f"; {sum(int(s[2]) for s in steps if len(s) > 2)} s"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
