"""``dlscale compare A B``: per-model % difference (seed 001 Tables 5-6) and relative scores;
``dlscale compare A --domains``: seed 000's domain scaling table (speed-up, efficiency, score)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from dlscale.cli.common import DbOpt, Format, FormatOpt, out, print_json

HELP = """Compare two selections of runs group by group (by model unless --by says otherwise).

Prints % difference = (A - B) / B for each group, positive when A is higher (seed 001, Tables
5-6), using the mean of the metric over each group's ok runs. With --reference REF it also prints
each selection's relative score over REF, MLPerf v0.5 style: X / X_ref for throughputs,
T_ref / T for times. Throughput is grouped by its sample unit (images/s, tokens/s, samples/s):
runs of different units are never averaged or divided, and A and B with no unit in common are
refused. --domains prints instead, for A (and B if given), seed 000's domain scaling table: per
family and model, the metric at each device count, the speed-up over the smallest device count,
the scaling efficiency (speed-up / device ratio) and, with --reference, the score over the
reference system. A selector is filters joined by commas: tag:NAME (or a bare tag),
system:NAME, model:NAME, run:ID+ID, ref:DATASET (a shipped reference dataset), imported:yes|no,
kind:KIND. Selections take measured runs: predictions only with kind:prediction. A --metric no
run of a side has, and A and B with no group (model) in common, are refused. Serving runs
(serve-bench) are compared load point by load point: their API, streaming, rate or concurrency, load
and cap in flight always join the group, so unlike load points are never averaged, and two sides
with no load point in common are refused, naming each side's."""

EPILOG = """Examples:\n\n
  dlscale compare ref:seed001-table5,system:SN-8xV100-16GB-SXM2 ref:seed001-table5,system:MN-C4140-K-V100-SXM2\n\n
  dlscale compare tag:after tag:before --by model,batch_size\n\n
  dlscale compare tag:mybox tag:baseline --reference ref:seed001-scaling,system:C4140-K-V100-SXM2 --by model,world_size\n\n
  dlscale compare tag:ladder --domains --reference tag:reference-box --format json"""


