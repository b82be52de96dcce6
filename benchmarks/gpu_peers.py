"""The plain PyTorch programs `benchmarks/gpu_check.sh` sets beside dlscale: what a user would write
to time the same work without dlscale. Each subcommand prints one JSON line on stdout.

    python benchmarks/gpu_peers.py train --model resnet50 --batch 256 --precision bf16 --channels-last
    python benchmarks/gpu_peers.py matmul --n 8192 --precision bf16
    python benchmarks/gpu_peers.py copy --bytes 1073741824
    python benchmarks/gpu_peers.py generate --config '{"vocab_size": 32000, ...}' --batch 1 --prompt 128 --output 64 --mode eager
    python benchmarks/gpu_peers.py generate --config '{"vocab_size": 32000, ...}' --mode compiled
    python benchmarks/gpu_peers.py train-llm --config '{"vocab_size": 128256, ...}' --batch 4 --seq 2048 --compile --fused

They import torch, torchvision and transformers only (never dlscale), run on `--device cuda` (the
default where a GPU is visible) or `cpu` (the dry run), and time with CUDA events on a GPU and
the monotonic clock on a CPU, synchronising once around each timed window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Clock:
    """Marks on the device's timeline (CUDA events) or the host's clock (CPU); seconds between marks."""

    def __init__(self, device: torch.device, marks: int):
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(marks)] if self.cuda else []
        self.times: list[float] = []

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.times.append(time.perf_counter())

    def intervals(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.events, self.events[1:])]
        return [b - a for a, b in zip(self.times, self.times[1:])]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_steps(step, device: torch.device, warmup: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` training steps after ``warmup`` uncounted ones (one synchronise at the end)."""
    for _ in range(warmup):
        step()
    sync(device)
    clock = Clock(device, steps + 1)
    clock.mark(0)
    for i in range(steps):
        step()
        clock.mark(i + 1)
    return clock.intervals()


