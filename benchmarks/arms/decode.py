"""`inference.py decode`: dlscale's decode modes and transformers' generate, eager and compiled, each for what it runs.

Four arms (five on CUDA) on one model (the registered llm workload, random init from the seed, eval, inference_mode,
greedy, a fixed output length), each prepared once before the rounds (compiles and captures excluded):

- ``dlscale compiled``: ``dlscale.infer.decode.CompiledDecoder`` (what ``dlscale infer MODEL --compile``
  runs): StaticCache + the one-token step under torch.compile (CPU: Inductor default mode; CUDA:
  reduce-overhead, i.e. CUDA graphs);
- ``dlscale eager``: ``EagerDecoder`` (``--decode eager``): DynamicCache, one Python forward per token;
- ``hf compiled``: ``model.generate(cache_implementation="static")`` with transformers' own
  ``CompileConfig`` (fullgraph, the same Inductor mode; ``_compile_all_devices`` so that it compiles
  on a CPU too, which generate otherwise refuses): transformers' compiled decode, the compiled peer;
- ``hf eager``: ``model.generate()`` with its DynamicCache and ``disable_compile=True`` (generate
  compiles by itself only for a compileable cache on an accelerator; that is the switch): the eager peer
  (both generate arms take their arguments and labels from gpu_peers.generate_kwargs, as gpu_check.sh's do);
- on CUDA also ``dlscale graph-eager``: ``GraphDecoder`` (``--decode graph-eager``), the eager step's
  unfused kernels captured as one CUDA graph.

(Both generate calls pass ``use_cache=True``: the workload's config turns the cache off for training.)

Each round runs every arm for ``--gens`` generations, in an order that rotates from round to round
(ABCD, BCDA, ...), so drift on a shared machine spreads over all arms. dlscale's arms report decode
tokens/s (batch x (N - 1) over the summed decode steps) and the request time (TTFT + decode);
generate gives only the request time (prefill included), so the peer ratios are per request. Also
checks that all arms produce the same greedy tokens. Prints one line per round, the medians, the
ratios, dlscale's decode against its memory limit (the bytes a step reads per second, weights + KV
cache, as a fraction of the copy bandwidth measured first: ``dlscale.infer.limit``), PASS or FAIL against the target (compiled / eager decode tokens/s >= 1.3 on a CPU for
llama_tiny at batch 1, >= 3 on a GPU for llama_small at batch 1; ``--target``), then one JSON line;
exits 1 on FAIL (different tokens also fail in fp32; in bf16/fp16 other kernels may flip an
argmax that a random-init model's near-uniform logits leave almost tied, so there they are shown only).

    .venv/bin/python benchmarks/inference.py decode                             # llama_tiny, CPU, fp32, batch 1
    .venv/bin/python benchmarks/inference.py decode --threads 1 --rounds 10     # on a shared machine
    .venv/bin/python benchmarks/inference.py decode --model llama_small --device cuda --precision bf16 --prompt-len 128
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

import gpu_peers
from arms import say_arms

os.environ.setdefault("DLSCALE_QUIET", "1")

from dlscale import workloads  # noqa: E402
from dlscale.harness.device import autocast_dtype, set_matmul_precision, synchronize  # noqa: E402
from dlscale.harness.timing import MarkClock  # noqa: E402
from dlscale.infer.decode import CompiledDecoder, EagerDecoder, GraphDecoder  # noqa: E402
from dlscale.infer import limit  # noqa: E402
from dlscale.infer.llm import llm_config  # noqa: E402
from dlscale.domains.llm.workload import kv_bytes_per_position  # noqa: E402

LABELS = {  # each arm as it runs; the generate arms' labels are gpu_peers.generate_kwargs' (set in hf_arm)
    "dlscale compiled": "infer.decode.CompiledDecoder: StaticCache, the one-token step under torch.compile "
                        "(Inductor default mode on a CPU, reduce-overhead = CUDA graphs on CUDA)",
    "dlscale eager": "infer.decode.EagerDecoder: DynamicCache, one eager Python forward per token",
    "dlscale graph-eager": "infer.decode.GraphDecoder (CUDA only): the eager step's unfused kernels captured as one "
                           "CUDA graph, no compiler",
}
Arm = Callable[[], tuple[float | None, float, torch.Tensor]]  # -> (decode tokens/s or None, request s, tokens)


def dlscale_arm(decoder, prompt, n: int, device) -> Arm:
    clock = MarkClock(device, n + 1)
    batch = prompt.shape[0]

    def run():
        g = decoder.generate(prompt, clock)
        return batch * (n - 1) / sum(g.decode_step_s), g.prefill_s + sum(g.decode_step_s), g.tokens

    return run


def hf_arm(model, prompt, n: int, device, mode: str) -> Arm:
    """transformers' generate in ``mode`` (eager or compiled) as gpu_peers.generate_kwargs sets it; its label kept."""
    kw, LABELS[f"hf {mode}"] = gpu_peers.generate_kwargs(mode, prompt, device)
    kw.update(max_new_tokens=n, min_new_tokens=n)

    def run():
        synchronize(device)
        t0 = time.perf_counter()
        out = model.generate(prompt, **kw)
        synchronize(device)
        return None, time.perf_counter() - t0, out[:, prompt.shape[1]:]

    return run


