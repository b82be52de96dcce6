"""Healthy figures: the table of what a healthy system of each GPU model gives, and expectations made of it.

The table ships as ``dlscale/facts/healthy.yaml`` (each row with its source and tolerance; the file's
head says what a row holds; each model names its row of the GPU facts, ``dlscale.gpus``, whose device
names and PCI ids it matches on); a lab's own file (``dlscale accept refs export``, ``outputs/healthy_export.py``)
has the same form and, given with ``--refs FILE``, comes first: its rows are tried before the
shipped ones. A figure's row is found by its device model (the driver's name, else the PCI device
id), its check and figure name, and the row's ``when`` (the topology and options its source
measured: GPU count, nodes (a collectives row without ``nodes`` is one node's), largest message or
the message sizes, NVLinks of a pair, PCIe link, the short test's model, batch and precision). Of
the rows that match, the first ``typical`` one and the first ``floor`` one each make an expectation
of kind ``healthy``:

- typical: expected = the row's value; the warn line is at least the row's tolerance (a healthy
  system of the model measures down to it) and the fail line at least the warn line; the noise of
  the test is the tolerance read as a one-sided 95% edge, sigma = -log(1 - tolerance) / 1.645
  (``significance.vs_known``);
- floor: a published pass/fail minimum: warn and fail lines at 0 (below the floor, significantly by
  the figure's own samples, FAILs; a shortfall inside them WARNs).

A collectives row with ``sizes`` (the message sizes its source measured, e.g. ``1G:8G`` or ``16G``)
is converted to the run, not matched on its largest size: it applies to a run that measured every
one of those sizes, and holds the run's busbw *at those sizes* (the geometric mean of their cells)
to the row: the expectation on the run's plateau figure is the row's value x plateau / (busbw at the
row's sizes), so the verdict's ratio is exactly busbw at the row's sizes over the row.

Every row, shipped or a lab's, is held to its datasheet figure where one is known
(``datasheet.row_figure``): a value outside ``DATASHEET_RANGE`` of it (a unit slip such as MB/s
written for GB/s, or a floor that passes anything) is refused at load, naming the row, the value,
the datasheet figure and the ratio. Where a figure has a typical row the datasheet x fraction is
not used (``accept/expectations.py``). Pure, but for reading the files. docs/METRICS.md ("Acceptance: healthy
figures").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale import gpus
from dlscale.accept.figures.figure import Figure
from dlscale.accept.judging.verdict import Expectation
from dlscale.accept.sources import datasheet
from dlscale.errors import UsageError
from dlscale.gpus import normalize_name
from dlscale.yamlfile import read_yaml

BUILT_IN = "built-in"
BASES = ("typical", "floor")
WHEN = ("world_size", "nodes", "max_size", "sizes", "nvlinks", "pcie", "path", "model", "batch_size", "precision",
        "channels_last", "image_size")
DATASHEET_RANGE = (0.3, 1.0)  # a row's value over its datasheet figure: outside this it is refused
FIELDS = ("check", "figure", "value", "unit", "basis", "tolerance", "when", "topology", "source", "url")
Z95 = 1.6448536269514722  # the standard normal's 95th percentile


@dataclass(frozen=True)
class Row:
    model: str  # "H100 SXM"
    names: tuple[str, ...]  # device names as the driver reports them
    check: str
    figure: str
    value: float
    unit: str
    basis: str  # "typical" | "floor"
    source: str
    tolerance: float | None = None
    when: dict[str, Any] = field(default_factory=dict)
    topology: str = ""
    url: str = ""
    pci_ids: tuple[int, ...] = ()
    origin: str = BUILT_IN  # the file it came from

    @property
    def when_text(self) -> str:
        """'world_size=8, sizes=1G,2G,4G,8G, nvlinks=18': the row's ``when``, sizes as nccl-tests writes them."""
        return ", ".join(f"{k}={_sizes_text(v if isinstance(v, tuple) else (v,)) if 'size' in k else v}"
                         for k, v in self.when.items())

    @property
    def sigma(self) -> float | None:
        """The between-system noise of a typical row: its tolerance as a one-sided 95% edge in log."""
        return -math.log(1 - self.tolerance) / Z95 if self.tolerance else None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "names": list(self.names), "check": self.check, "figure": self.figure,
                "value": self.value, "unit": self.unit, "basis": self.basis, "tolerance": self.tolerance,
                "when": self.when, "topology": self.topology, "source": self.source, "url": self.url,
                "origin": self.origin}


# -- reading a table ------------------------------------------------------------------------------------
def built_in_path() -> Path:
    """The shipped table, found through importlib.resources beside the GPU facts."""
    return gpus.built_in_path().with_name("healthy.yaml")


def load(path: str | Path | None = None) -> list[Row]:
    """The rows of a lab file (``path``) and then the shipped table's; a problem is a UsageError at file:line."""
    rows = _read(Path(path), str(path)) if path else []
    return rows + _read(built_in_path(), BUILT_IN)


