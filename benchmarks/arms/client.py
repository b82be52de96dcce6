"""`inference.py client`: dlscale serve-bench side by side with NVIDIA AIPerf on the same server and load, alternating A/B.

Two servers, each on loopback:
(a) dlscale's instant server (``serve.instant``) in its own process: every answer at once, so the TTFT
    each client measures is that client's own overhead (with the loopback and the tiny server);
(b) ``transformers serve --continuous-batching`` on a 4-layer random Llama with a word-level tokenizer
    written locally (tests/serve_model.py), on the CPU.
On each, ``--rounds`` times: dlscale, then AIPerf, each ``--requests`` streamed /v1/completions at
``--concurrency`` in flight, ``--prompt-len`` prompt and ``--output-len`` output tokens. Printed per
round and as medians over the rounds: TTFT median, the per-request decode time per token median
(dlscale's TPOT, AIPerf's "inter token latency", the same formula: (e2e - TTFT) / (tokens - 1)),
dlscale's ITL median (every gap between tokens) and request throughput, with dlscale / AIPerf ratios,
and the CPU seconds each client's whole command used (start-up included): on a machine whose cores
the server shares, a client's CPU is taken from the server.

AIPerf comes from PyPI into its own venv (``--aiperf``, default /tmp/aiperf-venv/bin/aiperf; made with
``python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf``), never into dlscale's.

    .venv/bin/python benchmarks/inference.py client --rounds 3 --requests 40 --concurrency 2
    .venv/bin/python benchmarks/inference.py client --rounds 5 --servers transformers --pin   # server and clients apart
    .venv/bin/python benchmarks/inference.py client --rounds 5 --servers transformers --burn  # + dlscale beside a spinner
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # serve_model: the tiny Llama and tokenizer the tests serve


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the server at {url} exited with {proc.returncode}")
            time.sleep(1)
    raise SystemExit(f"the server at {url} did not start in {timeout_s:g} s")


def pinned(cpus: set[int] | None):
    """A preexec_fn that keeps a child (and its children) on ``cpus``; None leaves it where it is."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


PIN = {"server": None, "client": None}  # --pin: the server on the first CPU, the clients on the others


def start(kind: str, model_dir: Path, log: Path) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "DLSCALE_QUIET": "1"}
    if kind == "instant":
        code = ("import time; from dlscale.serve.instant import InstantServer\n"
                f"with InstantServer(model='instant', port={port}):\n    time.sleep(10**6)")
        cmd, model = [sys.executable, "-c", code], "instant"
    else:
        cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
               "serve", str(model_dir), "--continuous-batching", "--cb-num-blocks", "64", "--cb-block-size", "32",
               "--cb-max-batch-tokens", "256", "--device", "cpu", "--host", "127.0.0.1",
               "--port", str(port)]
        model = str(model_dir)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=pinned(PIN["server"]))
    url = f"http://127.0.0.1:{port}"
    wait_up(url, proc)
    return proc, url, model


