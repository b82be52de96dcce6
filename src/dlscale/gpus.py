"""GPU facts: the one reader of ``dlscale/facts/gpus.yaml``, the one table of what each GPU model is and
what its datasheet rates it at.

A row is one SKU: the device names the driver reports, its PCI device ids, architecture and board, dense
TFLOP/s per precision, memory bandwidth and size, NVLink generation and links, PCIe link, and the source of
each group of facts. Beside the rows: the link technologies' rates (NVLink generations, PCIe generations,
InfiniBand, Ethernet) and the measured GEMM fractions per architecture and board. The file is read and
checked once per process (``table``); a problem is a one-line ``UsageError`` naming the file's line and the
row. ``peaks`` (MFU), ``nvlink``, the acceptance's datasheet expectations, the predictor's datasheet links and
decode's limit ask here; nothing else holds a GPU's or a link's figure. No torch here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
GROUPS = ("tflops", "memory", "nvlink", "pcie", "pci_ids")  # what a row's `sources:` names
FIELDS = ("label", "names", "pci_ids", "arch", "board", "tflops", "tflops_with_sparsity", "memory_gbps",
          "memory_gb", "nvlink", "pcie", "sources")
DENSE = "; tensor rates dense = half the with-sparsity figures"


@dataclass(frozen=True)
class Sourced:
    """A figure and where it comes from (a rate, a fraction)."""

    value: float
    source: str


@dataclass(frozen=True)
class Gpu:
    """One SKU's facts; every group given has its source in ``sources`` (``GROUPS``)."""

    label: str
    names: tuple[str, ...]  # exact device names, as the driver reports them
    pci_ids: tuple[int, ...] = ()  # NVIDIA PCI device ids as NVML reports them
    arch: str = ""
    board: str = ""  # SXM / PCIe / superchip / OAM
    tflops: dict[str, float] = field(default_factory=dict)  # precision -> dense TFLOP/s
    memory_gbps: float | None = None
    memory_gb: float | None = None
    nvlink: tuple[int, int] | None = None  # (generation, links): all links wired on the board
    nvlink_gbps: float | None = None  # the datasheet's NVLink rate, all links both directions
    pcie: tuple[int, int] | None = None  # (generation, width)
    sources: dict[str, str] = field(default_factory=dict)  # group of facts (GROUPS) -> its source

    def source(self, group: str) -> str:
        return self.sources.get(group, "")

    @property
    def memory(self) -> Sourced | None:
        """The datasheet memory bandwidth (GB/s) and its source, else None."""
        return Sourced(self.memory_gbps, self.source("memory")) if self.memory_gbps else None


@dataclass(frozen=True)
class PcieGeneration:
    gts: float  # GT/s per lane
    share: float  # the line encoding's payload share: 8/10 or 128/130
    encoding: str
    source: str


@dataclass(frozen=True)
class Facts:
    """The whole table, as read."""

    gpus: tuple[Gpu, ...]
    nvlink: dict[int, Sourced]  # generation -> GB/s per link and direction
    pcie: dict[int, PcieGeneration]
    infiniband: dict[str, Sourced]  # EDR/HDR/NDR -> Gb/s of a 4x link
    ethernet: dict[int, Sourced]  # 10/25/100/400 -> Gb/s
    gemm_fractions: dict[tuple[str, str, str], Sourced]  # (arch, board, precision) -> measured fraction
    no_gemm_fraction: dict[str, str]  # architecture -> why it has none
    by_name: dict[str, Gpu]
    by_pci: dict[int, Gpu]


def normalize_name(name: str) -> str:
    """Case and runs of whitespace only: 'nvidia  H100 pcie ' -> 'nvidia h100 pcie'."""
    return " ".join(name.split()).casefold()


def built_in_path() -> Path:
    """The shipped table, found through importlib.resources (an installed wheel's copy, or the source tree's)."""
    return Path(str(resources.files("dlscale.facts") / "gpus.yaml"))


@functools.cache
def table() -> Facts:
    """The shipped table, read and checked once per process."""
    return load(built_in_path())