def _read(path: Path, origin: str) -> list[Row]:
    doc, lines = read_yaml(path, "healthy-figures file", "`models:`")
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise lines.fail((), "must be a mapping with `models:`, a list of {model, names, rows}")
    rows = []
    for i, m in enumerate(doc["models"]):
        where = ("models", i)
        m = _model(m, lines, where)
        for j, r in enumerate(m.get("rows") or []):
            rows.append(_row(m, r, lines, where + ("rows", j), origin))
    return rows


def _model(m: Any, lines: Any, where: tuple) -> dict[str, Any]:
    """A model with its device names and PCI ids: those of its GPU-facts row (``gpu:``, a label there), or, for
    a GPU the facts lack, its own ``names:`` (and ``pci_ids:``)."""
    if not isinstance(m, dict) or not m.get("model"):
        raise lines.fail(where, "each model needs `model:` (a label) and `gpu:` (its row of the GPU facts) or "
                                "`names:` (the driver's device names)")
    if m.get("gpu") is not None:
        if "names" in m or "pci_ids" in m:
            raise lines.fail(where + ("gpu",), "give `gpu:` or `names:` and `pci_ids:`, not both: a GPU-facts row "
                                               "brings its names and PCI ids")
        try:
            row = gpus.by_label(str(m["gpu"]))
        except UsageError as e:
            raise lines.fail(where + ("gpu",), str(e)) from None
        return {**m, "names": list(row.names), "pci_ids": list(row.pci_ids)}
    if not isinstance(m.get("names"), list) or not m["names"]:
        raise lines.fail(where, "each model needs `gpu:` (its row of the GPU facts) or `names:` (the driver's "
                                "device names)")
    return m


def _row(m: dict[str, Any], r: Any, lines: Any, where: tuple, origin: str) -> Row:
    if not isinstance(r, dict):
        raise lines.fail(where, "a row is a mapping: {check, figure, value, unit, basis, source, ...}")
    for k in r:
        if k not in FIELDS:
            raise lines.fail(where + (k,), f"unknown field {k!r}; fields: {', '.join(FIELDS)}")
    for k in ("check", "figure", "unit", "source"):
        if not isinstance(r.get(k), str) or not r[k].strip():
            raise lines.fail(where + (k,), f"`{k}:` is needed (text): no row without its source")
    value, tol, basis = r.get("value"), r.get("tolerance"), r.get("basis", "typical")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise lines.fail(where + ("value",), f"must be a positive number, got {value!r}")
    if basis not in BASES:
        raise lines.fail(where + ("basis",), f"must be one of {', '.join(BASES)}, got {basis!r}")
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < 1):
        raise lines.fail(where + ("tolerance",), f"must be a fraction in [0, 1), got {tol!r}")
    when = r.get("when") or {}
    if not isinstance(when, dict) or any(k not in WHEN for k in when):
        raise lines.fail(where + ("when",), f"must map some of {', '.join(WHEN)} to values")
    try:
        values = {k: _when_value(k, v) for k, v in when.items()}
    except UsageError as e:
        raise lines.fail(where + ("when",), str(e)) from None
    row = Row(str(m["model"]), tuple(str(n) for n in m["names"]), r["check"], r["figure"], float(value), r["unit"],
              basis, " ".join(r["source"].split()), float(tol) if tol is not None else None, values,
              str(r.get("topology") or ""), str(r.get("url") or ""), tuple(int(p) for p in m.get("pci_ids") or []),
              origin)
    problem = against_datasheet(row)
    if problem:
        raise lines.fail(where + ("value",), problem)
    return row


def _when_value(key: str, v: Any) -> Any:
    from dlscale.micro.collectives import parse_size, parse_sizes

    if key == "max_size" and isinstance(v, str):
        return parse_size(v)
    if key == "sizes":
        return tuple(parse_sizes(",".join(map(str, v)) if isinstance(v, list) else str(v)))
    return v


def against_datasheet(row: Row) -> str:
    """Why ``row`` is refused against its datasheet figure ('' where it is within ``DATASHEET_RANGE`` of
    it or no datasheet figure is known)."""
    rated = datasheet.row_figure(row)
    if rated is None:
        return ""
    ratio = row.value / rated[0]
    lo, hi = DATASHEET_RANGE
    if lo <= ratio <= hi:
        return ""
    return (f"row {row.model} {row.check} {row.figure!r} ({row.basis}): {row.value:g} {row.unit} is {ratio:.3g} of "
            f"its datasheet figure {rated[0]:.5g} {row.unit} ({rated[1]}); refused, a row must lie within {lo:g} to "
            f"{hi:g} of it (a unit slip, or a threshold that passes anything)")


