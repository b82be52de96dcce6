"""Imported rows -> run records (``imported=True``), and the seed papers' reference datasets.

An imported record has kind ``train`` (throughput, time to accuracy: what a short or long test
measures), ``imported`` true, the system it came from in ``config["system"]`` and where it came
from in ``config["source"]``. Its ``system`` inventory holds only ``{"name": ..., "imported": true}``:
nothing about this machine is attached to a number made elsewhere. Storing a file's records once
(however many processes import it at once) is the store's job: ``Store.insert_imports``.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.importers.parsers import PARSERS, PRECISIONS, ImportedRow, check_row, detect
from dlscale.record import RunRecord, utc_now
from dlscale.workloads.base import FAMILIES, family_of

REFERENCE_PACKAGE, REFERENCE_DIR = "dlscale.facts", "reference"


def to_record(row: ImportedRow, source: str, tag: str | None, index: int = 0) -> RunRecord:
    world = row.world_size or row.extra.get("devices_total")
    config: dict[str, Any] = {
        "model": row.model, "system": row.system, "precision": row.precision, "batch_size": row.batch_size,
        "nodes": row.nodes, "devices_per_node": row.devices_per_node, "world_size": world,
        "source": source, "source_format": row.source_format, "source_index": index,
    }
    if row.target_accuracy is not None:
        config["target_accuracy"] = row.target_accuracy
    if row.note:
        config["note"] = row.note
    config.update({f"source_{k}": v for k, v in row.extra.items() if k not in ("devices_total", "family")})
    config["family"] = _family(row)
    config["sample_unit"] = FAMILIES[config["family"]]
    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    if row.throughput is not None:
        metrics["throughput"] = row.throughput
        units["throughput"] = f"{config['sample_unit']}/s"
        if row.throughput_ci_halfwidth is not None:  # Horovod prints mean +- 1.96 sd over iterations
            metrics["throughput_ci95"] = [row.throughput - row.throughput_ci_halfwidth,
                                          row.throughput + row.throughput_ci_halfwidth]
            units["throughput_ci95"] = f"{config['sample_unit']}/s"
    for name, value, unit in (("time_to_accuracy", row.time_to_accuracy_s, "s"), ("epochs", row.epochs, "epochs"),
                              ("speedup", row.speedup, "x")):
        if value is not None:
            metrics[name] = value
            units[name] = unit
    if world:
        metrics["world_size"] = world
        units["world_size"] = "ranks"
    raw: dict[str, Any] = {k: v for k, v in row.series.items() if v}
    e_metrics, e_units, e_raw = imported_energy(row, config["sample_unit"])
    metrics.update(e_metrics)
    units.update(e_units)
    raw.update(e_raw)
    rec = RunRecord(kind="train", workload=row.model, config=config, metrics=metrics, units=units,
                    raw=raw, tag=tag, imported=True, system={"name": row.system, "imported": True})
    rec.finished_at = utc_now()
    return rec


def imported_energy(row: ImportedRow, unit: str) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The energy figures of a row that carries power or energy (MLPerf power submissions), derived as a
    measured run's are (docs/METRICS.md, "Energy and cost"): with power P and throughput X,
    ``units_per_joule = X / P``; with energy E and a time to accuracy, ``energy_to_target_kwh = E / 3.6e6``."""
    if row.avg_power_w is None and row.energy_j is None:
        return {}, {}, {}
    m: dict[str, Any] = {}
    power = row.avg_power_w
    if power is None and row.energy_j is not None and row.time_to_accuracy_s:
        power = row.energy_j / row.time_to_accuracy_s
    if power is not None:
        m["avg_power_w"] = power
        if row.throughput:
            m.update(units_per_joule=row.throughput / power, energy_per_unit_j=power / row.throughput)
    if row.energy_j is not None:
        m["energy_j"] = row.energy_j
        if row.time_to_accuracy_s is not None:
            m["energy_to_target_kwh"] = row.energy_j / 3.6e6
    from dlscale.harness.energy_meter import UNITS

    units = {k: UNITS[k].replace("{unit}", unit) for k in m}
    return m, units, {"energy": {"source": f"imported ({row.source_format})", "domains": ["system"], "reason": None}}


def _family(row: ImportedRow) -> str:
    """A ``family`` column where the file has one (checked), else the family of a registered model name."""
    given = row.extra.get("family")
    if given is None:
        return family_of(row.model)
    if given not in FAMILIES:
        raise UsageError(f"row {row.model!r}: unknown family {given!r}; choose one of {', '.join(FAMILIES)}")
    return str(given)


def parse_file(path: str | Path, fmt: str = "auto") -> list[ImportedRow]:
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read {p}: {e.strerror}") from None
    kind = detect(text) if fmt == "auto" else fmt
    if kind not in PARSERS:
        raise UsageError(f"unknown --input-format {fmt!r}; choose auto, {', '.join(PARSERS)}")
    rows = PARSERS[kind](text)
    if not rows:
        raise UsageError(f"{p}: no results found in it as {kind} (no finished run in the file)")
    if kind != "csv":  # a CSV row is checked where its line is known
        for i, row in enumerate(rows, 1):
            check_row(row, f"{p}: run {i} ({row.model})")
    return rows


def with_overrides(rows: list[ImportedRow], **overrides: Any) -> list[ImportedRow]:
    """Fill what a log does not say (system name, nodes, precision) from the command line (checked here)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    for key in ("nodes", "devices_per_node"):
        if key in given and given[key] < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be >= 1, got {given[key]}")
    if "precision" in given:
        if given["precision"].lower() not in PRECISIONS:
            raise UsageError(f"unknown --precision {given['precision']!r}; choose one of {', '.join(PRECISIONS)}")
        given["precision"] = given["precision"].lower()
    return [replace(r, **given) for r in rows]


# -- reference datasets -------------------------------------------------------------------------
def reference_names() -> list[str]:
    return sorted(f.name[:-4] for f in _ref_dir().iterdir() if f.name.endswith(".csv"))


def reference_text(name: str) -> str:
    f = _ref_dir() / f"{name}.csv"
    if not f.is_file():
        raise UsageError(f"unknown reference dataset {name!r}; known: {', '.join(reference_names())}")
    return f.read_text()


def reference_source(name: str) -> str:
    """The ``# source:`` lines at the top of a reference CSV."""
    return " ".join(ln.split(":", 1)[1].strip() for ln in reference_text(name).splitlines()
                    if ln.startswith("# source:"))


def reference_records(name: str, tag: str | None = None) -> list[RunRecord]:
    """A reference dataset as imported records (not written anywhere), tagged ``ref:NAME``."""
    from dlscale.importers.parsers import parse_csv

    rows = parse_csv(reference_text(name))
    src = f"reference:{name} ({reference_source(name)})"
    return [to_record(r, src, tag or f"ref:{name}", i) for i, r in enumerate(rows)]


def _ref_dir():
    return resources.files(REFERENCE_PACKAGE) / REFERENCE_DIR
