"""The burn-in check's verdicts (check ``burnin``): silent data corruption and the devices' state under a long load.

Its run is ``dlscale micro burnin`` (``micro/burnin.py``): every device computes the same seeded
rounds, and the record keeps each rank's first result, the later rounds that differed from it,
and what its monitor saw. Its verdicts are not comparisons of rates (``verdict.compare``) but of
bits, per device:

- ``results across devices``: FAIL, naming the rank and its device (index, model, UUID), when one
  of its rounds gave other bits than its first, or its results differ from the other devices'
  (the largest group that agree; on a tie the group that matches the known-good run; with
  neither, every rank of the tie FAILs: nothing tells which is right); else PASS;
- ``results vs known-good``: the same bits as the known-good run (PASS) or not (FAIL), where the
  known-good ran the same software (torch, CUDA, cuDNN): bits compare only there. The known-good
  is the newest acceptance of the same burn on the same device model (``match_key``: the burn's
  options and version, the devices' model; on CPUs also the CPU model, its ISA and the threads per
  rank) whose burn-in verdicts are all PASS or NO EXPECTATION, preferring one on the same
  software. None yet: NO EXPECTATION, and this run, if it passes, is the known-good from now on;
  only on other software: NO EXPECTATION saying so;
- ``loss curve`` (the run's): the largest relative step-by-step deviation of the LLM losses from
  the known-good's, ``max_s |l_s - k_s| / |k_s|``, PASS below ``warn``, FAIL from ``fail``
  (default 0.2% and 1%, ``LOSS``; a spec's ``checks: {burnin: {warn:, fail:}}`` sets them);
  meaningful across software versions, where bits are not;
- ``clock events`` (each GPU): FAIL when NVML reported a slowdown for cause (thermal, power
  brake, HW slowdown), uncorrected ECC errors, a lost GPU or a hardware or application Xid during
  the burn (``monitor.health``), WARN for a memory error the GPU recorded or contained (Xid 63, 94:
  ``monitor.xid``'s classes); else PASS with the burn's power, SM clock and temperature. CPUs have no clock-event reasons: their
  clock and temperature are recorded where the machine exposes them, and the notes say where not.

``find_known_good`` reads the store; the rest is pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dlscale.accept.figures.figure import Subject, host_subject, rank_subject
from dlscale.accept.judging.verdict import FAIL, NO_EXPECTATION, PASS, WARN, Thresholds, Verdict
from dlscale.micro.burnin import changed_parts, device_words, findings, part_names, reference_ranks
from dlscale.record import RunRecord, config_hash

CHECK = "burnin"
LOSS = Thresholds(warn=0.002, fail=0.01)
MAX_HISTORY = 50  # acceptances searched for a known-good burn
OPTIONS = ("version", "precision", "gemm_size", "gemm_chain", "llm_model", "llm_steps", "llm_lr", "seq_len",
           "batch_size", "seed", "device")
STACK = ("torch", "cuda", "cudnn", "hip")


def is_burn(rec: RunRecord) -> bool:
    return rec.kind == "micro" and rec.workload == CHECK


def complete(rec: RunRecord) -> bool:
    """Every rank's results are in the record (also in a run that failed for what they show)."""
    ranks = (rec.raw or {}).get("ranks") or []
    return bool(ranks) and len(ranks) == (rec.config or {}).get("world_size", len(ranks)) and \
        all(r.get("result") for r in ranks)


def explained_failure(rec: RunRecord) -> bool:
    """A failed burn whose failure is the disagreement its verdicts name (no other verdict needed)."""
    return rec.status != "ok" and complete(rec) and any(findings(rec.raw["ranks"]).values())


def models(rec: RunRecord) -> list[str]:
    return sorted({str((r.get("device") or {}).get("device_name")) for r in (rec.raw or {}).get("ranks") or []})


def match_key(rec: RunRecord) -> str:
    """What must be equal for two burns to be held to the same results: the burn's options, the
    devices' model; on CPUs also the CPU model, its ISA and the threads per rank."""
    c = rec.config or {}
    key: dict[str, Any] = {"options": {k: c.get(k) for k in OPTIONS}, "models": models(rec)}
    if c.get("device") == "cpu":
        cpu = (rec.system or {}).get("cpu") or {}
        key["cpu"] = {"model": cpu.get("model"), "isa": cpu.get("isa"), "threads": (c.get("deterministic") or {}).get("threads")}
    return config_hash(key)


def stack(rec: RunRecord) -> dict[str, Any]:
    sw = (rec.system or {}).get("software") or {}
    return {k: sw.get(k) for k in STACK}


