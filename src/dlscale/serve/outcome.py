"""A serving run's record: headline figures, every point's figures, the SLO answer, energy, calibration.

``build(cfg, state)`` turns what ``serve.serving_run`` measured into an ``Outcome``: the headline point's
figures (the answer where SLOs are given, else the highest load), ``*_by_point`` lists, the
answer (``max_load_meeting_slo``, ``slo_binding``), each point's energy (J per output token and
kWh per million output tokens where a counter exists), the client's overhead from the calibration,
and warnings where a figure needs a caveat. ``raw.points`` keeps every request's timestamps,
relative to its point's start.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dlscale.harness.runner import Outcome
from dlscale.serve import figures as figs
from dlscale.serve import search
from dlscale.serve.config import ServeConfig

J_PER_KWH = 3.6e6
HEADLINE_SKIP = ("errors", "token_count_source")
BY_POINT = ("request_throughput", "output_throughput", "total_token_throughput", "tokens_per_s_per_user", "goodput",
            "ttft_median_s", "ttft_p99_s", "tpot_median_s", "tpot_p99_s", "itl_median_s", "e2e_median_s",
            "completed", "failed", "lag_p99_s", "energy_per_unit_j", "kwh_per_million_output_tokens",
            "output_throughput_per_user", "in_flight_max", "queue_wait_p99_s", "two_speed", "too_few_for")
TOKEN_TIMES_CAP = 200_000  # arrival times of text events kept in raw per point; past it only first and end
LAG_WARN_S = 0.010  # a generator 10 ms behind its schedule (p99) changes the load it claims


def _columns(pt: Any) -> dict[str, Any]:
    """Every request of a point as columns, times relative to the point's start (seconds)."""
    t0 = pt.start
    rel = lambda x: None if x is None else round(x - t0, 6)  # noqa: E731
    rs = pt.results
    return {"sent": [rel(r.sent) for r in rs], "scheduled": [rel(r.scheduled) for r in rs],
            "end": [rel(r.end) for r in rs], "first": [rel(r.first) for r in rs],
            "output_tokens": [r.output_tokens for r in rs], "prompt_tokens": [r.prompt_tokens for r in rs],
            "count_source": [r.count_source for r in rs], "error": [r.error for r in rs],
            "arrival": [rel(r.arrival) for r in rs],
            "detail": [r.detail for r in rs],
            "token_times": ([[rel(t) for t in r.times] for r in rs]
                            if sum(len(r.times) for r in rs) <= TOKEN_TIMES_CAP else None)}


def users_of(pt: Any) -> float | None:
    """The users a point was run at: its concurrency, or its cap in flight at a rate (None: an uncapped rate)."""
    return pt.load if pt.mode == "concurrency" else pt.cap


def _judged_points(cfg: ServeConfig, state: dict[str, Any]) -> search.Answer | None:
    """The search's answer, or (a list of loads with SLOs) each point judged and the highest that met."""
    if state.get("answer") is not None:
        return state["answer"]
    bounds = cfg.slo_bounds.bounds()
    s = state.get("session")
    if not bounds or s is None or not s.points:
        return None
    ans = search.Answer(best=None)
    for i, pt in enumerate(s.points):
        each = [figs.per_request(r) for r in pt.results if r.ok]
        samples = {k: [e[k] for e in each if e[k] is not None] for k in ("ttft", "tpot")}
        j = search.judge(samples, bounds, pt.load)
        if j.verdict == "unsure":
            j.unsure = True
            j.verdict = "fails" if any(p is not None and p > bounds[k] for k, p in j.p99.items()) else "meets"
        j.index = i
        ans.points.append(j)
    met = [j for j in ans.points if j.verdict == "meets"]
    failed = [j for j in ans.points if j.verdict == "fails" and (not met or j.load > max(m.load for m in met))]
    ans.best = max(m.load for m in met) if met else None
    if failed:
        low = min(failed, key=lambda j: j.load)
        ans.binding = search.missed(low, bounds) or list(bounds)
    ans.reason = (f"highest load measured that met the SLOs: {ans.best:g}" if met else "no load measured met the SLOs")
    return ans


def _headline(points: list[Any], ans: search.Answer | None) -> int:
    if not points:
        return -1
    if ans is not None and ans.best is not None:
        return max(j.index for j in ans.points if j.load == ans.best and j.verdict == "meets")
    if ans is not None:
        return 0
    return max(range(len(points)), key=lambda i: points[i].load)