def train(a: argparse.Namespace, device: torch.device) -> dict:
    import torchvision

    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = torchvision.models.get_model(a.model, weights=None).to(device).to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=device).to(memory_format=fmt)
    y = torch.randint(0, 1000, (a.batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp = DTYPES[a.precision] if a.precision in ("bf16", "fp16") else None

    def step() -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    dts = timed_steps(step, device, a.warmup, a.steps)
    return {"peer": "train", "model": a.model, "batch": a.batch, "images_per_s": a.batch * len(dts) / sum(dts),
            "images_per_s_median_step": a.batch / statistics.median(dts)}


def window(fn, device: torch.device, calls: int, reps: int) -> float:
    """Median seconds per call over ``reps`` windows of ``calls`` back-to-back calls."""
    fn()
    sync(device)
    clock = Clock(device, reps + 1)
    clock.mark(0)
    for r in range(reps):
        for _ in range(calls):
            fn()
        clock.mark(r + 1)
    return statistics.median(clock.intervals()) / calls


def matmul(a: argparse.Namespace, device: torch.device) -> dict:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    x = torch.randn(a.n, a.n, device=device, dtype=DTYPES[a.precision])
    w = torch.randn(a.n, a.n, device=device, dtype=DTYPES[a.precision])
    t = window(lambda: x @ w, device, a.calls, a.reps)
    return {"peer": "matmul", "n": a.n, "precision": a.precision, "tflops": 2 * a.n ** 3 / t / 1e12}


def copy(a: argparse.Namespace, device: torch.device) -> dict:
    src = torch.empty(a.bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    t = window(lambda: dst.copy_(src), device, a.calls, a.reps)
    return {"peer": "copy", "bytes": a.bytes, "gbps": 2 * a.bytes / t / 1e9}  # read + write, as dlscale counts it


GENERATE_LABELS = {
    "eager": "transformers generate, eager: DynamicCache, compilation disabled (disable_compile=True)",
    "compiled": "transformers generate, compiled: StaticCache (cache_implementation='static') and its decode step under "
                "torch.compile(fullgraph, mode '{mode}'): {what}",
}


def llama(config: str, device: torch.device, dtype: torch.dtype):
    """A random-init Llama of the given LlamaConfig fields, made in its dtype on the device (no fp32 copy first)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device(device):
        return AutoModelForCausalLM.from_config(LlamaConfig(**json.loads(config)), dtype=dtype,
                                                attn_implementation="sdpa")


def generate(a: argparse.Namespace, device: torch.device) -> dict:
    """transformers' generate as a user calls it, greedy, a fixed output length. ``--mode eager``: its default
    DynamicCache with compilation switched off (generate compiles its decode step by itself only for a
    compileable cache on an accelerator: ``disable_compile`` is the switch that keeps it eager either way);
    ``--mode compiled``: the static cache with generate's own CompileConfig (reduce-overhead, i.e. CUDA
    graphs, on CUDA; Inductor's default mode on a CPU, where generate compiles only when told to). Its
    decode rate is derived from two request lengths: b·(N − 1) / (T(N) − T(1)), T the median request time."""
    from transformers import CompileConfig

    torch.manual_seed(0)
    model = llama(a.config, device, DTYPES[a.precision]).eval()
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.prompt), device=device)
    kw = dict(do_sample=False, use_cache=True, pad_token_id=0, attention_mask=torch.ones_like(ids))
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    if a.mode == "compiled":
        cc = CompileConfig(fullgraph=True, dynamic=False, mode=mode)
        cc._compile_all_devices = device.type != "cuda"  # generate compiles only on accelerators unless told
        kw.update(cache_implementation="static", compile_config=cc)
    else:
        kw.update(disable_compile=True)

    def median_request(n: int) -> float:
        times = []
        with torch.inference_mode():
            for _ in range(a.warmup + a.reps):
                sync(device)
                start = time.perf_counter()
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
                sync(device)
                times.append(time.perf_counter() - start)
        return statistics.median(times[a.warmup:])

    request, first = median_request(a.output), median_request(1)
    what = "Inductor's fused kernels replayed as CUDA graphs" if mode == "reduce-overhead" else "Inductor's fused kernels"
    return {"peer": "generate", "mode": a.mode, "label": GENERATE_LABELS[a.mode].format(mode=mode, what=what),
            "batch": a.batch, "prompt": a.prompt, "output": a.output, "request_s": request, "first_token_s": first,
            "output_tokens_per_s": a.batch * a.output / request,
            "decode_tokens_per_s": a.batch * (a.output - 1) / (request - first) if request > first else None}


def train_llm(a: argparse.Namespace, device: torch.device) -> dict:
    """A plain training loop of the same Llama as `dlscale train`: fp32 weights under bf16 autocast, next-token
    cross-entropy on fp32 logits, AdamW (fused with --fused), the model under torch.compile with --compile."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = llama(a.config, device, torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0, **({"fused": True} if a.fused else {}))
    fwd = torch.compile(model) if a.compile else model
    tokens = torch.randint(0, model.config.vocab_size, (a.batch, a.seq + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    amp = DTYPES[a.precision] if a.precision in ("bf16", "fp16") else None

    def step() -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            logits = fwd(x).logits
        F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    dts = timed_steps(step, device, a.warmup, a.steps)
    return {"peer": "train-llm", "batch": a.batch, "seq": a.seq, "compile": a.compile, "fused": a.fused,
            "tokens_per_s": a.batch * a.seq * len(dts) / sum(dts),
            "label": f"plain loop: bf16 autocast, AdamW{' fused' if a.fused else ''}"
                     f"{', torch.compile(model)' if a.compile else ', eager'}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model", default="resnet50")
    t.add_argument("--batch", type=int, default=256)
    t.add_argument("--image-size", type=int, default=224)
    t.add_argument("--precision", default="bf16", choices=sorted(DTYPES))
    t.add_argument("--channels-last", action="store_true")
    t.add_argument("--warmup", type=int, default=10)
    t.add_argument("--steps", type=int, default=60)
    m = sub.add_parser("matmul")
    m.add_argument("--n", type=int, default=8192)
    m.add_argument("--precision", default="bf16", choices=sorted(DTYPES))
    m.add_argument("--calls", type=int, default=10)
    m.add_argument("--reps", type=int, default=10)
    c = sub.add_parser("copy")
    c.add_argument("--bytes", type=int, default=2 ** 30)
    c.add_argument("--calls", type=int, default=10)
    c.add_argument("--reps", type=int, default=10)
    g = sub.add_parser("generate")
    g.add_argument("--config", required=True, help="LlamaConfig fields as JSON")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--prompt", type=int, default=128)
    g.add_argument("--output", type=int, default=64)
    g.add_argument("--precision", default="bf16", choices=sorted(DTYPES))
    g.add_argument("--mode", default="eager", choices=("eager", "compiled"))
    g.add_argument("--warmup", type=int, default=3)
    g.add_argument("--reps", type=int, default=5)
    tl = sub.add_parser("train-llm")
    tl.add_argument("--config", required=True, help="LlamaConfig fields as JSON")
    tl.add_argument("--batch", type=int, default=4)
    tl.add_argument("--seq", type=int, default=2048)
    tl.add_argument("--precision", default="bf16", choices=sorted(DTYPES))
    tl.add_argument("--compile", action="store_true")
    tl.add_argument("--fused", action="store_true")
    tl.add_argument("--warmup", type=int, default=10)
    tl.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    device = torch.device(a.device)
    run = {"train": train, "matmul": matmul, "copy": copy, "generate": generate, "train-llm": train_llm}[a.what]
    print(json.dumps(run(a, device)))


if __name__ == "__main__":
    main()