def against_limit(a: argparse.Namespace, tokens_per_s: float, copy_gbps: float, copy_how: str) -> dict:
    """A decode rate's bytes read per second (weights + KV cache, dlscale.infer.limit) and its fraction of the copy."""
    cfg = llm_config(a.model, None, a.prompt_len, a.output_len, a.precision)
    fields = workloads.get(a.model).fields(cfg)
    nbytes = torch.empty((), dtype=autocast_dtype(a.precision) or torch.float32).element_size()
    step = limit.step_bytes(limit.weight_bytes_read(fields, nbytes), kv_bytes_per_position(fields, nbytes),
                            a.batch_size, a.prompt_len, a.output_len)
    f = limit.figures(step, a.batch_size, tokens_per_s, copy_gbps, None)
    print(f"  {tokens_per_s:.1f} tokens/s read {f['decode_memory_gbps']:.3f} GB/s ({step / 1e6:.2f} MB a step) = "
          f"{f['decode_fraction_of_copy']:.4f} of the copy ({copy_gbps:.2f} GB/s, {copy_how})")
    return f


def build(a: argparse.Namespace, device) -> tuple[dict[str, Arm], dict[str, float]]:
    """The four arms, each prepared (compiled, warmed) once; the seconds each preparation took."""
    cfg = llm_config(a.model, None, a.prompt_len, a.output_len, a.precision)
    w = workloads.get(a.model)
    torch.manual_seed(a.seed)
    net = w.build_in(cfg, device, autocast_dtype(a.precision) or torch.float32).eval()  # as dlscale infer makes it
    peer = copy.deepcopy(net)  # generate's compiled call lives on its own model
    prompt = w.make_batch(replace(cfg, batch_size=a.batch_size), device, a.seed)[0]
    compiled, eager = CompiledDecoder(net, device, a.output_len), EagerDecoder(net, device, a.output_len)
    arms = {"dlscale compiled": dlscale_arm(compiled, prompt, a.output_len, device),
            "dlscale eager": dlscale_arm(eager, prompt, a.output_len, device),
            "hf compiled": hf_arm(peer, prompt, a.output_len, device, "compiled"),
            "hf eager": hf_arm(peer, prompt, a.output_len, device, "eager")}
    setup = {}
    t0 = time.perf_counter()
    compiled.prepare(prompt)
    setup["dlscale compiled"] = time.perf_counter() - t0
    if device.type == "cuda":  # the captured CUDA graph (--decode graph) has no compiler to wait for
        graph = GraphDecoder(net, device, a.output_len)
        t0 = time.perf_counter()
        graph.prepare(prompt)
        setup["dlscale graph-eager"] = time.perf_counter() - t0
        arms["dlscale graph-eager"] = dlscale_arm(graph, prompt, a.output_len, device)
    for name in ("dlscale eager", "hf compiled", "hf eager"):
        t0 = time.perf_counter()
        for _ in range(2):  # generate compiles on its first static call and records graphs on the next
            arms[name]()
        setup[name] = time.perf_counter() - t0
    return arms, setup


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama_tiny")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--gens", type=int, default=3, help="generations per arm per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=None,
                    help="exit 1 when the median compiled/eager decode ratio is below it (default 1.3 on a CPU, 3 on CUDA)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default torch's); 1 keeps a shared machine's load out of OpenMP barriers")


