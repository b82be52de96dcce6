"""serve-bench against an in-process server with injected faults, and bad input (one line, exit 2)."""

from __future__ import annotations

import asyncio
import http.server
import itertools
import threading

import pytest

from dlscale import api
from dlscale.errors import RunFailure, UsageError
from dlscale.serve.instant import InstantServer, chunk, event, instant_answer

QUICK = dict(requests=6, warmup=0, calibrate=False, output_len="4", prompt_len="4", timeout=5.0)


def _faulty(every: int, fault):
    """A handler that answers instantly but gives every ``every``-th request ``fault``."""
    count = itertools.count()

    async def handler(request, body):
        if next(count) % every == every - 1:
            return await fault(request, body)
        return await instant_answer(request, body)

    return handler


async def _stream(request, events: list[bytes], close: bool = False):
    from aiohttp import web

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for e in events:
        await resp.write(e)
    if close:
        request.transport.close()  # the connection dropped mid-answer
    return resp


async def http_500(request, body):
    from aiohttp import web

    return web.Response(status=500, text="internal error")


async def too_slow(request, body):
    await asyncio.sleep(30)


async def dropped(request, body):
    return await _stream(request, [event(chunk(" a", False)), event(chunk(" b", False))], close=True)


async def ended_early(request, body):
    return await _stream(request, [event(chunk(" a", False))])  # a clean close with no finish_reason or [DONE]


async def malformed(request, body):
    return await _stream(request, [event(chunk(" a", False)), b"data: {not json\n\n"])


async def error_event(request, body):
    return await _stream(request, [event({"error": {"message": "overloaded"}})])


@pytest.mark.parametrize("fault,kind", [(http_500, "http_500"), (too_slow, "timeout"), (dropped, "dropped_stream"),
                                        (ended_early, "dropped_stream"), (malformed, "malformed_event"),
                                        (error_event, "error_event")])
def test_faults_are_counted_by_kind(db_path, fault, kind):
    # the probe is request 0: the fault hits the point's second and fifth requests
    with InstantServer(model="m", handler=_faulty(3, fault)) as srv:
        rec = api.serve_bench(srv.url, "m", **{**QUICK, "timeout": 1.0 if kind == "timeout" else 5.0})
    assert rec.status == "ok"
    assert rec.metrics[f"errors_{kind}"] == 2
    assert (rec.metrics["completed"], rec.metrics["failed"]) == (4, 2)
    details = [d for d in rec.raw["points"][0]["requests"]["detail"] if d]
    assert len(details) == 2


def test_slow_first_token_shows_in_ttft_not_tpot(db_path):
    async def slow_first(request, body):
        await asyncio.sleep(0.3)
        return await instant_answer(request, body)

    with InstantServer(model="m", handler=slow_first) as srv:
        rec = api.serve_bench(srv.url, "m", **{**QUICK, "output_len": "8"})
    assert rec.metrics["ttft_median_s"] >= 0.3
    assert rec.metrics["tpot_median_s"] < rec.metrics["ttft_median_s"] / 10


def test_every_request_failing_is_a_failed_run(db_path):
    with InstantServer(model="m", handler=_faulty(1, http_500)) as srv, pytest.raises(UsageError, match="two-token"):
        api.serve_bench(srv.url, "m", **QUICK)  # the probe itself fails: bad input, nothing recorded
    count = itertools.count()

    async def after_probe(request, body):
        return await (instant_answer if next(count) == 0 else http_500)(request, body)

    with InstantServer(model="m", handler=after_probe) as srv, pytest.raises(RunFailure, match="no request completed"):
        api.serve_bench(srv.url, "m", **{**QUICK, "requests": 3})


def test_server_dying_mid_run_is_a_failed_run_with_what_completed(db_path):
    from dlscale.store import Store

    srv = InstantServer(model="m")
    count = itertools.count()

    async def dies(request, body):
        if next(count) == 6:  # the probe, then five answers
            srv._loop.call_soon(srv._loop.stop)
            request.transport.close()
        return await instant_answer(request, body)

    srv.handler = dies
    with srv, pytest.raises(RunFailure) as e:
        api.serve_bench(srv.url, "m", **{**QUICK, "requests": 20, "timeout": 2.0})
    with Store.open(str(db_path)) as s:
        rec = s.get(e.value.run_id)
    assert rec.status == "failed" and "stopped answering" in rec.error
    assert rec.metrics["completed_total"] == 5
    assert rec.raw["points"][0]["stopped_by"] == "server_down"


