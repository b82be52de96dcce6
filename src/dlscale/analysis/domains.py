"""Workload families and their sample units, and the domain scaling table of seed 000 (Figure 3).

Every train record belongs to a *family* (classification, detection, translation, recommendation,
llm) whose *sample unit* (images, tokens, samples) is the numerator of its throughput. Figures in
different units are never put in one ratio, mean, sum or axis: ``by_unit`` splits records, and
every grouping here keys on the unit. Records written before families existed carry no
``family``: their model's registered family is used (``classification`` for a name no longer
registered, which is what every such record was).

The domain table (derived in docs/METRICS.md, "Domain scaling"): per domain (one model and test
of a family, on one system unless ``across_systems``) and per device count N, the metric's mean
``X_N`` (over the runs in the layout with the fewest nodes at N), the speed-up over the smallest device count ``n0`` (``X_N / X_n0``; ``T_n0 / T_N`` for
times), the device ratio ``N / n0``, the scaling efficiency ``speed-up / (N / n0)``, and the score
over a reference system, MLPerf v0.5 style (``X_N / X_ref``; ``T_ref / T_N`` for times). Pure
functions over records (read-only; no torch): ``scaling_rows`` works on plain numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dlscale.analysis.formulas import relative_score
from dlscale.errors import UsageError
from dlscale.stats import mean

UNIT_ORDER = ("images", "tokens", "samples")
# what makes two runs of one model the same test (per-device batch, shape of a sample, precision)
TEST_KEYS = ("batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "precision",
             "target", "target_top1", "target_top5")  # the targets: a tta run's test includes what it trains to
# what a reference must share with a run to be "the same model and config" (MLPerf v0.5 lets each
# system choose its batch size and precision; the shape of a sample unit must be the same)
SHAPE_KEYS = ("image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "target", "target_top1")
# metrics whose unit is "sample units per second" (or per sample unit): split by unit
UNIT_METRICS = ("throughput", "throughput_ci95", "repeat_throughputs", "epoch_throughputs", "flops_per_sample",
                "flops_per_sample_forward", "samples_per_step", "energy_per_unit_j", "units_per_joule",
                "cost_per_million_units", "units_per_dollar")
# the per-joule and per-dollar figures shown beside each metric a domain table scales
EFFICIENCY = {"throughput": ("units_per_joule", "units_per_dollar"),
              "time_to_target": ("energy_to_target_kwh", "cost_to_target")}
# verdict thresholds on the largest device count (seed 000's words; docs/METRICS.md)
LINEAR_EFFICIENCY = 0.9
SUPERLINEAR_EFFICIENCY = 1.05
FLAT_SPEEDUP = 1.1


def family(rec: Any) -> str:
    """The record's family: its config's, else its model's registered family (old records)."""
    fam = (rec.config or {}).get("family")
    if fam:
        return str(fam)
    from dlscale.workloads.base import family_of

    return family_of(rec.workload)


def sample_unit(rec: Any) -> str:
    """What one sample is for this record (images, tokens, samples): its config's, else its family's."""
    unit = (rec.config or {}).get("sample_unit")
    if unit:
        return str(unit)
    from dlscale.workloads.base import FAMILIES

    return FAMILIES.get(family(rec), "samples")


def rate_unit(unit: str) -> str:
    """'images' -> 'images/s': the label of a throughput in this unit."""
    return f"{unit}/s"


def unit_bearing(metric: str, records: Iterable[Any] = ()) -> bool:
    """Whether ``metric`` counts sample units (so runs of different units must never meet in it)."""
    if metric in UNIT_METRICS:
        return True
    for r in records:
        u = (r.units or {}).get(metric)
        if u:
            return "samples" in u or "images" in u or "tokens" in u
    return False


def _unit_rank(unit: str) -> tuple[int, str]:
    return (UNIT_ORDER.index(unit) if unit in UNIT_ORDER else len(UNIT_ORDER), unit)


def by_unit(records: Iterable[Any]) -> dict[str, list[Any]]:
    """Records split by sample unit, images first, then tokens, then samples (insertion-ordered)."""
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(sample_unit(r), []).append(r)
    return {u: out[u] for u in sorted(out, key=_unit_rank)}


def by_family(records: Iterable[Any]) -> dict[str, list[Any]]:
    """Records split by family, in the order of ``FAMILIES`` (unknown families last)."""
    from dlscale.workloads.base import FAMILIES

    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(family(r), []).append(r)
    order = list(FAMILIES)
    return {f: out[f] for f in sorted(out, key=lambda f: (order.index(f) if f in order else len(order), f))}