def load(path: str | Path) -> Facts:
    """A GPU-facts file, checked: a problem is a UsageError ``FILE:LINE: where: what`` naming the row."""
    from dlscale.yamlfile import read_yaml

    doc, lines = read_yaml(path, "GPU-facts file", "`gpus:`")
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        raise lines.fail((), "must be a mapping with `gpus:`, a list of rows")
    gpus = tuple(_gpu(g, lines, ("gpus", i)) for i, g in enumerate(doc["gpus"]))
    nvlink = {k: Sourced(float(v["gbps"]), v["source"])
              for k, (_, v) in _entries(doc, lines, "nvlink_generations", "generation", ("gbps",)).items()}
    pcie = {k: PcieGeneration(float(v["gts"]), _share(v, lines, where), v["encoding"], v["source"]) for k, (where, v)
            in _entries(doc, lines, "pcie_generations", "generation", ("gts",), ("encoding",)).items()}
    ib = {k: Sourced(float(v["gbit"]), v["source"])
          for k, (_, v) in _entries(doc, lines, "infiniband", "name", ("gbit",)).items()}
    eth = {k: Sourced(float(v["gbit"]), v["source"]) for k, (_, v) in _entries(doc, lines, "ethernet", "gbit").items()}
    by_name, by_pci = _index(gpus, nvlink, lines)
    return Facts(gpus, nvlink, pcie, ib, eth, _gemm_fractions(doc, lines), _no_gemm_fraction(doc, lines), by_name,
                 by_pci)


# -- asking the table --------------------------------------------------------------------------------------
def find(device_name: str | None, pci_id: int | None = None) -> Gpu | None:
    """The row of an exact (normalised) device name, else of a known PCI device id, else None."""
    t = table()
    row = t.by_name.get(normalize_name(device_name or ""))
    return row if row is not None or pci_id is None else t.by_pci.get(pci_id)


def by_label(label: str) -> Gpu:
    """The row of a label (the table's key); a UsageError naming the labels where none has it."""
    row = next((g for g in table().gpus if g.label == label), None)
    if row is None:
        raise UsageError(f"no GPU-facts row {label!r} in {built_in_path()}; labels: "
                         f"{', '.join(g.label for g in table().gpus)}")
    return row


def memory(device_name: str | None) -> Sourced | None:
    """The datasheet memory bandwidth (GB/s) of an exact (normalised) device name, and its source; else None."""
    row = find(device_name)
    return row.memory if row is not None else None


def pcie_gbps(gen: int | None, width: int | None) -> float | None:
    """GB/s per direction of a PCIe link: GT/s per lane x lanes / 8 x the encoding's share; None where the
    generation is not in the table or no width is known."""
    g = table().pcie.get(gen or 0)
    if g is None or not width:
        return None
    return g.gts * width / 8 * g.share


def gemm_fraction(arch: str, board: str, precision: str) -> Sourced | None:
    """The measured fraction of the dense peak a healthy part's best GEMM reaches, else None."""
    return table().gemm_fractions.get((arch, board, precision))


# -- checking a file ---------------------------------------------------------------------------------------
def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v > 0


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _gpu(g: Any, lines: Any, where: tuple) -> Gpu:
    if not isinstance(g, dict) or not _text(g.get("label")):
        raise lines.fail(where, "each row needs `label:` (its name in this table)")
    label = g["label"]
    for k in g:
        if k not in FIELDS:
            raise lines.fail(where + (k,), f"{label}: unknown field {k!r}; fields: {', '.join(FIELDS)}")
    names, pcis = g.get("names"), g.get("pci_ids") or []
    if not isinstance(names, list) or not names or not all(_text(n) for n in names):
        raise lines.fail(where + ("names",), f"{label}: `names:` lists the device names the driver reports")
    if not isinstance(pcis, list) or not all(isinstance(p, int) and 0 < p <= 0xFFFF for p in pcis):
        raise lines.fail(where + ("pci_ids",), f"{label}: `pci_ids:` lists 16-bit PCI device ids, e.g. [0x2330]")
    tflops = _tflops(g, lines, where, label)
    if tflops and not (_text(g.get("arch")) and _text(g.get("board"))):
        raise lines.fail(where, f"{label}: a row with TFLOP/s needs `arch:` and `board:` (its GEMM fraction's key)")
    for k in ("memory_gbps", "memory_gb"):
        if k in g and not _number(g[k]):
            raise lines.fail(where + (k,), f"{label}: must be a positive number, got {g[k]!r}")
    nvlink, nv_gbps = _pair(g, lines, where, label, "nvlink", ("generation", "links", "gbps"))
    pcie, _ = _pair(g, lines, where, label, "pcie", ("generation", "width"))
    sources = _sources(g, lines, where, label, {"tflops": bool(tflops), "pci_ids": bool(pcis), "pcie": bool(pcie),
                                                 "memory": "memory_gbps" in g or "memory_gb" in g,
                                                 "nvlink": bool(nvlink)})
    if g.get("tflops_with_sparsity"):
        sources["tflops"] += DENSE  # the reader halves those figures: the source says so
    return Gpu(label, tuple(names), tuple(pcis), str(g.get("arch") or ""), str(g.get("board") or ""), tflops,
               g.get("memory_gbps"), g.get("memory_gb"), nvlink, nv_gbps, pcie, sources)