def cpu_of_children() -> float:
    """CPU seconds (user + system) of every child waited for so far, their own children included."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dlscale_run(url: str, model: str, tok: Path, a: argparse.Namespace, db: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "dlscale.cli.app", "serve-bench", url, "--model", model, "--tokenizer", str(tok),
           "--concurrencies", str(a.concurrency), "--requests", str(a.requests), "--warmup", "2",
           "--prompt-len", str(a.prompt_len), "--output-len", str(a.output_len), "--no-calibrate",
           "--db", str(db), "--format", "json"]
    cpu = cpu_of_children()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DLSCALE_QUIET": "1"}, timeout=1200,
                       preexec_fn=pinned(PIN["client"]))
    if p.returncode:
        raise SystemExit(f"dlscale failed: {p.stderr[-800:]}")
    m = json.loads(p.stdout)["metrics"]
    return {"ttft_ms": m["ttft_median_s"] * 1e3, "tpot_ms": m["tpot_median_s"] * 1e3,
            "itl_ms": m["itl_median_s"] * 1e3, "req_s": m["request_throughput"], "cpu_s": cpu_of_children() - cpu}


def aiperf_run(url: str, model: str, tok: Path, a: argparse.Namespace, out: Path) -> dict[str, float]:
    cmd = [a.aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
           "--concurrency", str(a.concurrency), "--request-count", str(a.requests), "--warmup-request-count", "2",
           "--prompt-input-tokens-mean", str(a.prompt_len), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(a.output_len), "--prompt-output-tokens-stddev", "0",
           "--tokenizer", str(tok), "--use-server-token-count", "--output-artifact-dir", str(out), "--ui-type", "none"]
    cpu = cpu_of_children()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, preexec_fn=pinned(PIN["client"]))
    if p.returncode:
        raise SystemExit(f"aiperf failed: {p.stdout[-800:]} {p.stderr[-800:]}")
    d = json.loads((out / "profile_export_aiperf.json").read_text())
    return {"ttft_ms": d["time_to_first_token"]["p50"], "tpot_ms": d["inter_token_latency"]["p50"],
            "itl_ms": float("nan"), "req_s": d["request_throughput"]["avg"], "cpu_s": cpu_of_children() - cpu}


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def burning(a: argparse.Namespace):
    """--burn: a process spinning on one CPU beside the client, as much CPU as AIPerf's took more than dlscale's."""
    import contextlib

    @contextlib.contextmanager
    def spin():
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pinned(PIN["client"]))
        try:
            yield
        finally:
            p.kill()
            p.wait()

    return spin() if a.burn else contextlib.nullcontext()


def compare(kind: str, url: str, model: str, tok: Path, a: argparse.Namespace, work: Path) -> None:
    rows: dict[str, list[dict[str, float]]] = {"dlscale": [], "aiperf": []}
    if a.burn:
        rows["dlscale+burn"] = []
    for i in range(a.rounds):
        rows["dlscale"].append(dlscale_run(url, model, tok, a, work / "db.sqlite"))
        rows["aiperf"].append(aiperf_run(url, model, tok, a, work / f"aiperf-{kind}-{i}"))
        if a.burn:
            with burning(a):
                rows["dlscale+burn"].append(dlscale_run(url, model, tok, a, work / "db.sqlite"))
            b = rows["dlscale+burn"][-1]
            print(f"  round {i + 1}: dlscale with a spinning process beside it: TTFT {b['ttft_ms']:.4f} ms "
                  f"TPOT {b['tpot_ms']:.4f} ms {b['req_s']:.2f} req/s", flush=True)
        d, p = rows["dlscale"][-1], rows["aiperf"][-1]
        print(f"  round {i + 1}: dlscale TTFT {d['ttft_ms']:.4f} ms TPOT {d['tpot_ms']:.4f} ms ITL {d['itl_ms']:.4f} ms "
              f"{d['req_s']:.2f} req/s | aiperf TTFT {p['ttft_ms']:.4f} ms ITL(per request) {p['tpot_ms']:.4f} ms "
              f"{p['req_s']:.2f} req/s | client CPU s (whole command) dlscale {d['cpu_s']:.1f} aiperf {p['cpu_s']:.1f}  "
              f"({load_line()})", flush=True)
    med = {who: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for who, rs in rows.items()}
    d, p = med["dlscale"], med["aiperf"]
    print(f"{kind}: medians over {a.rounds} rounds: TTFT dlscale {d['ttft_ms']:.4f} ms / aiperf {p['ttft_ms']:.4f} ms "
          f"= {ratio(d['ttft_ms'], p['ttft_ms']):.3f}; per-request ITL (TPOT) {d['tpot_ms']:.4f} / {p['tpot_ms']:.4f} = "
          f"{ratio(d['tpot_ms'], p['tpot_ms']):.3f}; dlscale per-gap ITL {d['itl_ms']:.4f} ms; request throughput "
          f"{d['req_s']:.3f} / {p['req_s']:.3f} = {ratio(d['req_s'], p['req_s']):.3f}; client CPU s {d['cpu_s']:.1f} / "
          f"{p['cpu_s']:.1f}", flush=True)
    if a.burn:
        b = med["dlscale+burn"]
        print(f"{kind}: dlscale with a spinning process beside it: TTFT {b['ttft_ms']:.4f} ms, TPOT {b['tpot_ms']:.4f} ms, "
              f"{b['req_s']:.3f} req/s (medians)", flush=True)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--servers", default="instant,transformers")
    ap.add_argument("--aiperf", default="/tmp/aiperf-venv/bin/aiperf")
    ap.add_argument("--pin", action="store_true", help="the server on the first CPU, each client on the others: "
                                                      "a client's CPU no longer taken from the server's core")
    ap.add_argument("--burn", action="store_true", help="a third arm: dlscale with a process spinning beside it, "
                                                       "to see what a client's CPU takes from a server on the same cores")


def run(a: argparse.Namespace) -> None:
    from arms import say_arms

    say_arms({"dlscale": "dlscale serve-bench (streamed /v1/completions, its own client)",
              "aiperf": f"NVIDIA AIPerf profile from {a.aiperf} (streamed completions, --use-server-token-count)",
              **({"dlscale+burn": "dlscale serve-bench beside a process spinning on the client's CPU"} if a.burn else {})})
    if a.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("--pin needs two CPUs")
        PIN.update(server={cpus[0]}, client=set(cpus[1:]))
    from serve_model import write_tiny_llama

    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {load_line()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dlscale-peer-") as tmp:
        work = Path(tmp)
        model_dir = write_tiny_llama(work / "tiny-llama")
        for kind in a.servers.split(","):
            proc, url, model = start(kind, model_dir, work / f"{kind}.log")
            try:
                compare(kind, url, model, model_dir, a, work)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)