def run(a: argparse.Namespace) -> None:
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    set_matmul_precision(a.precision, device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.getloadavg()[0]:.1f} load; {a.model} "
          f"{a.precision} on {a.device}, batch {a.batch_size}, prompt {a.prompt_len}, output {a.output_len}; "
          f"{a.rounds} rotating rounds x {a.gens} generations per arm", flush=True)
    copy_ref = limit.copy_bandwidth(device)  # before the models take memory
    with torch.inference_mode():
        arms, setup = build(a, device)
        say_arms({k: LABELS[k] for k in arms})
        print("preparation (excluded): " + ", ".join(f"{k} {v:.1f} s" for k, v in setup.items()), flush=True)
        names = list(arms)
        rate = {k: [] for k in names}
        req = {k: [] for k in names}
        same = True
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            ref = None
            for name in order:
                runs = [arms[name]() for _ in range(a.gens)]
                if runs[0][0] is not None:
                    rate[name].append(statistics.median(x[0] for x in runs))
                req[name].append(statistics.median(x[1] for x in runs))
                ref = runs[0][2] if ref is None else ref
                same = same and torch.equal(ref.cpu(), runs[0][2].cpu())
            print(f"round {r + 1} ({', '.join(order)}): decode compiled {rate['dlscale compiled'][-1]:.1f} eager "
                  f"{rate['dlscale eager'][-1]:.1f} tokens/s; request " +
                  ", ".join(f"{k} {req[k][-1] * 1e3:.1f}" for k in names) + " ms", flush=True)
    ratios = {
        "decode tokens/s, dlscale compiled / eager": [x / y for x, y in zip(rate["dlscale compiled"], rate["dlscale eager"])],
        "request, dlscale eager time / compiled time": [y / x for x, y in zip(req["dlscale compiled"], req["dlscale eager"])],
        "request, hf compiled time / dlscale compiled time": [y / x for x, y in zip(req["dlscale compiled"],
                                                                                    req["hf compiled"])],
        "request, hf eager time / dlscale eager time": [y / x for x, y in zip(req["dlscale eager"], req["hf eager"])],
        "request, hf eager time / hf compiled time": [y / x for x, y in zip(req["hf compiled"], req["hf eager"])],
    }
    if "dlscale graph-eager" in rate:
        ratios["decode tokens/s, dlscale graph-eager / eager"] = [x / y for x, y in zip(rate["dlscale graph-eager"],
                                                                                         rate["dlscale eager"])]
    print(f"same greedy tokens in all {len(names)} arms: {same}")
    for k in names:
        extra = f"decode {statistics.median(rate[k]):.1f} tokens/s, " if rate[k] else ""
        print(f"{k:19} {extra}request {statistics.median(req[k]) * 1e3:.1f} ms (medians)")
    limits = {k: against_limit(a, statistics.median(rate[k]), *copy_ref) for k in names if rate[k]}
    for k, v in ratios.items():
        print(f"{k:48} median {statistics.median(v):.3f}  (min {min(v):.3f}, max {max(v):.3f})")
    target = a.target if a.target is not None else (3.0 if a.device == "cuda" else 1.3)
    got = statistics.median(ratios["decode tokens/s, dlscale compiled / eager"])
    ok = got >= target and (same or a.precision != "fp32")  # bf16/fp16 kernels may flip a near-tied argmax
    print(f"{'PASS' if ok else 'FAIL'}: compiled / eager decode {got:.3f} (target >= {target}), same tokens {same}"
          f"{'' if a.precision == 'fp32' else ' (checked in fp32 only)'}")
    print(json.dumps({"benchmark": "inference.py decode", "model": a.model, "device": a.device, "precision": a.precision,
                      "batch_size": a.batch_size, "prompt_len": a.prompt_len, "output_len": a.output_len,
                      "rounds": a.rounds, "gens": a.gens, "same_tokens": same, "setup_s": setup,
                      "decode_tokens_s": rate, "request_s": req, "against_limit": limits,
                      "copy_gbps": copy_ref[0], "copy_source": copy_ref[1],
                      "median_ratios": {k: statistics.median(v) for k, v in ratios.items()}, "target": target,
                      "passed": ok}))
    raise SystemExit(0 if ok else 1)