# -- matching a figure ------------------------------------------------------------------------------------
def facts(fig: Figure, system: dict[str, Any]) -> dict[str, Any]:
    """What a row's ``when`` and model are checked against: the figure's context and its device's facts."""
    out = dict(fig.context)
    idx = _cuda_index(fig)
    gpus = ((system or {}).get("accelerators") or {}).get("devices") or []
    if idx is not None:
        out["name"] = next((d.get("name") for d in gpus if d.get("index") == idx), None) or fig.model
        g = datasheet.gpu_facts(system, idx)
        out["pci_id"] = g.get("pci_device_id")
        if g.get("pcie_gen_max") and g.get("pcie_width_max"):
            out["pcie"] = f"Gen{g['pcie_gen_max']} x{g['pcie_width_max']}"
    elif gpus and fig.subject is None and "(host memory)" not in fig.name and fig.check != "links":
        out["name"] = gpus[0].get("name")  # a figure of the GPUs together (collectives, training on all)
    else:
        out["name"] = ((system or {}).get("cpu") or {}).get("model")  # the host's, or a CPU machine's
    if fig.check == "p2p":
        out["nvlinks"] = datasheet.nvlinks(system, int(fig.context["src"]), int(fig.context["dst"]))
    if fig.check == "collectives":
        out["nodes"] = int(fig.context.get("nodes") or 1)
    if fig.check == "collectives" and fig.context.get("world_size"):
        n = int(fig.context["world_size"])
        links = [datasheet.nvlinks(system, i, j) for i in range(n) for j in range(n) if i != j]
        out["nvlinks"] = min(links) if links else 0
    return out


def _cuda_index(fig: Figure) -> int | None:
    devs = fig.subject.devices if fig.subject is not None else ()
    if not devs:
        return None
    last = str(devs[0]).split()[-1]  # "cuda:3", or "gpu07 cuda:3" on several hosts
    return int(last.split(":")[1]) if last.startswith("cuda:") else None


def matches(row: Row, fig: Figure, f: dict[str, Any]) -> bool:
    if row.check != fig.check or row.figure != fig.name:
        return False
    named = normalize_name(str(f.get("name") or "")) in {normalize_name(n) for n in row.names}
    if not named and not (f.get("pci_id") is not None and f.get("pci_id") in row.pci_ids):
        return False
    want = {"nodes": 1, **row.when} if row.check == "collectives" else row.when  # a node's, unless it says
    cells = fig.context.get("cells") or {}
    if "sizes" in want and not all(any(v > 0 for v in cells.get(s, ())) for s in want["sizes"]):
        return False  # the run did not measure every size the row's source did
    return all(f.get(k) == v for k, v in want.items() if k != "sizes")


def rows_for(fig: Figure, system: dict[str, Any], rows: Sequence[Row]) -> list[Row]:
    """The first matching typical row and the first matching floor row (in table order: a lab's first)."""
    f = facts(fig, system)
    out: dict[str, Row] = {}
    for r in rows:
        if r.basis not in out and matches(r, fig, f):
            out[r.basis] = r
    return [out[b] for b in BASES if b in out]


def expectation(row: Row, fig: Figure | None = None) -> Expectation:
    """The row's expectation on ``fig`` (a collectives row with ``sizes``: converted to the run's plateau)."""
    lab = "" if row.origin == BUILT_IN else f" (lab file {row.origin})"
    how = f"typical, tolerance {row.tolerance:g}" if row.basis == "typical" and row.tolerance is not None \
        else row.basis
    src = f"healthy {row.model}{lab}, {how}: {row.source}" + (f" <{row.url}>" if row.url else "")
    value = row.value
    if fig is not None and row.when.get("sizes"):
        at = busbw_at(fig, row.when["sizes"])
        value = row.value * fig.value / at
        src += (f"; converted: the row is the busbw at {_sizes_text(row.when['sizes'])}, where this run measured "
                f"{at:.4g} {row.unit} (its plateau {fig.value:.4g}), so on the plateau {row.value:g} x "
                f"{fig.value:.4g} / {at:.4g} = {value:.4g}")
    return Expectation("healthy", value, src, tolerance=row.tolerance if row.basis == "typical" else None,
                       sigma=row.sigma if row.basis == "typical" else None, floor=row.basis == "floor")


def busbw_at(fig: Figure, sizes: Sequence[int]) -> float:
    """A collective's busbw at the given sizes: the geometric mean of its cells there (``context.cells``)."""
    cells = [v for s in sizes for v in fig.context["cells"][s] if v > 0]
    return math.exp(sum(math.log(v) for v in cells) / len(cells))


def _sizes_text(sizes: Sequence[int]) -> str:
    """(2**30, 2**34) -> '1G,16G'."""
    from dlscale.format import fmt_size

    return ",".join(fmt_size(int(n)) for n in sizes)


def healthy_expectations(figs: Sequence[Figure], systems: dict[str, dict[str, Any]],
                         rows: Sequence[Row]) -> dict[int, list[Expectation]]:
    """Figure index -> its healthy expectations (typical, then floor)."""
    out = {}
    for i, f in enumerate(figs):
        found = rows_for(f, systems.get(f.run_id) or {}, rows)
        if found:
            out[i] = [expectation(r, f) for r in found]
    return out


def listing(rows: Sequence[Row], model: str | None = None) -> list[Row]:
    """The rows whose model label or device names contain ``model`` (case aside); all without it."""
    if not model:
        return list(rows)
    want = model.casefold()
    return [r for r in rows if want in r.model.casefold() or any(want in n.casefold() for n in r.names)]


def models(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(r.model for r in rows))
