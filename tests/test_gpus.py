"""The one table of GPU facts (dlscale/facts/gpus.yaml, read by dlscale/gpus.py): every row sourced, every
name and PCI id once, every healthy model's GPU in it, every datasheet figure dlscale uses read from it, and
no second table of the same facts anywhere else."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from dlscale import gpus, peaks
from dlscale.accept.sources import datasheet
from dlscale.accept.sources import healthy as refs
from dlscale.errors import UsageError

SRC = Path(__file__).resolve().parents[1] / "src" / "dlscale"
FACTS = gpus.built_in_path()


def test_every_row_gives_each_fact_with_its_source_and_nothing_else():
    table = gpus.table()
    assert len(table.gpus) >= 20
    for g in table.gpus:
        given = {"tflops": bool(g.tflops), "memory": bool(g.memory_gbps or g.memory_gb), "nvlink": bool(g.nvlink),
                 "pcie": bool(g.pcie), "pci_ids": bool(g.pci_ids)}
        assert set(g.sources) == {k for k, v in given.items() if v} and g.sources, g.label
        assert all(s.strip() for s in g.sources.values()), g.label
        assert all(re.search(r"\((?:19|20)\d\d\b|pci\.ids", s) for s in g.sources.values()), g.label  # its year
        if g.tflops:
            assert g.arch and g.board, g.label
    for rate in [*table.nvlink.values(), *table.pcie.values(), *table.infiniband.values(), *table.ethernet.values(),
                 *table.gemm_fractions.values()]:
        assert rate.source.strip()


def test_names_pci_ids_and_labels_are_each_given_once():
    table = gpus.table()
    names = [gpus.normalize_name(n) for g in table.gpus for n in g.names]
    pcis = [p for g in table.gpus for p in g.pci_ids]
    labels = [g.label for g in table.gpus]
    assert len(names) == len(set(names)) and len(pcis) == len(set(pcis)) and len(labels) == len(set(labels))
    assert set(table.by_pci) == set(pcis) and {table.by_pci[0x2330].label, table.by_pci[0x2335].label} == {
        "NVIDIA H100 SXM5", "NVIDIA H200 SXM"}


def test_the_pci_ids_healthy_yaml_had_are_the_tables():
    """Before the one table, healthy.yaml listed 0x2901 (B200) and 0x26B9 (L40S), which the peak table lacked."""
    assert gpus.find("renamed", 0x2901).label == "NVIDIA B200" and gpus.find("renamed", 0x26B9).label == "NVIDIA L40S"
    assert peaks.gpu_peak("renamed", "bf16", 0x2901).flops == pytest.approx(2250e12)


def test_every_healthy_model_names_its_row_of_the_gpu_facts():
    import yaml

    doc = yaml.safe_load(refs.built_in_path().read_text())
    labels = {g.label for g in gpus.table().gpus}
    for m in doc["models"]:
        assert m["gpu"] in labels and "names" not in m and "pci_ids" not in m, m["model"]
    for r in refs.load():
        row = gpus.find(r.names[0])
        assert row is not None and r.names == row.names and r.pci_ids == row.pci_ids, r.model


def test_a_healthy_rows_pcie_link_is_its_gpus_own():
    """A pinned-copy row measured on a PCIe link: the GPU's datasheet link is that one."""
    held = 0
    for r in refs.load():
        if "pcie" in r.when:
            gen, width = gpus.find(r.names[0]).pcie
            assert r.when["pcie"] == f"Gen{gen} x{width}", (r.model, r.when)
            held += 1
    assert held >= 20


def test_a_memory_size_in_the_drivers_name_is_the_rows():
    seen = 0
    for g in gpus.table().gpus:
        for n in g.names:
            m = re.search(r"(\d+)GB\b", n)
            if m and g.memory_gb:
                assert g.memory_gb == int(m.group(1)), (g.label, n)
                seen += 1
    assert seen >= 8