@dataclass
class KnownGood:
    record: RunRecord
    acceptance: str
    same_stack: bool

    @property
    def words(self) -> str:
        return f"the known-good run {self.record.run_id} (acceptance {self.acceptance}, {self.record.created_at[:10]})"

    @property
    def result(self) -> dict[str, Any]:
        ranks = self.record.raw["ranks"]
        ref = reference_ranks(ranks) or [ranks[0]["rank"]]
        return next(r["result"] for r in ranks if r["rank"] == ref[0])


def passed(acc: RunRecord) -> bool:
    """An acceptance whose burn-in verdicts are all PASS or NO EXPECTATION."""
    mine = [v for v in (acc.raw or {}).get("verdicts") or [] if v.get("check") == CHECK]
    return bool(mine) and all(v.get("status") in (PASS, NO_EXPECTATION) for v in mine)


def find_known_good(store: Any, records: Sequence[RunRecord], exclude: str | None = None) -> dict[str, KnownGood]:
    """Burn run id -> its known-good (the module doc), for every complete burn among ``records``."""
    want = {r.run_id: r for r in records if is_burn(r) and complete(r)}
    out: dict[str, KnownGood] = {}
    if not want:
        return out
    seen = 0
    for acc in store.query(kind="accept", status="ok"):
        if seen >= MAX_HISTORY or all(k in out and out[k].same_stack for k in want):
            break
        if acc.tag == exclude or not passed(acc):
            continue
        seen += 1
        runs = (acc.raw.get("check_runs") or {}).get(CHECK) or []
        for old in store.query(run_ids=runs, status="ok") if runs else []:
            if not is_burn(old) or not complete(old):
                continue
            for rid, rec in want.items():
                if match_key(old) != match_key(rec) or (rid in out and (out[rid].same_stack or stack(old) != stack(rec))):
                    continue
                out[rid] = KnownGood(old, acc.tag or acc.run_id, stack(old) == stack(rec))
    return out


# -- verdicts ---------------------------------------------------------------------------------------
def verdicts(records: Sequence[RunRecord], known: dict[str, KnownGood], th: Thresholds | None = None,
             hosts: dict[str, str] | None = None) -> list[Verdict]:
    """Every burn-in verdict of an acceptance's records (``known``: ``find_known_good``'s answer)."""
    out: list[Verdict] = []
    for rec in records:
        if is_burn(rec) and complete(rec):
            out.extend(burn_verdicts(rec, known.get(rec.run_id), th or LOSS, (hosts or {}).get(rec.run_id)))
    return out


def burn_verdicts(rec: RunRecord, kg: KnownGood | None, th: Thresholds, host: str | None = None) -> list[Verdict]:
    ranks = rec.raw["ranks"]
    good = kg.result if kg is not None and kg.same_stack else None
    found = findings(ranks, good)
    out: list[Verdict] = []
    for r in ranks:
        s = subject(r, host)
        problems = found[r["rank"]]
        same = "as every other device's" if len(ranks) > 1 else "(the only device: held to its own rounds and the " \
            "known-good)"
        out.append(_verdict(rec, s, "results across devices", FAIL if problems else PASS,
                            f"{device_words(r)}: {'; '.join(problems)}" if problems else
                            f"its {r['rounds']} round(s) gave the same bits each time, {same}"))
        out.append(_vs_known_good(rec, s, r, kg))
        clock = _clock_events(rec, s, r)
        if clock is not None:
            out.append(clock)
    out.append(_loss_curve(rec, ranks, kg, good, th, host))
    return out


def subject(r: dict[str, Any], host: str | None) -> Subject:
    """A GPU rank is its GPU (``GPU 3``, so other checks' verdicts on it relate); a CPU rank is itself."""
    ident = r.get("device") or {}
    if str(ident.get("device", "")).startswith("cuda"):
        s = rank_subject(ident, False)
    else:
        k = r["rank"]
        s = Subject("rank", f"rank {k} ({ident.get('device') or 'cpu'})", f"rank {k}", (), (f"rank {k}",))
    return host_subject(s, host) if host else s


def _verdict(rec: RunRecord, s: Subject | None, figure: str, status: str, reason: str, **extra: Any) -> Verdict:
    return Verdict(check=CHECK, figure=figure, subject=s.label if s else None, status=status,
                   measured=extra.pop("measured", None), unit=extra.pop("unit", ""), reason=reason,
                   run_ids=[rec.run_id] + extra.pop("also", []), key=f"{CHECK}|{figure}|{s.key if s else ''}",
                   subject_key=s.key if s else None, nodes=list(s.nodes) if s else [],
                   devices=list(s.devices) if s else [], **extra)