def compare(
    a: Annotated[str, typer.Argument(help="Selection A (e.g. tag:after).", show_default=False)],
    b: Annotated[Optional[str], typer.Argument(help="Selection B, the baseline (e.g. tag:before); optional with --domains.", show_default=False)] = None,
    by: Annotated[str, typer.Option("--by", help="Group by these fields (comma-separated): model, family, unit, batch_size, precision, image_size, seq_len, tokens_per_batch, model_config, world_size, nodes, layout, link, system; serving: api, stream, mode, load, max_concurrency (always joined for serving runs), prompt_len, output_len.")] = "model",
    metric: Annotated[str, typer.Option("--metric", help="The metric compared (a key of the runs' metrics).")] = "throughput",
    reference: Annotated[Optional[str], typer.Option("--reference", help="Also score A and B relative to this selection (MLPerf v0.5 style).", show_default=False)] = None,
    domains: Annotated[bool, typer.Option("--domains", help="Seed 000's domain scaling table of A (and B): per family and model, by device count.")] = False,
    across_systems: Annotated[bool, typer.Option("--across-systems", help="With --domains: one domain may take its device counts from several systems (one system per count, as seed 000's servers).")] = False,
    db: DbOpt = None,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.analysis import compare as cmp
    from dlscale.analysis.select import select
    from dlscale.errors import UsageError
    from dlscale.store import Store

    if b is None and not domains:
        raise UsageError("give selection B (the baseline), or --domains for the domain scaling table of A")
    if across_systems and not domains:
        raise UsageError("--across-systems applies to --domains only; add --domains or drop it")
    keys = [k.strip() for k in by.split(",") if k.strip()]
    cmp.check_keys(keys)
    with Store.open(db, create=False) as store:
        ra = select(store, a)
        rb = select(store, b) if b is not None else None
        rref = select(store, reference) if reference else None
    cmp.check_metric({f"A ({a})": ra, **({f"B ({b})": rb} if rb is not None else {})}, metric)
    if domains:
        _domains({a: ra, **({b: rb} if b is not None and rb is not None else {})}, rref, reference, metric,
                 across_systems, fmt)
        return
    _pct(a, b or "", ra, rb or [], rref, reference, keys, metric, fmt)


def _pct(a: str, b: str, ra: list, rb: list, rref: list | None, reference: str | None, keys: list[str],
         metric: str, fmt: Format) -> None:
    """The % difference table (and scores over the reference) of A against B."""
    from dlscale.analysis import compare as cmp

    from dlscale.analysis.efficiency import has_efficiency, ranking

    hib = cmp.higher_is_better([*ra, *rb], metric)
    rows = cmp.pct_table(ra, rb, keys, metric)
    scores = cmp.score_table({"A": ra, "B": rb}, rref, keys, metric, hib) if rref is not None else None
    ranked = ranking([*ra, *rb]) if has_efficiency([*ra, *rb]) else None
    if fmt == Format.json:
        print_json({"a": a, "b": b, "by": keys, "metric": metric, "formula": "(A - B) / B",
                    "rows": rows, "reference": reference, "higher_is_better": hib, "scores": scores,
                    "ranking": ranked})
        return
    shown = cmp.group_keys(keys, metric, [*ra, *rb, *(rref or [])])  # what a row is keyed on (serving: its point)
    out.print(pct_rich_table(rows, shown, metric, a, b))
    if ranked:
        out.print(ranking_rich_table(ranked))
    if scores is not None:
        rule = "X / X_ref" if hib else "T_ref / T"
        unit_col = ["unit"] if "unit" not in shown and any("unit" in r for r in scores) else []
        t = Table(*shown, *unit_col, f"reference {metric}", "A score", "B score",
                  title=f"relative score over the reference ({rule}; MLPerf v0.5 style)\nreference = {reference}",
                  title_justify="left")
        for r in scores:
            t.add_row(*[_s(r.get(k)) for k in shown], *[_s(r.get("unit")) for _ in unit_col], _num(r["reference"]),
                      _x(r["A"]), _x(r["B"]))
        out.print(t)


def pct_rich_table(rows, keys, metric: str, a: str, b: str) -> Table:
    from dlscale.analysis.domains import EFFICIENCY

    unit_col = ["unit"] if "unit" not in keys else []
    extra = [m for m in EFFICIENCY.get(metric, ()) if any(r.get(f"{m}_a") is not None or r.get(f"{m}_b") is not None
                                                          for r in rows)]
    priced = any("prices_a" in r for r in rows)  # a per-$ figure is shown with the prices it was computed at
    t = Table(*keys, *unit_col, f"A {metric}", f"B {metric}", "% difference",
              *[f"{side} {EFFICIENCY_LABELS[m]}" for m in extra for side in "AB"],
              *(["A at $/device-h", "B at $/device-h"] if priced else []), "runs A/B (imported)",
              title=f"% difference = (A - B) / B   (seed 001 Tables 5-6; positive: A higher)\nA = {a}\nB = {b}",
              title_justify="left")
    for r in rows:
        pct = r["pct_difference"]
        t.add_row(*[_s(r[k]) for k in keys], *[_s(r.get("unit")) for _ in unit_col], _num(r["a"]), _num(r["b"]),
                  "-" if pct is None else f"{pct * 100:+.2f}%",
                  *[_num(r.get(f"{m}_{side}")) for m in extra for side in "ab"],
                  *([_prices(r.get("prices_a")), _prices(r.get("prices_b"))] if priced else []),
                  f"{r['n_a']}/{r['n_b']}" + (f" ({r['imported_a']}/{r['imported_b']})" if r["imported_a"] or r["imported_b"] else ""))
    return t


def _prices(prices: list[float] | None) -> str:
    """'2.50' / '2.50, 3.00' (a mean over runs at different prices says so) / '-'."""
    return ", ".join(_num(p) for p in prices) if prices else "-"


# column heads of the per-joule and per-dollar figures (each row's unit names what is counted)
EFFICIENCY_LABELS = {"units_per_joule": "per J", "units_per_dollar": "per $", "energy_to_target_kwh": "kWh",
                     "cost_to_target": "$"}


def ranking_rich_table(rows: list[dict[str, Any]]) -> Table:
    """Which system gives the most sample units per kWh and per dollar, per model."""
    t = Table("unit", "model", "system", "throughput", "per kWh", "rank (kWh)", "per $", "at $/device-h", "rank ($)",
              "runs", title="ranking: sample units per kWh and per dollar (1 = most), per model", title_justify="left")
    for r in rows:
        t.add_row(r["unit"], r["model"], r["system"], _num(r["throughput"]), _num(r["units_per_kwh"]),
                  _s(r["rank_per_kwh"]), _num(r["units_per_dollar"]), _num(r.get("price_per_hour")),
                  _s(r["rank_per_dollar"]), str(r["runs"]))
    return t


def _domains(selections: dict[str, list], rref: list | None, reference: str | None, metric: str,
             across_systems: bool, fmt: Format) -> None:
    """Seed 000's domain scaling table of each selection (JSON: one document with all of them)."""
    from dlscale.analysis import compare as cmp
    from dlscale.analysis import domains as dom

    hib = cmp.higher_is_better([r for recs in selections.values() for r in recs], metric)
    from dlscale.analysis.efficiency import has_efficiency, ranking

    tables = {name: dom.domain_table(recs, rref, metric, hib, across_systems=across_systems)
              for name, recs in selections.items()}
    every = [r for recs in selections.values() for r in recs]
    ranked = ranking(every) if metric == "throughput" and has_efficiency(every) else None
    if fmt == Format.json:
        print_json({"metric": metric, "higher_is_better": hib, "reference": reference, "across_systems": across_systems,
                    "speedup": "X_N / X_n0" if hib else "T_n0 / T_N", "efficiency": "speed-up / (N / n0)",
                    "score": ("X_N / X_ref" if hib else "T_ref / T_N") if reference else None,
                    "selections": [{"selector": name, "domains": t} for name, t in tables.items()],
                    "ranking": ranked})
        return
    for name, table in tables.items():
        if not table:
            out.print(f"{name}: no ok runs with {metric} to tabulate", markup=False)
        for d in table:
            out.print(domain_rich_table(d, name, reference))
    if ranked:
        out.print(ranking_rich_table(ranked))


def domain_rich_table(d: dict[str, Any], selector: str, reference: str | None) -> Table:
    """One domain: its rows per device count, the value in the domain's own unit."""
    from dlscale.analysis.domains import EFFICIENCY, describe

    ref = d["reference"]
    ref_words = ""
    if reference:
        ref_words = (f"\nreference = {reference}: " + (f"{_num(ref['value'])} {d['unit']} on {ref['devices']} device(s)"
                                                       if ref and ref["value"] is not None else
                                                       (ref or {}).get("note") or "no run of this model and shape"))
    extra = [m for m in EFFICIENCY.get(d["metric"], ()) if any(r.get(m) is not None for r in d["rows"])]
    from dlscale.analysis.compare import DOLLARS

    priced = any(m in DOLLARS for m in extra)
    t = Table("devices", f"{d['metric']} ({d['unit']})", "speed-up", "device ratio", "efficiency", "score",
              *[f"{d['sample_unit']} {EFFICIENCY_LABELS[m]}" if m.startswith("units_") else EFFICIENCY_LABELS[m]
                for m in extra], *(["at $/device-h"] if priced else []), "runs",
              "systems", title=f"{d['family']} ({d['sample_unit']}): {describe(d)}   [{selector}]\nspeed-up over "
              f"{d['base_devices']} device(s); verdict: {d['verdict'] or '-'}{ref_words}", title_justify="left")
    for r in d["rows"]:
        t.add_row(str(r["devices"]), _num(r["value"]), _x(r["speedup"]), f"{r['device_ratio']:g}",
                  f"{r['efficiency'] * 100:.1f}%", _x(r["score"]), *[_num(r.get(m)) for m in extra],
                  *([_prices(r.get("prices"))] if priced else []), str(r["runs"]),
                  ", ".join(r["systems"]))
    return t


def _s(v) -> str:
    return "-" if v is None else str(v)


def _num(v) -> str:
    from dlscale.format import fmt_num

    return fmt_num(v)


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x" if v >= 0.1 else f"{v:.2g}x"