def test_a_bad_file_is_one_line_naming_its_line_and_row(tmp_path):
    text = FACTS.read_text()
    cases = [
        (text.replace("    memory_gbps: 3350\n", "    memory_gbps: -3350\n"), "gpus.0.memory_gbps",
         "NVIDIA H100 SXM5: must be a positive number"),
        (text.replace("    pci_ids: [0x2331]\n", "    pci_ids: [0x2330]\n"), "gpus.1.pci_ids",
         "PCI id 0x2330 is also NVIDIA H100 SXM5's"),
        (text.replace('      memory: "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM: 80GB, 3.35 TB/s"\n', ""),
         "gpus.0.sources", "NVIDIA H100 SXM5: its memory has no source"),
        (text.replace("nvlink: {generation: 4, links: 18, gbps: 900}", "nvlink: {generation: 4, links: 16, gbps: 900}",
                      1),
         "gpus.0.nvlink", "16 links x 2 directions x NVLink 4's 25 GB/s is not the datasheet's 900 GB/s"),
        (text.replace("    names: [NVIDIA H100 PCIe]\n", "    names: [NVIDIA  h100 80GB HBM3]\n"), "gpus.1.names",
         "is also NVIDIA H100 SXM5's"),
        (text.replace("tflops: {fp32: 51}", "tflops: {fp32: 51, fp4: 3}"), "gpus.1.tflops.fp4", "a precision of"),
    ]
    for bad, where, what in cases:
        assert bad != text, where
        f = tmp_path / "gpus.yaml"
        f.write_text(bad)
        with pytest.raises(UsageError) as e:
            gpus.load(f)
        msg = str(e.value)
        assert "\n" not in msg and re.match(rf"{re.escape(str(f))}:\d+: {re.escape(where)}: ", msg), msg
        assert what in msg, msg


# -- every datasheet figure dlscale uses comes from the table ---------------------------------------------------
def _scaled(k: float) -> gpus.Facts:
    """The shipped table with every rate (FLOP/s, memory, NVLink, PCIe, InfiniBand, Ethernet) times k."""
    t = gpus.table()
    rows = tuple(dataclasses.replace(g, tflops={p: v * k for p, v in g.tflops.items()},
                                     memory_gbps=g.memory_gbps and g.memory_gbps * k,
                                     nvlink_gbps=g.nvlink_gbps and g.nvlink_gbps * k) for g in t.gpus)
    by_label = {g.label: g for g in rows}
    times = {key: gpus.Sourced(v.value * k, v.source) for key, v in t.nvlink.items()}
    return dataclasses.replace(
        t, gpus=rows, nvlink=times,
        pcie={key: dataclasses.replace(v, gts=v.gts * k) for key, v in t.pcie.items()},
        infiniband={key: gpus.Sourced(v.value * k, v.source) for key, v in t.infiniband.items()},
        ethernet={key: gpus.Sourced(v.value * k, v.source) for key, v in t.ethernet.items()},
        by_name={n: by_label[g.label] for n, g in t.by_name.items()},
        by_pci={p: by_label[g.label] for p, g in t.by_pci.items()})


def test_every_datasheet_figure_moves_with_the_table(monkeypatch):
    """Double every rate in the table: every rated figure the acceptance holds a healthy row to, every GPU
    peak, every memory rate decode is held to and every datasheet link of the predictor doubles with it."""
    from dlscale.harness import device as dev
    from dlscale.infer import limit
    from dlscale.predict import links

    rows = refs.load()
    before = [datasheet.row_figure(r) for r in rows]
    names = [n for g in gpus.table().gpus for n in g.names]
    peaks_before = [peaks.gpu_peak(n, p) for n in names for p in gpus.PRECISIONS]
    links_before = links.datasheet_links()
    monkeypatch.setattr(dev, "device_name", lambda d: "NVIDIA H200")
    decode_before = limit.datasheet_bandwidth(type("Cuda", (), {"type": "cuda"})())[0]

    doubled = _scaled(2.0)
    monkeypatch.setattr(gpus, "table", lambda: doubled)
    held = 0
    for r, was in zip(rows, before):
        now = datasheet.row_figure(r)
        assert (now is None) == (was is None), r
        if was is not None:
            assert now[0] == pytest.approx(2 * was[0]), (r.model, r.figure)
            held += 1
    assert held >= 45
    for was, now in zip(peaks_before, (peaks.gpu_peak(n, p) for n in names for p in gpus.PRECISIONS)):
        assert (was is None and now is None) or now.flops == pytest.approx(2 * was.flops)
    for name, lk in links.datasheet_links().items():  # PCIe, NVLink (the DGX-1's rings too), InfiniBand, Ethernet
        assert lk.bandwidth == pytest.approx(2 * links_before[name].bandwidth), name
        rings = (lk.ring_bandwidth or {}).items()
        assert all(v == pytest.approx(2 * links_before[name].ring_bandwidth[g]) for g, v in rings), name
    assert limit.datasheet_bandwidth(type("Cuda", (), {"type": "cuda"})())[0] == pytest.approx(2 * decode_before)


