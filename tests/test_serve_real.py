"""serve-bench against a real server: `transformers serve` with continuous batching on a tiny random Llama.

The model (4 layers, hidden size 64) and its word-level tokenizer are written here; the server runs
on loopback for this module and is stopped by it. Assumes transformers' `serving` extra (fastapi,
uvicorn, openai; the `test` extra installs it) and that this CPU runs a float32 Llama.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import free_port
from serve_model import write_tiny_llama

pytestmark = pytest.mark.slow

START_S = 300  # a busy 2-core machine loads torch and the model slowly
# a small paged KV cache: sized by default from the machine's memory, it took 13.7 GB here for a 4-layer model
KV_CACHE = ("--cb-num-blocks", "64", "--cb-block-size", "32", "--cb-max-batch-tokens", "256")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("fastapi", reason="transformers serve needs its serving extra (fastapi, uvicorn)")
    pytest.importorskip("uvicorn", reason="transformers serve needs its serving extra (fastapi, uvicorn)")
    model = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
           "serve", str(model), "--continuous-batching", *KV_CACHE, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"transformers serve did not start: {log.read()[-2000:]}")
                time.sleep(1)
        yield url, str(model)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_streamed_completions_give_every_figure(server, cli, db_path):
    url, model = server
    r = cli("serve-bench", url, "--model", model, "--concurrencies", "1,2", "--requests", "4", "--prompt-len", "16",
            "--output-len", "6", "--warmup", "1", "--slo", "ttft=60,tpot=10", "--format", "json")
    assert r.code == 0, r.stderr
    import json

    rec = json.loads(r.stdout)
    m = rec["metrics"]
    assert m["completed_total"] == 8 and m["failed_total"] == 0
    for k in ("ttft_p99_s", "tpot_median_s", "itl_median_s", "e2e_p90_s", "request_throughput", "output_throughput",
              "total_token_throughput", "tokens_per_s_per_user", "goodput", "client_ttft_overhead_s", "lag_p99_s"):
        assert m[k] is not None and m[k] > 0, k
    assert m["max_load_meeting_slo"] == 2 and m["slo_binding"] == "none"
    c = rec["config"]
    assert c["prompt_len_source"] == "tokenizer" and c["token_count_source"].startswith("usage")
    # transformers serve refuses ignore_eos/min_tokens (HTTP 422): lengths are the model's up to max_tokens
    assert c["fixed_output_accepted"] is False and any("ignore_eos" in w for w in rec["warnings"])
    assert all(0 < n <= 6 for p in rec["raw"]["points"] for n in p["requests"]["output_tokens"])
    assert m["prompt_tokens"] >= 16 * 4


def test_chat_streamed_and_not(server, db_path):
    from dlscale import api

    url, model = server
    for stream in (True, False):
        rec = api.serve_bench(url, model, api="chat", stream=stream, requests=2, warmup=0, prompt_len="8",
                              output_len="4", calibrate=False)
        assert rec.status == "ok" and rec.metrics["completed"] == 2
        assert (rec.metrics["ttft_median_s"] is not None) == stream
        assert rec.metrics["e2e_median_s"] > 0


def test_find_max_rate_names_the_binding_slo(server, db_path):
    from dlscale import api

    url, model = server
    # a TPOT bound no CPU meets: the lowest rate already misses it, and the answer says TPOT binds
    rec = api.serve_bench(url, model, rates="1,4", requests=3, warmup=0, prompt_len="8", output_len="4",
                          slo="ttft=60,tpot=0.000001", find_max=True, max_points=2, calibrate=False)
    assert rec.metrics["max_load_meeting_slo"] is None and rec.metrics["slo_binding"] == "tpot"
    assert "tpot" in rec.raw["answer"]["reason"]


def test_loadgen_token_latencies_on_the_real_server(server, db_path):
    from dlscale import api

    url, model = server
    rec = api.serve_bench(url, model, rates="2", requests=4, warmup=0, prompt_len="8", output_len="4",
                          slo="mlperf-llama2-70b", loadgen=True, calibrate=False)
    m = rec.metrics
    assert rec.status == "ok" and m["completed"] == 4
    assert m["mlperf_ttft_p99_s"] > 0 and m["mlperf_completed_tokens_per_s"] > 0