def _tflops(g: dict[str, Any], lines: Any, where: tuple, label: str) -> dict[str, float]:
    dense: dict[str, float] = {}
    for key, scale in (("tflops", 1.0), ("tflops_with_sparsity", 0.5)):
        got = g.get(key) or {}
        if not isinstance(got, dict):
            raise lines.fail(where + (key,), f"{label}: maps precisions to TFLOP/s")
        for p, v in got.items():
            if p not in PRECISIONS or not _number(v):
                raise lines.fail(where + (key, p), f"{label}: {p}: a precision of {', '.join(PRECISIONS)} and a "
                                                   f"positive TFLOP/s, got {v!r}")
            if p in dense:
                raise lines.fail(where + (key, p), f"{label}: {p} is given both dense and with sparsity")
            dense[p] = v * scale
    return dense


def _pair(g: dict[str, Any], lines: Any, where: tuple, label: str, key: str,
          keys: tuple[str, ...]) -> tuple[tuple[int, int] | None, float | None]:
    v = g.get(key)
    if v is None:
        return None, None
    if not isinstance(v, dict) or set(v) != set(keys) or not all(_number(v[k]) for k in keys) \
            or not all(isinstance(v[k], int) for k in keys[:2]):
        raise lines.fail(where + (key,), f"{label}: `{key}:` is {{{', '.join(keys)}}}, positive whole numbers")
    return (v[keys[0]], v[keys[1]]), (float(v[keys[2]]) if len(keys) > 2 else None)


def _sources(g: dict[str, Any], lines: Any, where: tuple, label: str,
             given: dict[str, bool]) -> dict[str, str]:
    src = g.get("sources")
    if not isinstance(src, dict):
        raise lines.fail(where + ("sources",), f"{label}: `sources:` names where each group of facts comes from")
    for group, has in given.items():
        if has and not _text(src.get(group)):
            raise lines.fail(where + ("sources",), f"{label}: its {group} has no source; no fact without its source")
    for group in src:
        if not given.get(group):
            raise lines.fail(where + ("sources", group), f"{label}: a source for {group!r}, which the row does not "
                                                         f"give (groups: {', '.join(GROUPS)})")
    return {k: " ".join(v.split()) for k, v in src.items()}


def _entries(doc: dict[str, Any], lines: Any, key: str, id_key: str, numbers: tuple[str, ...] = (),
             texts: tuple[str, ...] = ()) -> dict[Any, tuple[tuple, dict[str, Any]]]:
    """A section of link rates, a list of {id_key, numbers..., texts..., source}: by id (each given once), each
    with its place in the file. A generation or a rate as id is a positive whole number, a name is text."""
    got = doc.get(key)
    if not isinstance(got, list) or not got:
        raise lines.fail((key,) if key in doc else (), f"`{key}:` is needed, a list of {{{id_key}, ..., source}}")
    out: dict[Any, tuple[tuple, dict[str, Any]]] = {}
    fields = {id_key, *numbers, *texts, "source"}
    for i, v in enumerate(got):
        where = (key, i)
        ident = v.get(id_key) if isinstance(v, dict) else None
        if not isinstance(v, dict) or set(v) != fields or not all(_number(v[n]) for n in numbers) \
                or not all(_text(v[t]) for t in (*texts, "source")) \
                or not (_text(ident) if id_key == "name" else isinstance(ident, int) and _number(ident)):
            raise lines.fail(where, f"is {{{', '.join(sorted(fields))}}}: positive numbers and a source")
        if ident in out:
            raise lines.fail(where + (id_key,), f"{ident} is given twice")
        out[ident] = where, {**v, "source": " ".join(v["source"].split())}
    return out