# -- no second table ----------------------------------------------------------------------------------------------
def _strings_and_numbers(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, float]]]:
    """A module's string and number literals, with their lines; docstrings left out."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings, numbers = [], []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and id(n) not in docs:
            if isinstance(n.value, str):
                strings.append((n.lineno, n.value))
            elif isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
                numbers.append((n.lineno, float(n.value)))
    return strings, numbers


def test_no_module_but_the_reader_holds_a_gpus_name_or_figure():
    """Outside dlscale/gpus.py no code names a GPU as its driver does (a row's label, the table's key, it may
    name), keys anything on an architecture (as the GEMM fractions are keyed) nor holds a datasheet figure of
    the table (its TFLOP/s, memory or NVLink rates)."""
    t = gpus.table()
    names = {n.casefold() for g in t.gpus for n in g.names}
    labels = {g.label for g in t.gpus}
    archs = {g.arch for g in t.gpus if g.arch} | {a for a, _, _ in t.gemm_fractions} | set(t.no_gemm_fraction)
    figures = {v for g in t.gpus for v in g.tflops.values()} | {g.memory_gbps for g in t.gpus if g.memory_gbps} \
        | {g.nvlink_gbps for g in t.gpus if g.nvlink_gbps}
    figures |= {2 * v for g in t.gpus for v in g.tflops.values() if "with-sparsity" in g.source("tflops")}
    # distinctive: 989.5, 362.05, 3350, 1555 (a figure such as 80, 120 or 1000 counts too many other things)
    figures = {f for f in figures if (f >= 10 and f % 1) or (f >= 500 and f % 100)}
    offenders = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "gpus.py":
            continue
        strings, numbers = _strings_and_numbers(path)
        where = path.relative_to(SRC.parent)
        offenders += [f"{where}:{ln}: {s!r}" for ln, s in strings if s in archs or (s not in labels
                      and any(n in s.casefold() for n in names))]
        offenders += [f"{where}:{ln}: {v:g}" for ln, v in numbers if v in figures]
    assert offenders == [], offenders


def test_the_check_sees_a_planted_table(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""NVIDIA H100 80GB HBM3 in a docstring is prose."""\n'
                       'PEAKS = {"NVIDIA H100 80GB HBM3": 989.5, "x": 3350}\n')
    strings, numbers = _strings_and_numbers(planted)
    assert [s for _, s in strings if "H100" in s] == ["NVIDIA H100 80GB HBM3"]
    assert (2, 3350.0) in numbers and (2, 989.5) in numbers


def test_the_old_tables_are_gone():
    from dlscale import nvlink
    from dlscale.predict import links

    for module, name in ((peaks, "GPU_PEAKS"), (peaks, "MEMORY"), (peaks, "memory_gbps"), (peaks, "find_row"),
                         (nvlink, "GENERATIONS"), (datasheet, "GEMM_FRACTIONS"), (datasheet, "NO_GEMM_FRACTION"),
                         (datasheet, "pcie_gbps"), (links, "_pcie_x16")):
        assert not hasattr(module, name), f"{module.__name__}.{name}"
