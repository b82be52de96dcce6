"""Every NVML name dlscale uses exists in the installed ``pynvml`` (nvidia-ml-py).

The names are found in the source, not listed by hand: every attribute access named ``nvml*`` or
``NVML_*`` on any object, and every string constant passed as the name to ``getattr``/``hasattr``
that starts that way. A call to a function the bindings lack (``..._v2`` suffixes come and go)
is an AttributeError at run time, on exactly the servers that have the feature.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "dlscale"


def _is_nvml(name: str) -> bool:
    return name.startswith("nvml") or name.startswith("NVML_")


def nvml_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_nvml(node.attr):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _is_nvml(node.args[1].value):
            names.add(node.args[1].value)
    return names


def used_names() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for name in nvml_names(ast.parse(path.read_text(), filename=str(path))):
            where.setdefault(name, []).append(str(path.relative_to(SRC)))
    return where


def test_the_scan_finds_attribute_and_getattr_names():
    tree = ast.parse("nv.nvmlInit()\nx = h.nv.NVML_CLOCK_SM\ngetattr(m, 'nvmlFoo_v2', None)\nnvml.probe()\n")
    assert nvml_names(tree) == {"nvmlInit", "NVML_CLOCK_SM", "nvmlFoo_v2"}


def test_every_nvml_name_in_the_source_exists_in_pynvml():
    pynvml = pytest.importorskip("pynvml")
    where = used_names()
    assert {"nvmlInit", "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetTotalEccErrors"} <= set(where)
    missing = {n: w for n, w in where.items() if not hasattr(pynvml, n)}
    assert not missing, f"not in the installed pynvml: {missing}"
