"""The plain PyTorch peers: what a user would write to do dlscale's work without dlscale. The one peer module
of benchmarks/: `gpu_check.sh` runs its subcommands (each prints one JSON line on stdout), and the side-by-side
entry points (overhead.py, inference.py) build their plain arms from its steps (``sgd_step``, ``llama_step``,
``forward_loop``, ``generate_kwargs``), each with the label saying what it runs.

    python benchmarks/gpu_peers.py train --model resnet50 --batch 256 --precision bf16 --channels-last
    torchrun --nproc-per-node 8 benchmarks/gpu_peers.py train --model resnet50 --batch 128   (a plain DDP loop)
    python benchmarks/gpu_peers.py matmul --n 8192 --precision bf16
    python benchmarks/gpu_peers.py copy --bytes 1073741824
    python benchmarks/gpu_peers.py generate --config '{"vocab_size": 32000, ...}' --batch 1 --prompt 128 --output 64 --mode eager
    python benchmarks/gpu_peers.py generate --config '{"vocab_size": 32000, ...}' --mode compiled
    python benchmarks/gpu_peers.py train-llm --config '{"vocab_size": 128256, ...}' --batch 4 --seq 2048 --compile --fused

They import torch, torchvision and transformers only (never dlscale), run on `--device cuda` (the
default where a GPU is visible) or `cpu` (the dry run), and time with CUDA events on a GPU and
the monotonic clock on a CPU, synchronising once around each timed window. Under torchrun (or in a
process that joined a process group, as the ranks of `overhead.py ddp` do) `train` is a plain DDP
loop: the model wrapped in DistributedDataParallel with `--broadcast-buffers` and `--bucket-view` as
given (torch's defaults: on and off), a barrier before the window, and images/s over all ranks in the
slowest rank's window; rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

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


def timed_steps(step, device: torch.device, warmup: int, steps: int, barrier=None) -> list[float]:
    """Seconds of each of ``steps`` training steps after ``warmup`` uncounted ones (one synchronise at the end);
    ``barrier``: called between the warm-up and the window (every rank of a DDP loop starts it together)."""
    for _ in range(warmup):
        step()
    sync(device)
    if barrier is not None:
        barrier()
    clock = Clock(device, steps + 1)
    clock.mark(0)
    for i in range(steps):
        step()
        clock.mark(i + 1)
    return clock.intervals()


def vision_model(name: str, device: torch.device, channels_last: bool) -> torch.nn.Module:
    """torchvision's ``name``, random init, on the device, in channels_last when asked."""
    import torchvision

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torchvision.models.get_model(name, weights=None).to(device).to(memory_format=fmt)


def sgd_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str, device: torch.device,
             lr: float = 0.1):
    """The plain training step a user writes: autocast (bf16/fp16), cross-entropy, backward, SGD with momentum
    and weight decay, gradients set to None; ``step(xb, yb)`` trains on another batch. Every plain CNN training
    arm of benchmarks/ runs this step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    amp = DTYPES[precision] if precision in ("bf16", "fp16") else None

    def step(xb: torch.Tensor = x, yb: torch.Tensor = y) -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def sgd_label(precision: str, ddp: str = "") -> str:
    """What a plain SGD arm runs, said in its label."""
    return f"plain PyTorch loop (benchmarks/gpu_peers.py sgd_step): {precision}, eager, SGD{ddp}"


def train(a: argparse.Namespace, device: torch.device) -> dict:
    torch.backends.cudnn.benchmark = True
    model = vision_model(a.model, device, a.channels_last)
    ddp = dist.is_initialized() and not getattr(a, "alone", False)  # ``alone``: no DDP in a rank (a caller's A/B)
    world = dist.get_world_size() if ddp else 1
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                    broadcast_buffers=a.broadcast_buffers, gradient_as_bucket_view=a.bucket_view)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=device)
    x = x.contiguous(memory_format=torch.channels_last if a.channels_last else torch.contiguous_format)
    y = torch.randint(0, 1000, (a.batch,), device=device)
    step = sgd_step(model, x, y, a.precision, device)
    dts = timed_steps(step, device, a.warmup, a.steps, barrier=dist.barrier if ddp else None)
    window = torch.tensor([sum(dts)], device=device)  # on the GPU where NCCL reduces it
    if ddp:  # every rank's images over the slowest rank's window
        dist.all_reduce(window, op=dist.ReduceOp.MAX)
    how = (f", DDP broadcast_buffers={a.broadcast_buffers} gradient_as_bucket_view={a.bucket_view}" if ddp else "")
    return {"peer": "train", "label": sgd_label(a.precision, how), "model": a.model, "batch": a.batch, "ranks": world,
            "images_per_s": world * a.batch * len(dts) / window.item(),
            "images_per_s_median_step": a.batch / statistics.median(dts)}


def forward_loop(model: torch.nn.Module, x: torch.Tensor):
    """The plain inference loop: ``run(n)`` makes n eager forwards of ``x`` under inference_mode and returns the
    seconds on the host's clock (no device synchronise: the CPU arms of overhead.py run it)."""
    def run(n: int) -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(n):
                model(x)
            return time.perf_counter() - t0

    return run


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