class _NotOpenAI(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>hello</html>")

    def log_message(self, *args):
        pass


def test_bad_input_is_one_line_and_exit_2(cli, db_path, tmp_path):
    from conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotOpenAI)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        with InstantServer(model="m") as srv:
            cases = [([dead, "--model", "m"], "cannot reach"),
                     ([f"http://127.0.0.1:{web.server_address[1]}", "--model", "m"], "not an OpenAI-compatible server"),
                     ([srv.url, "--model", "other"], "unknown model 'other'"),
                     ([srv.url, "--model", "m", "--slo", "ttft=abc"], "--slo"),
                     ([srv.url, "--model", "m", "--prompt-len", "gauss:1:2"], "--prompt-len"),
                     ([srv.url, "--model", "m", "--dataset", str(tmp_path / "none.json")], "cannot read"),
                     ([srv.url, "--model", "m", "--find-max"], "--slo")]
            for args, words in cases:
                r = cli("serve-bench", *args, "--requests", "2", "--no-calibrate")
                assert r.code == 2, (args, r.stderr)
                errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
                assert len(errors) == 1 and words in errors[0], r.stderr
    finally:
        web.shutdown()
    assert cli("results", "list", "--kind", "serving", "--format", "json").stdout.strip() == "[]"


def test_api_key_is_sent_but_never_recorded(db_path, monkeypatch, cli):
    seen = []

    async def check_key(request, body):
        seen.append(request.headers.get("Authorization"))
        return await instant_answer(request, body)

    monkeypatch.setenv("MY_SERVING_KEY", "sk-secret-123")
    with InstantServer(model="m", handler=check_key) as srv:
        r = cli("serve-bench", srv.url, "--model", "m", "--api-key-env", "MY_SERVING_KEY", "--requests", "2",
                "--warmup", "0", "--no-calibrate", "--format", "json")
    assert r.code == 0, r.stderr
    assert seen and set(seen) == {"Bearer sk-secret-123"}
    assert "sk-secret-123" not in r.stdout + r.stderr
    dump = cli("results", "export", "--format", "json").stdout
    assert "sk-secret-123" not in dump and "MY_SERVING_KEY" in dump


def test_loadgen_server_scenario_with_token_latencies(db_path, cli):
    """LoadGen issues the queries; first tokens and completions go back to it; its summary is read."""
    with InstantServer(model="m") as srv:
        rec = api.serve_bench(srv.url, "m", rates="50", requests=30, duration=30, warmup=0, calibrate=False,
                              output_len="8", prompt_len="4", slo="mlperf-llama2-70b", loadgen=True)
        bad = cli("serve-bench", srv.url, "--model", "m", "--loadgen", "--concurrencies", "2", "--slo", "ttft=1,tpot=1")
    m = rec.metrics
    assert rec.status == "ok" and m["completed"] == 30 and m["output_tokens"] == 240
    assert (m["mlperf_ttft_bound_s"], m["mlperf_tpot_bound_s"]) == (2.0, 0.2)
    assert m["mlperf_completed_tokens_per_s"] > 0 and m["mlperf_result"] in ("VALID", "INVALID")
    assert 0 < m["mlperf_ttft_p99_s"] < 2.0 and 0 < m["mlperf_tpot_p99_s"] < 0.2
    assert "Early stopping" in rec.raw["loadgen_summary"]
    assert bad.code == 2 and "--loadgen" in bad.stderr


async def no_usage(request, body):
    """Two words per event and no usage: the count must come from the tokenizer, else from the events."""
    return await _stream(request, [event(chunk(" w1 w2", False)) for _ in range(4)] +
                         [event(chunk("", False, "length")), b"data: [DONE]\n\n"])


def test_token_counts_without_usage(db_path, tmp_path):
    from serve_model import write_tokenizer_json

    tok = write_tokenizer_json(tmp_path / "tok")
    with InstantServer(model="m", handler=_faulty(1, no_usage)) as srv:
        counted = api.serve_bench(srv.url, "m", tokenizer=str(tok), **{**QUICK, "requests": 2})
        chunks = api.serve_bench(srv.url, "m", **{**QUICK, "requests": 2})
    assert counted.metrics["output_tokens"] == 2 * 8 and counted.config["token_count_source"] == "tokenizer: 2"
    assert counted.metrics["tokens_per_event"] == 2.0
    assert chunks.metrics["output_tokens"] == 2 * 4 and chunks.config["token_count_source"] == "chunks: 2"
    cols = chunks.raw["points"][0]["requests"]
    assert [len(t) for t in cols["token_times"]] == [4, 4]  # every text event's arrival, from the point's start
    assert all(cols["sent"][i] <= t[0] == cols["first"][i] <= t[-1] <= cols["end"][i]
               for i, t in enumerate(cols["token_times"]))
    assert any("text events" in w for w in chunks.warnings)


def test_every_point_is_bounded_in_time(db_path):
    with InstantServer(model="m") as srv:
        rec = api.serve_bench(srv.url, "m", **{**QUICK, "rates": "4", "requests": 1000, "duration": 0.5})
    assert rec.raw["points"][0]["stopped_by"] == "duration"
    assert 0 < rec.metrics["requests_sent"] < 1000
    assert any("--duration ended" in w for w in rec.warnings)


# -- the load as asked and as it was ---------------------------------------------------------------------