def check_same_unit(a: Sequence[Any], b: Sequence[Any], metric: str = "throughput") -> None:
    """Refuse to compare A with B when their ``metric`` is in sample units and they share none."""
    if not unit_bearing(metric, [*a, *b]):
        return
    ua, ub = set(by_unit(a)), set(by_unit(b))
    if ua and ub and not ua & ub:
        raise UsageError(f"cannot compare {metric}: A is in {', '.join(rate_unit(u) for u in sorted(ua))} and B in "
                         f"{', '.join(rate_unit(u) for u in sorted(ub))}; select runs of the same sample unit "
                         "on both sides (e.g. add model:NAME to each selector)")


def scaling_rows(values: Mapping[int, float], reference: float | None = None,
                 higher_is_better: bool = True) -> list[dict[str, Any]]:
    """Per device count N (ascending): value, speed-up over the smallest count, N / n0, efficiency, score.

    ``values`` maps device counts to the metric (a throughput, or a time when not
    ``higher_is_better``); ``reference`` is the reference system's value of the same metric.
    """
    if not values:
        return []
    n0 = min(values)
    rows = []
    for n in sorted(values):
        speed = relative_score(values[n], values[n0], higher_is_better)
        rows.append({"devices": n, "value": values[n], "speedup": speed, "device_ratio": n / n0,
                     "efficiency": speed / (n / n0),
                     "score": relative_score(values[n], reference, higher_is_better) if reference else None})
    return rows


