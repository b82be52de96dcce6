"""The table of `benchmarks/gpu_check.sh`: each dlscale figure beside its peer, from the JSON the
check's steps left in its folder (DIR/NAME.json, DIR/steps.tsv). Prints Markdown on stdout.

    python benchmarks/gpu_check_table.py gpu-check-20261126-2300/

A ratio is dlscale's figure over the peer's (above 1: dlscale measured more) for rates; for the
LLM request it is the peer's request time over dlscale's (above 1: dlscale's request was faster).
Each decode row also gives the bytes per second the decode read (weights + KV cache) and its fractions
of the device's datasheet memory bandwidth and of the copy bandwidth measured before it; the second
call's rows (gpu_check.sh --llm) add llama_7b's decode, LLM training's MFU beside its plain loop, and
the served LLM's goodput and joules per token.
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
    metrics = first(doc).get("metrics") or {}
    for key in keys:
        if isinstance(metrics.get(key), (int, float)):
            return float(metrics[key])
    return None


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def rows(folder: Path) -> list[tuple[str, str, str, str]]:
    """The first call's rows where it ran (its env step always does), then the decode and LLM rows of either call."""
    first_call = any((folder / f"{n}.json").is_file() for n in ("train_a", "gemm", "memory", "loadgen", "accept_1"))
    out = first_call_rows(folder) if first_call else []
    out += decode_rows(folder, "")
    out += decode_rows(folder, "llm_")
    out += llm_rows(folder)
    if first_call:
        out += accept_rows(folder)
    return out


def first_call_rows(folder: Path) -> list[tuple[str, str, str, str]]:
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
    for step, what in (("loadgen", "LoadGen offline"), ("loadgen_short", "LoadGen offline, short batches")):
        lg = load(folder, step)
        if lg is None and step == "loadgen_short":
            continue
        offline, raw, wall = metric(lg, "samples_per_s"), metric(lg, "throughput"), metric(lg, "raw_wall_samples_per_s")
        out.append((f"{what}, samples/s", fmt(offline), f"raw batches, same run, device-timed {fmt(raw)}",
                    ratio(offline, raw)))
        out.append((f"{what}, samples/s", fmt(offline), f"raw batches as LoadGen times them (wall clock, same "
                    f"slots) {fmt(wall)}", ratio(offline, wall)))
    return out


def accept_rows(folder: Path) -> list[tuple[str, str, str, str]]:
    out = []
    for n in (1, 2):
        acc = load(folder, f"accept_{n}") or {}
        counts = ", ".join(f"{k} {v}" for k, v in (acc.get("counts") or {}).items())
        out.append((f"accept --quick ({n})", acc.get("outcome", "-"), counts or "-", ""))
    py = load(folder, "pytest_gpu")
    if py is not None:
        out.append(("pytest -m gpu", "passed" if py.get("pytest_rc") == 0 else f"rc {py.get('pytest_rc')}", "", ""))
    return out


def first(doc: Any) -> dict:
    """The run record (or the first of a list), {} where the step left none."""
    rec = doc[0] if isinstance(doc, list) and doc else doc
    return rec if isinstance(rec, dict) else {}


def limit_words(doc: Any) -> str:
    """A decode record's bytes/s and its fractions of the datasheet and of the copy measured beside it."""
    m = first(doc).get("metrics") or {}
    if m.get("decode_memory_gbps") is None:
        return ""
    sheet, copy = m.get("decode_fraction_of_datasheet"), m.get("decode_fraction_of_copy")
    return (f"; {sig(m['decode_memory_gbps'])} GB/s read = {sig(sheet)} of the datasheet "
            f"({sig(m.get('datasheet_memory_gbps'))}), {sig(copy)} of the copy measured ({sig(m.get('reference_copy_gbps'))})")


def sig(x: float | None) -> str:
    """Four significant figures (a toy run's 0.00431 GB/s and an H200's 3,063 alike), '-' for none."""
    return "-" if x is None else f"{x:,.4g}"