def _share(v: dict[str, Any], lines: Any, where: tuple) -> float:
    """A line encoding's payload share: '128b/130b' -> 128/130."""
    m = re.fullmatch(r"(\d+)b/(\d+)b", str(v["encoding"]))
    if m is None or not 0 < int(m.group(1)) < int(m.group(2)):
        raise lines.fail(where + ("encoding",), f"an encoding is NNb/MMb (e.g. 128b/130b), got {v['encoding']!r}")
    return int(m.group(1)) / int(m.group(2))


def _gemm_fractions(doc: dict[str, Any], lines: Any) -> dict[tuple[str, str, str], Sourced]:
    out: dict[tuple[str, str, str], Sourced] = {}
    for i, f in enumerate(doc.get("gemm_fractions") or []):
        where = ("gemm_fractions", i)
        keys = ("arch", "board", "precision", "value", "source")
        if not isinstance(f, dict) or set(f) != set(keys) or not all(_text(f[k]) for k in keys[:3] + ("source",)) \
                or not (_number(f["value"]) and f["value"] < 1) or f["precision"] not in PRECISIONS:
            raise lines.fail(where, f"is {{{', '.join(keys)}}}: a fraction in (0, 1) of a precision's dense peak")
        key = (f["arch"], f["board"], f["precision"])
        if key in out:
            raise lines.fail(where, f"{' '.join(key)} is given twice")
        out[key] = Sourced(float(f["value"]), " ".join(f["source"].split()))
    return out


def _no_gemm_fraction(doc: dict[str, Any], lines: Any) -> dict[str, str]:
    out = {}
    for i, f in enumerate(doc.get("no_gemm_fraction") or []):
        if not isinstance(f, dict) or set(f) != {"arch", "why"} or not _text(f["arch"]) or not _text(f["why"]):
            raise lines.fail(("no_gemm_fraction", i), "is {arch, why}")
        out[f["arch"]] = " ".join(f["why"].split())
    return out


def _index(gpus: tuple[Gpu, ...], nvlink: dict[int, Sourced], lines: Any) -> tuple[dict[str, Gpu], dict[int, Gpu]]:
    """The rows by normalised name and by PCI id: a label, a name or a PCI id given twice is refused, and so is
    an NVLink count that does not give the datasheet's rate at its generation's per-link rate."""
    by_name: dict[str, Gpu] = {}
    by_pci: dict[int, Gpu] = {}
    labels: set[str] = set()
    for i, g in enumerate(gpus):
        where = ("gpus", i)
        if g.label in labels:
            raise lines.fail(where + ("label",), f"{g.label}: the label is given twice")
        labels.add(g.label)
        for n in g.names:
            if normalize_name(n) in by_name:
                raise lines.fail(where + ("names",), f"{g.label}: {n!r} is also {by_name[normalize_name(n)].label}'s")
            by_name[normalize_name(n)] = g
        for p in g.pci_ids:
            if p in by_pci:
                raise lines.fail(where + ("pci_ids",), f"{g.label}: PCI id 0x{p:04x} is also {by_pci[p].label}'s")
            by_pci[p] = g
        if g.nvlink is not None:
            gen, links = g.nvlink
            rate = nvlink.get(gen)
            if rate is None or abs(2 * links * rate.value - (g.nvlink_gbps or 0)) > 1e-9:
                per = f"{rate.value:g} GB/s" if rate else "no rate in nvlink_generations"
                raise lines.fail(where + ("nvlink",), f"{g.label}: {links} links x 2 directions x NVLink {gen}'s "
                                                      f"{per} is not the datasheet's {g.nvlink_gbps:g} GB/s")
    return by_name, by_pci
