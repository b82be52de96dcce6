"""``dlscale results export --format parquet``: one row a run, every record kind (pyarrow).

Columns: the CSV export's (``RunRecord.flat()``: identity, ``config.*`` flattened, ``metrics.*``),
plus every part of the record as JSON text (``config_json``, ``metrics_json``, ``units_json``,
``raw_json``, ``system_json``, ``warnings_json``), so nothing a record holds is lost whatever its
kind. A column whose values mix types across kinds is stored as JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dlscale.errors import UsageError
from dlscale.record import RunRecord

JSON_PARTS = ("config", "metrics", "units", "raw", "system", "warnings")


def rows(recs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    out = []
    for r in recs:
        row: dict[str, Any] = r.flat()
        for part in JSON_PARTS:
            row[f"{part}_json"] = json.dumps(getattr(r, part), default=str)
        out.append(row)
    return out


def _column(values: list[Any]) -> list[Any]:
    """Keep one scalar type per column (ints widen to floats); anything else becomes JSON text."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {bool} or kinds <= {str}:
        return values
    if kinds <= {int, float} and bool not in kinds:
        return [None if v is None else float(v) if float in kinds else v for v in values]
    return [None if v is None else v if isinstance(v, str) else json.dumps(v, default=str) for v in values]


def write_parquet(recs: Sequence[RunRecord], path: str | None) -> None:
    if not path:
        raise UsageError("--format parquet writes a binary file: give --out FILE.parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = rows(recs)
    cols: list[str] = []
    for row in data:
        cols.extend(k for k in row if k not in cols)
    table = pa.table({c: _column([row.get(c) for row in data]) for c in cols}) if data else pa.table({"run_id": pa.array([], pa.string())})
    from dlscale.paths import atomic_target

    with atomic_target(path, "--out") as tmp:  # whole or not at all
        try:
            pq.write_table(table, str(tmp))
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e}") from None