DECODE_ARMS = (("eager", "eager (DynamicCache, one Python forward per token)", "generate_eager"),
               ("compiled", "compiled (torch.compile: Inductor's fused kernels, CUDA graphs on a GPU)", "generate_compiled"),
               ("graph_eager", "graph-eager (one CUDA graph of the eager step's unfused kernels)", None))


def decode_rows(folder: Path, prefix: str) -> list[tuple[str, str, str, str]]:
    """Each decode arm's tokens/s at batch 1 against its memory limit, beside the transformers generate arm
    that runs the same kind of step (its decode rate derived from two request lengths) or, for graph-eager,
    beside dlscale's eager; then the compiled request against generate's compiled one."""
    docs = {arm: load(folder, f"{prefix}decode_{arm}") for arm, _, _ in DECODE_ARMS}
    model = next((first(d).get("workload") for d in docs.values() if first(d)), None)
    if model is None:
        return []
    out = []
    for arm, words, peer_step in DECODE_ARMS:
        if docs[arm] is None:
            continue
        tps = metric(docs[arm], "decode_tokens_per_s")
        if peer_step is not None:
            peer = load(folder, f"{prefix}peer_{peer_step}") or {}
            ptps = peer.get("decode_tokens_per_s")
            peer_words = f"{peer.get('label', 'transformers generate ' + peer_step[9:])}: {fmt(ptps)}"
        else:
            ptps = metric(docs["eager"], "decode_tokens_per_s")
            peer_words = f"dlscale eager {fmt(ptps)}"
        out.append((f"{model} decode b1 {words}, tokens/s", fmt(tps) + limit_words(docs[arm]), peer_words,
                    ratio(tps, ptps)))
    comp = first(docs["compiled"]).get("metrics") or {}
    c_req = comp.get("request_latency_s") or (comp.get("request_latency_s_by_batch") or [None])[0]
    peer_gen = load(folder, f"{prefix}peer_generate_compiled") or {}
    if c_req is not None or peer_gen:
        out.append((f"{model} request b1 compiled, ms", fmt(c_req and c_req * 1e3),
                    f"transformers generate compiled {fmt(peer_gen.get('request_s') and peer_gen['request_s'] * 1e3)}",
                    ratio(peer_gen.get("request_s"), c_req)))
    return out


def llm_rows(folder: Path) -> list[tuple[str, str, str, str]]:
    """The second call's LLM training (MFU) beside its plain loop, and the served LLM under serve-bench."""
    out = []
    train, peer = first(load(folder, "llm_train")), load(folder, "llm_peer_train") or {}
    if train or peer:
        m = train.get("metrics") or {}
        mine, ptps, mfu = m.get("throughput"), peer.get("tokens_per_s"), m.get("mfu")
        peer_mfu = mfu * ptps / mine if mfu and mine and ptps else None
        out.append((f"train {train.get('workload', '?')} compiled + fused AdamW, tokens/s (MFU)",
                    f"{fmt(mine)} ({'-' if mfu is None else f'{mfu:.1%}'})",
                    f"{peer.get('label', 'plain loop')}: {fmt(ptps)} ({'-' if peer_mfu is None else f'{peer_mfu:.1%}'})",
                    ratio(mine, ptps)))
    serve = first(load(folder, "llm_serve"))
    if serve:
        m = serve.get("metrics") or {}
        good, j = m.get("goodput_fraction"), m.get("energy_per_unit_j")
        out.append((f"served {Path(str(serve.get('workload', '?'))).name} (transformers serve, continuous batching)",
                    f"goodput {fmt(m.get('goodput'), 2)} req/s ({'-' if good is None else f'{good:.0%}'} within the "
                    f"SLO) at {m.get('load', '?')} in flight, {fmt(m.get('output_throughput'))} tokens/s, "
                    f"{'-' if j is None else f'{j:.3f}'} J/token",
                    f"highest load meeting the SLO: {m.get('max_load_meeting_slo', '-')} (binds: "
                    f"{m.get('slo_binding', '-')})", ""))
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