def verdict(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """How a domain scales, in seed 000's words, from its largest device count; None with one count.

    flat: speed-up under 1.1 (seed 000's recommendation, "does not scale beyond 2 GPUs");
    super-linear: efficiency above 105% (its translation, "almost ... quadratically");
    linear: efficiency 90% to 105% (its image classification and object detection);
    sub-linear: anything else.
    """
    if len(rows) < 2:
        return None
    last = max(rows, key=lambda r: r["devices"])
    if last["speedup"] < FLAT_SPEEDUP:
        return "flat"
    if last["efficiency"] > SUPERLINEAR_EFFICIENCY:
        return "super-linear"
    return "linear" if last["efficiency"] >= LINEAR_EFFICIENCY else "sub-linear"


def system_label(rec: Any) -> str:
    """A short name for where a run ran: the imported system's name, else the host name."""
    if rec.imported:
        return str(rec.config.get("system") or (rec.system or {}).get("name") or "imported")
    return str((rec.system or {}).get("hostname") or "?")


def world_size(rec: Any) -> Any:
    """How many devices the run used: its metrics' world size, else its config's, else 1."""
    return rec.metrics.get("world_size") or rec.config.get("world_size") or 1


def _devices(rec: Any) -> int:
    return int(world_size(rec))


def _norm(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _usable(records: Iterable[Any], metric: str, kinds: Sequence[str] | None) -> list[Any]:
    """Ok records of the wanted kinds with a positive number for ``metric``."""
    kinds = kinds if kinds is not None else (("train",) if metric == "throughput" else None)
    out = []
    for r in records:
        v = r.metrics.get(metric)
        if r.status != "ok" or (kinds is not None and r.kind not in kinds):
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out.append(r)
    return out


def _value_unit(recs: Sequence[Any], metric: str) -> str:
    if unit_bearing(metric, recs):
        return rate_unit(sample_unit(recs[0])) if metric == "throughput" else f"{sample_unit(recs[0])} ({metric})"
    return next((str(r.units[metric]) for r in recs if (r.units or {}).get(metric)), "")


def _domains(records: Sequence[Any], across_systems: bool) -> dict[tuple, list[Any]]:
    """Records keyed by (unit, family, model, system or None, test), in display order."""
    groups: dict[tuple, list[Any]] = {}
    for r in records:
        test = tuple(_norm(r.config.get(k)) for k in TEST_KEYS)
        key = (sample_unit(r), family(r), r.workload, None if across_systems else system_label(r), test)
        groups.setdefault(key, []).append(r)
    from dlscale.workloads.base import FAMILIES

    fams = list(FAMILIES)

    def order(k: tuple) -> tuple:
        return (_unit_rank(k[0]), fams.index(k[1]) if k[1] in fams else len(fams), k[1], k[2], str(k[3]), str(k[4]))

    return {k: groups[k] for k in sorted(groups, key=order)}


def _per_device_count(recs: Sequence[Any], across_systems: bool) -> dict[int, list[Any]]:
    """Runs by device count, in the layout with the fewest nodes at each count (scale-up, as seed 000's
    single-node servers); across systems, one device count may come from one system only."""
    from dlscale.analysis.scaling import layout_of

    by_n: dict[int, list[Any]] = {}
    for r in recs:
        by_n.setdefault(_devices(r), []).append(r)
    for n, rs in by_n.items():
        fewest = min(layout_of(r)[0] for r in rs)
        by_n[n] = [r for r in rs if layout_of(r)[0] == fewest]
    if across_systems:
        for n, rs in sorted(by_n.items()):
            systems = sorted({system_label(r) for r in rs})
            if len(systems) > 1:
                raise UsageError(f"{rs[0].workload} on {n} device(s) has runs from {', '.join(systems)}: with "
                                 "--across-systems each device count must come from one system; select one of them")
    return by_n


def reference_value(domain_recs: Sequence[Any], reference: Sequence[Any], metric: str) -> dict[str, Any] | None:
    """The reference system's value for a domain: same model and sample shape, its smallest device count.

    Reference runs that also share the domain's batch size and precision are preferred; when
    what remains spans several systems or configs, the reference is ambiguous (value None, a note).
    """
    r0 = domain_recs[0]
    unit = sample_unit(r0)
    cands = [r for r in reference if r.workload == r0.workload and sample_unit(r) == unit
             and all(r.config.get(k) is None or r0.config.get(k) is None or r.config.get(k) == r0.config.get(k)
                     for k in SHAPE_KEYS)]
    if not cands:
        return None
    same = [r for r in cands if all(r.config.get(k) == r0.config.get(k) for k in ("batch_size", "precision"))]
    cands = same or cands
    n = min(_devices(r) for r in cands)
    at_n = [r for r in cands if _devices(r) == n]
    configs = {(system_label(r), r.config.get("batch_size"), r.config.get("precision")) for r in at_n}
    out = {"devices": n, "runs": len(at_n), "systems": sorted({c[0] for c in configs}), "value": None, "note": None}
    if len(configs) > 1:
        out["note"] = (f"ambiguous reference: {len(configs)} systems/configs of {r0.workload} at {n} device(s); "
                       "select one")
        return out
    out["value"] = mean([float(r.metrics[metric]) for r in at_n])
    return out


def domain_table(records: Iterable[Any], reference: Sequence[Any] | None = None, metric: str = "throughput",
                 higher_is_better: bool = True, kinds: Sequence[str] | None = None,
                 across_systems: bool = False) -> list[dict[str, Any]]:
    """Seed 000 Figure 3 as data: one entry per domain with its rows per device count (JSON-ready).

    A domain is one model and test (``TEST_KEYS``) of one family on one system, or across systems
    (one system per device count, as seed 000's servers of 2, 3, 4 and 8 GPUs). ``kinds``
    defaults to train runs for throughput and every kind otherwise.
    """
    from dlscale.analysis.scaling import layout_of

    recs = _usable(records, metric, kinds)
    ref = _usable(reference, metric, kinds) if reference is not None else None
    out = []
    for (unit, fam, model, system, test), members in _domains(recs, across_systems).items():
        by_n = _per_device_count(members, across_systems)
        values = {n: mean([float(r.metrics[metric]) for r in rs]) for n, rs in by_n.items()}
        refv = reference_value(members, ref, metric) if ref is not None else None
        rows = scaling_rows(values, refv["value"] if refv else None, higher_is_better)
        for row in rows:
            rs = by_n[row["devices"]]
            nodes, per_node = layout_of(rs[0])
            row.update({"layout": f"{nodes}x{per_node}", "runs": len(rs), "systems": sorted({system_label(r) for r in rs}),
                        "run_ids": [r.run_id for r in rs]})
            row.update({k: mean_of(rs, k) for k in EFFICIENCY.get(metric, ())})
            row["prices"] = prices(rs)
        out.append({"family": fam, "sample_unit": unit, "unit": _value_unit(members, metric), "model": model,
                    "system": system, "systems": sorted({system_label(r) for r in members}),
                    "test": {k: v for k, v in zip(TEST_KEYS, test) if v is not None}, "metric": metric,
                    "higher_is_better": higher_is_better, "base_devices": rows[0]["devices"],
                    "reference": refv, "rows": rows, "verdict": verdict(rows)})
    return out


def price_of(rec: Any) -> float | None:
    """The price per device-hour a run's cost figures were computed at (None: not priced)."""
    v = ((rec.raw or {}).get("cost") or {}).get("price_per_hour", (rec.metrics or {}).get("price_per_hour"))
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def prices(recs: Iterable[Any]) -> list[float]:
    """The distinct prices per device-hour of the priced runs among ``recs``, lowest first: what a
    per-dollar mean over them was computed at."""
    return sorted({p for p in map(price_of, recs) if p is not None})


def mean_of(recs: Sequence[Any], metric: str) -> float | None:
    """The mean of ``metric`` over the records that have it; None when none does."""
    vals = [float(r.metrics[metric]) for r in recs if isinstance(r.metrics.get(metric), (int, float))
            and not isinstance(r.metrics.get(metric), bool)]
    return mean(vals) if vals else None


def describe(domain: Mapping[str, Any]) -> str:
    """'resnet50 on box-1, batch 8/device, 32px, fp32' for a domain entry, leaving out unknowns."""
    from dlscale.analysis.scaling import describe as describe_test

    where = domain["system"] or " + ".join(domain["systems"])
    return describe_test(domain["model"], {**domain["test"], "system": where})