def build(cfg: ServeConfig, state: dict[str, Any]) -> Outcome:
    from dlscale.harness import energy_meter as en

    s = state.get("session")
    points = s.points if s is not None else []
    bounds = cfg.slo_bounds.bounds()
    pfs = [figs.point_figures(pt.results, bounds, cfg.stream, users_of(pt)) for pt in points]
    out = Outcome(units=dict(figs.UNITS))
    unit = "requests/s" if cfg.mode == "rate" else "requests in flight"
    for i, (pt, f) in enumerate(zip(points, pfs)):
        m, u, raw = en.figures(s.energy[i], f["output_tokens"], "tokens") if i < len(s.energy) else ({}, {}, {})
        if m.get("energy_per_unit_j") is not None:
            m["kwh_per_million_output_tokens"] = m["energy_per_unit_j"] * 1e6 / J_PER_KWH
        f.update(m)
        out.units.update(u, kwh_per_million_output_tokens="kWh/10^6 tokens")
        f["energy_raw"] = raw.get("energy")
    ans = _judged_points(cfg, state)
    h = _headline(points, ans)
    if h >= 0:
        out.metrics.update({k: v for k, v in pfs[h].items() if k not in HEADLINE_SKIP and k != "energy_raw"})
        out.metrics.update(load=points[h].load, throughput=pfs[h]["output_throughput"])
        out.units.update(load=unit, throughput="tokens/s")
        for kind, n in pfs[h]["errors"].items():
            out.metrics[f"errors_{kind}"] = n
            out.units[f"errors_{kind}"] = "requests"
    out.metrics["loads_by_point"] = [pt.load for pt in points]
    out.units["loads_by_point"] = unit
    for k in BY_POINT:
        out.metrics[f"{k}_by_point"] = [f.get(k) for f in pfs]
        out.units[f"{k}_by_point"] = out.units.get(k, figs.UNITS.get(k, ""))
    totals = Counter()
    for f in pfs:
        totals.update(f["errors"])
    out.metrics.update(completed_total=sum(f["completed"] for f in pfs), failed_total=sum(f["failed"] for f in pfs),
                       points=len(points))
    out.units.update(completed_total="requests", failed_total="requests", points="points")
    _answer(out, ans, bounds, unit, len(points))
    _calibration(out, state.get("calibration"))
    lg = state.get("loadgen")
    if lg:
        out.metrics.update(lg["metrics"])
        out.units.update(lg["units"])
        out.raw.update(loadgen_summary=lg["summary"], loadgen_errors=lg["errors"])
    out.raw.update(points=[{"mode": pt.mode, "load": pt.load, "cap": pt.cap, "planned": pt.planned,
                            "stopped_by": pt.stopped_by,
                            "figures": f, "requests": _columns(pt)} for pt, f in zip(points, pfs)],
                   errors_total=dict(totals), probe=state.get("probe"), calibration=state.get("calibration"),
                   warmup_errors=state.get("warmup_errors") or [], warmup=state.get("warmup"),
                   goodput_slices=figs.goodput_slices(points[h].results, bounds) if h >= 0 else [])
    tok = state.get("tokens")
    out.config.update(tokenizer_path=tok.path if tok is not None else None,
                      prompt_len_source="dataset" if cfg.dataset else ("tokenizer" if tok is not None else "words"),
                      fixed_output_accepted=(state.get("probe") or {}).get("fixed_output"),
                      stream_options_accepted=(state.get("probe") or {}).get("stream_options"),
                      token_count_source=pfs[h]["token_count_source"] if h >= 0 else None)
    out.warnings.extend(_warnings(cfg, state, pfs, out.metrics))
    return out


def _answer(out: Outcome, ans: search.Answer | None, bounds: dict[str, float], unit: str, n: int) -> None:
    if ans is None:
        return
    met: list[bool | None] = [None] * n  # a first measurement pooled into a second is judged with it
    for j in ans.points:
        if 0 <= j.index < n:
            met[j.index] = j.verdict == "meets"
    out.metrics.update(max_load_meeting_slo=ans.best, slo_binding=",".join(ans.binding) or "none",
                       slo_met_by_point=met)
    out.units.update(max_load_meeting_slo=unit, slo_ttft_s="s", slo_tpot_s="s")
    out.metrics.update({f"slo_{k}_s": v for k, v in bounds.items()})
    out.raw["answer"] = search.answer_dict(ans)