def generate_kwargs(mode: str, ids: torch.Tensor, device: torch.device) -> tuple[dict, str]:
    """generate's keyword arguments for ``mode`` (eager or compiled; greedy, the cache on, output length not
    included) and the label saying what that runs. Every generate arm of benchmarks/ takes them from here."""
    from transformers import CompileConfig

    kw = dict(do_sample=False, use_cache=True, pad_token_id=0, attention_mask=torch.ones_like(ids))
    how = "reduce-overhead" if device.type == "cuda" else "default"
    if mode == "compiled":
        cc = CompileConfig(fullgraph=True, dynamic=False, mode=how)
        cc._compile_all_devices = device.type != "cuda"  # generate compiles only on accelerators unless told
        kw.update(cache_implementation="static", compile_config=cc)
    else:
        kw.update(disable_compile=True)
    what = "Inductor's fused kernels replayed as CUDA graphs" if how == "reduce-overhead" else "Inductor's fused kernels"
    return kw, GENERATE_LABELS[mode].format(mode=how, what=what)


def generate(a: argparse.Namespace, device: torch.device) -> dict:
    """transformers' generate as a user calls it, greedy, a fixed output length. ``--mode eager``: its default
    DynamicCache with compilation switched off (generate compiles its decode step by itself only for a
    compileable cache on an accelerator: ``disable_compile`` is the switch that keeps it eager either way);
    ``--mode compiled``: the static cache with generate's own CompileConfig (reduce-overhead, i.e. CUDA
    graphs, on CUDA; Inductor's default mode on a CPU, where generate compiles only when told to). Its
    decode rate is derived from two request lengths: b·(N − 1) / (T(N) − T(1)), T the median request time."""
    torch.manual_seed(0)
    model = llama(a.config, device, DTYPES[a.precision]).eval()
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.prompt), device=device)
    kw, label = generate_kwargs(a.mode, ids, device)

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
    return {"peer": "generate", "mode": a.mode, "label": label,
            "batch": a.batch, "prompt": a.prompt, "output": a.output, "request_s": request, "first_token_s": first,
            "output_tokens_per_s": a.batch * a.output / request,
            "decode_tokens_per_s": a.batch * (a.output - 1) / (request - first) if request > first else None}


def train_llm(a: argparse.Namespace, device: torch.device) -> dict:
    """A plain training loop of the same Llama as `dlscale train`: fp32 weights under bf16 autocast, next-token
    cross-entropy on fp32 logits, AdamW (fused with --fused), the model under torch.compile with --compile."""
    torch.manual_seed(0)
    model = llama(a.config, device, torch.float32).train()
    tokens = torch.randint(0, model.config.vocab_size, (a.batch, a.seq + 1), device=device)
    step = llama_step(model, tokens, a.precision, a.fused, a.compile)
    dts = timed_steps(step, device, a.warmup, a.steps)
    return {"peer": "train-llm", "batch": a.batch, "seq": a.seq, "compile": a.compile, "fused": a.fused,
            "tokens_per_s": a.batch * a.seq * len(dts) / sum(dts), "label": llama_label(a.precision, a.fused, a.compile)}


def llama_step(model: torch.nn.Module, tokens: torch.Tensor, precision: str, fused: bool = False,
               compile: bool = False, weight_decay: float = 0.0):
    """The plain Llama training step: next-token cross-entropy on fp32 logits under autocast (bf16/fp16), AdamW
    (fused with ``fused``), the model under torch.compile with ``compile``. Every plain LLM training arm runs it."""
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=weight_decay, **({"fused": True} if fused else {}))
    fwd = torch.compile(model) if compile else model
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    amp = DTYPES[precision] if precision in ("bf16", "fp16") else None

    def step() -> None:
        with torch.autocast(x.device.type, dtype=amp, enabled=amp is not None):
            logits = fwd(x).logits
        F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def llama_label(precision: str, fused: bool, compile: bool) -> str:
    return (f"plain transformers loop (benchmarks/gpu_peers.py llama_step): {precision} autocast, "
            f"AdamW{' fused' if fused else ''}, {'torch.compile(model)' if compile else 'eager'}")


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
    t.add_argument("--broadcast-buffers", action=argparse.BooleanOptionalAction, default=True,
                   help="DDP: re-broadcast buffers at every forward (torch's default: on)")
    t.add_argument("--bucket-view", action=argparse.BooleanOptionalAction, default=False,
                   help="DDP: gradients as views into the buckets (torch's default: off)")
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
    if "WORLD_SIZE" in os.environ:  # under torchrun: one rank of a plain DDP loop, on its own GPU
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    run = {"train": train, "matmul": matmul, "copy": copy, "generate": generate, "train-llm": train_llm}[a.what]
    got = run(a, device)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(json.dumps(got))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
