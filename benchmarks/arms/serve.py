"""`inference.py serve`: a served LLM measured by `dlscale serve-bench`: `transformers serve` with continuous batching on a zoo shape.

Writes the shape's local model folder (random weights in its dtype and a word-level tokenizer of its
vocabulary: dlscale.serve.localmodel; nothing downloaded), starts `transformers serve FOLDER
--continuous-batching` on loopback on the device, waits for /health, runs `dlscale serve-bench` at each
concurrency with an SLO (goodput: the requests meeting it; joules per output token from the device's
energy counters, which serve-bench reads where the server runs here), prints serve-bench's JSON record
on stdout and stops the server. Progress and the server's log tail (on failure) go to stderr.

    python benchmarks/inference.py serve --model llama_7b --precision bf16 --device cuda           # the GPU check's
    python benchmarks/inference.py serve --model llama_tiny --precision fp32 --device cpu --concurrencies 1,2 \
        --requests 6 --prompt-len 16 --output-len 8 --slo ttft=60,tpot=10                     # its CPU dry run

Needs transformers' `serving` extra (fastapi, uvicorn, openai, pydantic and theirs): a machine without
them (the GPU image) gets them as wheels, see benchmarks/gpu_wheels.txt. Exit 1 when the server does not
come up or serve-bench fails, 2 when the serving packages are missing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arms.client import free_port, wait_up  # the same loopback port and start-up wait

CPU_KV_CACHE = ("--cb-num-blocks", "64", "--cb-block-size", "32", "--cb-max-batch-tokens", "256")  # as the tests'


def say(msg: str) -> None:
    print(f"inference.py serve: {msg}", file=sys.stderr, flush=True)


def missing_serving() -> list[str]:
    from importlib.util import find_spec

    return [m for m in ("fastapi", "uvicorn", "openai", "pydantic", "starlette") if find_spec(m) is None]


def write(a: argparse.Namespace, folder: Path) -> None:
    import torch

    from dlscale.serve.localmodel import write_model

    t0 = time.perf_counter()
    write_model(folder, a.model, a.precision, torch.device(a.device))
    if a.device == "cuda":
        torch.cuda.empty_cache()
    size = sum(f.stat().st_size for f in folder.iterdir())
    say(f"{a.model} {a.precision} written to {folder} ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")


def serve(a: argparse.Namespace, folder: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
           "serve", str(folder), "--continuous-batching", "--device", a.device, "--host", "127.0.0.1",
           "--port", str(port), *(CPU_KV_CACHE if a.device == "cpu" else ())]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, proc, a.start_timeout)
    except BaseException:
        stop(proc)
        say(f"the server's log ends: {log.read_text()[-1500:]}")
        raise
    say(f"transformers serve up at {url} in {time.perf_counter() - t0:.1f} s")
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def bench(a: argparse.Namespace, url: str, folder: Path) -> int:
    cmd = [sys.executable, "-m", "dlscale.cli.app", "serve-bench", url, "--model", str(folder), "--tokenizer",
           str(folder), "--concurrencies", a.concurrencies, "--requests", str(a.requests), "--duration",
           str(a.duration), "--warmup", str(a.warmup), "--prompt-len", str(a.prompt_len), "--output-len",
           str(a.output_len), "--slo", a.slo, "--no-calibrate", "--tag", "gpu-check", "--format", "json"]
    if a.db:
        cmd += ["--db", a.db]
    return subprocess.run(cmd).returncode  # its JSON record straight to our stdout


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama_7b")
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--concurrencies", default="1,8,32")
    ap.add_argument("--requests", type=int, default=64, help="requests per load point at most")
    ap.add_argument("--duration", type=float, default=25.0, help="seconds per load point at most")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--slo", default="mlperf-llama3.1-8b", help="serve-bench's --slo: a preset or ttft=S,tpot=S")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--db", default=None, help="serve-bench's --db (default: $DLSCALE_DB)")


def run(a: argparse.Namespace) -> int:
    missing = missing_serving()
    if missing:
        say(f"transformers serve needs its serving extra; missing here: {', '.join(missing)} (carry the wheels of "
            "benchmarks/gpu_wheels.txt)")
        return 2
    with tempfile.TemporaryDirectory(prefix="dlscale-serve-") as tmp:
        folder = Path(tmp) / a.model
        write(a, folder)
        proc, url = serve(a, folder, Path(tmp) / "serve.log")
        try:
            return 1 if bench(a, url, folder) else 0
        finally:
            stop(proc)