def point_warnings(cfg: ServeConfig, state: dict[str, Any], points: list[Any], pfs: list[dict[str, Any]]) -> list[str]:
    """What the load points' own figures need said: a concurrency capped at --requests, a point of too few
    requests for its percentiles, a two-speed point, a warm-up that did not settle."""
    w = []
    if cfg.concurrency_asked:
        what = "--concurrencies" if cfg.mode == "concurrency" else "the cap in flight (--concurrencies)"
        w.append(f"{what} {','.join(str(c) for c in cfg.concurrency_asked)} capped at --requests {cfg.requests}: a load "
                 f"point of {cfg.requests} requests never has more in flight (recorded as "
                 f"{','.join(str(c) for c in cfg.concurrencies)})")
    need = {k: search.needed(q) for k, q in figs.QUANTILES.items()}
    few = [(pt, f) for pt, f in zip(points, pfs) if f["too_few_for"]]
    if few:
        marks = ", ".join(f"{pt.load:g} ({f['completed']} completed: {', '.join(f['too_few_for'])})" for pt, f in few)
        w.append(f"too few requests for their percentiles at load point(s) {marks}: a median needs {need['median']}, "
                 f"a p90 {need['p90']}, a p99 {need['p99']} for a 95% interval inside the sample (more --requests)")
    for pt, f in zip(points, pfs):
        if f.get("two_speed"):
            what = "TPOT" if cfg.stream else "end-to-end latency"
            w.append(f"load point {pt.load:g} ran at two speeds: the median {what} of its first {f['two_speed_first']} "
                     f"requests is {f['two_speed_ratio']:.2f}x the rest's (Mann-Whitney p = {f['two_speed_p']:.2g}): the "
                     "server was not warm, or changed speed; warm it longer (--warmup-until-stable, --warmup-duration)")
    warm = state.get("warmup") or {}
    if warm.get("stable") is False:
        w.append(f"the warm-up did not settle in {warm['seconds']:.3g} s ({warm['requests']} requests, --duration "
                 "bounds it): the first load point may still be warming the server")
    return w


def _calibration(out: Outcome, cal: dict[str, Any] | None) -> None:
    if not cal:
        return
    out.metrics.update(client_ttft_overhead_s=cal["one"]["ttft_median_s"], client_itl_overhead_s=cal["one"]["itl_median_s"],
                       client_ttft_overhead_loaded_s=cal["loaded"]["ttft_median_s"],
                       client_calibration_concurrency=cal["loaded"]["concurrency"])
    out.units.update(client_ttft_overhead_s="s", client_itl_overhead_s="s", client_ttft_overhead_loaded_s="s",
                     client_calibration_concurrency="requests in flight")


def _warnings(cfg: ServeConfig, state: dict[str, Any], pfs: list[dict[str, Any]], m: dict[str, Any]) -> list[str]:
    w = []
    probe = state.get("probe") or {}
    if cfg.fixed_output and probe and not probe.get("fixed_output"):
        w.append("the server refused ignore_eos/min_tokens: output lengths are the model's choice up to --output-len "
                 f"({probe.get('refused', [''])[0][:120]})")
    if any("chunks" in (f.get("token_count_source") or "") for f in pfs):
        w.append("some token counts are text events (no usage from the server, no --tokenizer): a server that sends "
                 "several tokens per event is undercounted")
    lag = [f["lag_p99_s"] for f in pfs if f.get("lag_p99_s") is not None]
    if lag and max(lag) > LAG_WARN_S:
        w.append(f"the load generator fell behind its schedule by up to {max(lag) * 1e3:.3g} ms (p99): the load "
                 "offered was lower than the load asked for")
    over, ttft = m.get("client_ttft_overhead_loaded_s"), m.get("ttft_median_s")
    if over is not None and ttft and over > 0.1 * ttft:
        w.append(f"the client's own TTFT overhead ({over * 1e3:.3g} ms under load) is over 10% of the median TTFT "
                 f"({ttft * 1e3:.3g} ms)")
    if state.get("warmup_errors"):
        w.append(f"{len(state['warmup_errors'])} warm-up requests failed: {state['warmup_errors'][0][:160]}")
    points = state["session"].points if state.get("session") else []
    short = [f"{pt.load:g}" for pt in points if pt.stopped_by == "duration"]
    if short:
        w.append(f"--duration ended load point(s) {', '.join(short)} before all --requests were sent")
    w.extend(point_warnings(cfg, state, points, pfs))
    lg = state.get("loadgen")
    if lg:
        from dlscale.infer.loadgen_log import parse_summary

        capped = lg["errors"] and all("Max query count reached" in e for e in lg["errors"])
        for why in parse_summary(lg["summary"], "server", "tokens")[2]:
            if capped and "ERROR encountered" in why:
                why = "LoadGen stopped at --requests queries (its max query count), as asked"
            w.append(why if why.startswith("LoadGen") else f"LoadGen: {why}")
        failed = sum(f["failed"] for f in pfs)
        if failed:
            w.append(f"{failed} requests failed and were completed to LoadGen as two-token answers so that its run "
                     "could end: its figures count them")
    return w