def _vs_known_good(rec: RunRecord, s: Subject, r: dict[str, Any], kg: KnownGood | None) -> Verdict:
    figure = "results vs known-good"
    if kg is None:
        return _verdict(rec, s, figure, NO_EXPECTATION, f"no earlier passing burn of these options on {', '.join(models(rec))}: "
                        "this run is the known-good from now on, if none of its burn-in verdicts FAILs")
    if not kg.same_stack:
        was, now = stack(kg.record), stack(rec)
        diff = ", ".join(f"{k} {was[k]} -> {now[k]}" for k in STACK if was[k] != now[k])
        return _verdict(rec, s, figure, NO_EXPECTATION, f"{kg.words} ran other software ({diff}): bits compare only "
                        "on the same software; its loss curve is compared instead", also=[kg.record.run_id],
                        expectation="known-good", source=kg.words)
    parts = changed_parts(r["result"], kg.result)
    status, why = (FAIL, f"its {part_names(parts)} differ(s) bit for bit from {kg.words}: same burn, same device "
                   "model, same software") if parts else (PASS, f"the same bits as {kg.words}")
    return _verdict(rec, s, figure, status, why, also=[kg.record.run_id], expectation="known-good", source=kg.words)


def _loss_curve(rec: RunRecord, ranks: list[dict[str, Any]], kg: KnownGood | None, good: dict[str, Any] | None,
                th: Thresholds, host: str | None) -> Verdict:
    s = host_subject(None, host) if host else None
    figure = "loss curve"
    if kg is None:
        return _verdict(rec, s, figure, NO_EXPECTATION, "no known-good loss curve of these options on this device "
                        "model yet: this run's is, if none of its burn-in verdicts FAILs")
    ref = reference_ranks(ranks, good) or [ranks[0]["rank"]]
    mine = next(r for r in ranks if r["rank"] == ref[0])["result"]["losses"]
    theirs = kg.result["losses"]
    dev, step = deviation([float.fromhex(x) for x in mine], [float.fromhex(x) for x in theirs])
    common = dict(measured=dev, unit="fraction", also=[kg.record.run_id], expectation="known-good", source=kg.words,
                  warn=th.warn, fail=th.fail)
    if dev is None:
        return _verdict(rec, s, figure, FAIL, f"the losses cannot be compared with {kg.words}'s "
                        f"({len(mine)} vs {len(theirs)} steps, or not finite)", **common)
    where = f"largest deviation {dev:.3%} at step {step} from {kg.words}'s curve"
    if dev >= th.fail:
        return _verdict(rec, s, figure, FAIL, f"{where}: past the {th.fail:.2%} fail line", **common)
    if dev >= th.warn:
        return _verdict(rec, s, figure, WARN, f"{where}: past the {th.warn:.2%} warn line", **common)
    return _verdict(rec, s, figure, PASS, f"{where} (warn at {th.warn:.2%})", **common)


def deviation(mine: Sequence[float], ref: Sequence[float]) -> tuple[float | None, int | None]:
    """(max_s |m_s - r_s| / |r_s|, its step); (None, None) when the curves differ in length or hold a
    non-finite value."""
    if len(mine) != len(ref) or not mine or not all(math.isfinite(x) and x != 0 for x in ref) or \
            not all(math.isfinite(x) for x in mine):
        return None, None
    devs = [abs(m - r) / abs(r) for m, r in zip(mine, ref)]
    step = max(range(len(devs)), key=devs.__getitem__)
    return devs[step], step


def _clock_events(rec: RunRecord, s: Subject, r: dict[str, Any]) -> Verdict | None:
    """A GPU's clock-event reasons, ECC and Xids during the burn (None: a CPU rank, or no NVML health watch)."""
    from dlscale.monitor.health import run_advisories, run_warnings

    health = (r.get("series") or {}).get("health")
    if health is None:
        return None
    found, advised = run_warnings(health), run_advisories(health)
    m = r.get("monitor") or {}
    seen = "; ".join(f"{k} {_num(m.get(f'monitor_{c}_{stat}'))}{u}" for k, c, stat, u in (
        ("power mean", "gpu_power_W", "mean", " W"), ("SM clock mean", "gpu_sm_clock_MHz", "mean", " MHz"),
        ("temperature max", "gpu_temp_C", "max", " °C")) if m.get(f"monitor_{c}_{stat}") is not None)
    why = "; ".join(found or advised) or f"no slowdown for cause in {health.get('samples', 0)} samples"
    return _verdict(rec, s, "clock events", FAIL if found else WARN if advised else PASS,
                    f"{why}{f' ({seen})' if seen else ''}")


def _num(x: Any) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "?"
