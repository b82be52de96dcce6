"""Shape sets as data: DeepBench's training shapes shipped with dlscale, or the user's own file.

A shape file is CSV: ``#`` lines are comments (the source), the first other line names the
columns, every following line is one shape. Integer columns are parsed as integers.
"""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError

BUILTIN = {"gemm": "gemm_train.csv", "conv": "conv_train.csv", "rnn": "rnn_train.csv"}


def load(kind: str, columns: tuple[str, ...], path: str | None = None) -> list[dict[str, Any]]:
    """The shapes of ``kind`` from ``path`` (the user's) or the built-in DeepBench subset."""
    if path is None:
        text = resources.files("dlscale.facts").joinpath("deepbench", BUILTIN[kind]).read_text()
        where = f"built-in {BUILTIN[kind]}"
    else:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise UsageError(f"--shapes {path}: cannot read it ({e.strerror})") from None
        where = path
    return parse(text, columns, where)


def parse(text: str, columns: tuple[str, ...], where: str = "shapes") -> list[dict[str, Any]]:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise UsageError(f"{where}: no shapes (expected a header line {','.join(columns)} and rows)")
    reader = csv.DictReader(lines)
    header = tuple(h.strip() for h in reader.fieldnames or ())
    missing = [c for c in columns if c not in header]
    if missing:
        raise UsageError(f"{where}: header must name the columns {','.join(columns)}; missing {','.join(missing)}")
    shapes = []
    for n, raw in enumerate(reader, start=2):
        row = {k.strip(): (v or "").strip() for k, v in raw.items() if k}
        shape: dict[str, Any] = {}
        for c in columns:
            v = row.get(c, "")
            if v.lstrip("-").isdigit():
                shape[c] = int(v)
            elif v:
                shape[c] = v
            else:
                raise UsageError(f"{where}: shape line {n} has no value for {c}")
        shapes.append(shape)
    return shapes