def test_a_concurrency_past_the_requests_is_capped_and_said(cli, db_path):
    import json

    with InstantServer(model="m") as srv:
        r = cli("serve-bench", srv.url, "--model", "m", "--concurrencies", "100000000", "--requests", "10",
                "--warmup", "0", "--no-calibrate", "--output-len", "4", "--prompt-len", "4", "--format", "json")
    assert r.code == 0, r.stderr
    rec = json.loads(r.stdout)
    m = rec["metrics"]
    assert m["loads_by_point"] == [10] and m["load"] == 10  # not 100,000,000 in flight
    assert 1 <= m["in_flight_max"] <= 10 and rec["config"]["concurrency_asked"] == [100000000]
    said = "--concurrencies 100000000 capped at --requests 10: a load point of 10 requests never has more in flight"
    assert any(said in w for w in rec["warnings"]) and said in r.stderr


def test_an_unset_key_variable_is_refused_up_front(cli, db_path, monkeypatch):
    monkeypatch.delenv("MY_UNSET_SERVING_KEY", raising=False)
    seen = []

    async def count(request, body):
        seen.append(request.headers.get("Authorization"))
        return await instant_answer(request, body)

    with InstantServer(model="m", handler=count) as srv:
        r = cli("serve-bench", srv.url, "--model", "m", "--api-key-env", "MY_UNSET_SERVING_KEY", "--requests", "2",
                "--no-calibrate")
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.code == 2 and line.startswith("error: --api-key-env MY_UNSET_SERVING_KEY: the variable is not set")
    assert seen == [] and not db_path.exists()  # no request went out keyless, nothing recorded


def test_a_rate_with_a_cap_in_flight(db_path):
    """vLLM's --request-rate with --max-concurrency: 12 requests arriving at once (a rate of 1000/s) against
    answers of ~50 ms with at most 2 in flight: the rest wait for a slot, and the record says how long."""
    async def steady(request, body):
        await asyncio.sleep(0.05)
        return await instant_answer(request, body)

    with InstantServer(model="m", handler=steady) as srv:
        rec = api.serve_bench(srv.url, "m", rates="1000", concurrencies="2", **{**QUICK, "requests": 12})
    m, c = rec.metrics, rec.config
    assert (c["mode"], c["max_concurrency"], m["loads_by_point"]) == ("rate", 2, [1000.0])
    assert m["in_flight_max"] == 2 and m["completed"] == 12
    assert m["queue_wait_max_s"] >= 4 * 0.05  # the last arrivals waited for five answers ahead of them
    assert m["lag_p99_s"] < m["queue_wait_max_s"]  # the wait is not counted as the generator's lag
    req = rec.raw["points"][0]["requests"]
    assert all(a is not None and s >= a for a, s in zip(req["arrival"], req["scheduled"]))
    assert m["output_throughput_per_user"] == pytest.approx(m["output_throughput"] / 2)


def _slow_start(first: int, slow_s: float = 0.06, fast_s: float = 0.01):
    """A server whose first ``first`` requests (the probe's included) send their tokens ``slow_s`` apart, the
    others ``fast_s``: a server still warming (compiling, filling its caches) for its first requests."""
    count = itertools.count()

    async def handler(request, body):
        from aiohttp import web

        gap = slow_s if next(count) < first else fast_s
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens") or 4)
        if not body.get("stream"):
            return await instant_answer(request, body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            if i:
                await asyncio.sleep(gap)
            await resp.write(event(chunk(f" t{i}", chat)))
        usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": n + 4}
        await resp.write(event(chunk("", chat, "length", usage)))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    return handler


def test_a_short_warm_up_leaves_a_two_speed_point_and_a_warm_up_until_stable_does_not(db_path):
    run = {**QUICK, "requests": 40, "output_len": "3", "duration": 30.0}
    with InstantServer(model="m", handler=_slow_start(12)) as srv:
        cold = api.serve_bench(srv.url, "m", **run)  # no warm-up: the point's first ~10 are slow
    assert cold.metrics["two_speed"] is True and cold.metrics["two_speed_ratio"] > 2
    assert any("ran at two speeds" in w and "--warmup-until-stable" in w for w in cold.warnings)
    with InstantServer(model="m", handler=_slow_start(12)) as srv:
        warm = api.serve_bench(srv.url, "m", **{**run, "warmup_until_stable": True})
    w = warm.raw["warmup"]
    assert w["stable"] is True and w["rounds"] >= 3 and w["requests"] == 8 * w["rounds"]
    assert warm.metrics["two_speed"] is False and not any("two speeds" in x for x in warm.warnings)


def test_a_warm_up_by_duration(db_path):
    with InstantServer(model="m") as srv:
        rec = api.serve_bench(srv.url, "m", **{**QUICK, "warmup": 1, "warmup_duration": 0.5})
    assert rec.raw["warmup"]["seconds"] >= 0.5 and rec.raw["warmup"]["requests"] >= 2
    assert rec.raw["warmup"]["stable"] is None
