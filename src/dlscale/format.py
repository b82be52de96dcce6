"""Numbers as people read them: the one set of formatters every layer uses.

Plain strings only (no Rich markup, no torch), so the CLI, the report and the microbenchmark
tables can all share them. A missing value (``None``) is always ``"-"``.

- ``fmt_num``: a figure whose size is not known in advance (3 significant digits when small or
  huge, thousands separators in between); ints keep every digit.
- ``fmt_fixed``: a column of comparable figures with a fixed number of decimals (report tables).
- ``fmt_pct``: a fraction as a percentage (0.125 -> "12.50%"); ``signed`` for differences.
- ``fmt_si``: decimal SI prefixes for rates and counts (FLOP, FLOP/s, B/s, bit/s).
- ``fmt_bytes``: binary prefixes for memory (KiB, MiB, GiB, TiB).
- ``fmt_seconds``: seconds, milliseconds or microseconds.
- ``fmt_ci``: a confidence interval, one bound of which may be unbounded.
- ``fmt_gain``: a measured ratio with its 95% CI ("3.31x (95% CI 2.90x - 3.78x)").
- ``fmt_count``: a count and its noun, singular for one ("1 point", "2 points").
- ``format_metric``: one recorded metric by its unit (docs/METRICS.md), choosing among the above.
"""

from __future__ import annotations

from typing import Any

MISSING = "-"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def fmt_num(x: Any, digits: int = 3) -> str:
    """A figure of unknown size: ints in full ("1,234,567"); floats to ``digits`` significant digits
    below 1e-3, below 1 and from 1e7 up ("0.123", "1.23e+07"), 2 decimals from 1 ("12.35") and
    1 decimal with separators from 100 ("1,234.5"); booleans as yes/no."""
    if x is None:
        return MISSING
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x == 0:
            return "0"
        if abs(x) >= 1e7 or abs(x) < 1e-3:
            return f"{x:.{digits}g}"
        if abs(x) >= 100:
            return f"{x:,.1f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        return f"{x:.{digits}g}"
    return str(x)


def fmt_fixed(x: Any, digits: int = 1, missing: str = MISSING) -> str:
    """A number with ``digits`` decimals and thousands separators (1234.56 -> "1,234.6").

    ``missing`` replaces ``"-"`` for None where a table's convention differs (nccl-tests: "N/A").
    """
    if x is None:
        return missing
    if _is_number(x):
        return f"{x:,.{digits}f}"
    return str(x)


def fmt_pct(x: float | None, digits: int = 2, signed: bool = False) -> str:
    """A fraction as a percentage: 0.125 -> "12.50%"; ``signed`` gives "+12.50%" / "-3.00%"."""
    if x is None:
        return MISSING
    sign = "+" if signed else ""
    return f"{x * 100:{sign}.{digits}f}%"


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def fmt_si(x: float | None, unit: str) -> str:
    """Decimal prefix, 3 significant digits: 1.23e12 FLOP/s -> "1.23 TFLOP/s"."""
    if x is None:
        return MISSING
    for factor, prefix in _SI:
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def fmt_bytes(n: float | None) -> str:
    """Binary prefix, 2 decimals: 1536 -> "1.50 KiB"; below 1 KiB whole bytes."""
    if n is None:
        return MISSING
    for factor, name in _BINARY:
        if n >= factor:
            return f"{n / factor:.2f} {name}"
    return f"{int(n)} B"


def fmt_size(n: int) -> str:
    """A message size as nccl-tests and ``--sizes`` write it, in the largest binary unit it is a whole
    number of: 2**30 -> "1G", 3 * 2**20 -> "3M", 100 -> "100"."""
    for unit, k in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def fmt_seconds(s: float | None) -> str:
    """1.5 -> "1.500 s", 0.0123 -> "12.30 ms", 4.5e-5 -> "45.0 us"."""
    if s is None:
        return MISSING
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_ci(lo: Any, hi: Any, fmt: Any = fmt_num) -> str:
    """An interval "229.5 - 240.1", each bound by ``fmt``; an upper bound that is missing, infinite or NaN
    (a throughput interval mapped from a step-time interval that reaches 0 s) reads ">= 229.5 (no upper
    bound)"; no lower bound: "-"."""
    if not _is_number(lo) or lo != lo:
        return MISSING
    if not _is_number(hi) or hi != hi or hi == float("inf"):
        return f">= {fmt(lo)} (no upper bound)"
    return f"{fmt(lo)} - {fmt(hi)}"


def fmt_gain(gain: Any, ci: Any = None) -> str:
    """A measured ratio and its 95% CI: "3.31x (95% CI 2.90x - 3.78x)"; "no gain measured" for None."""
    if not _is_number(gain):
        return "no gain measured"
    return f"{gain:.2f}x" + (f" (95% CI {fmt_ci(ci[0], ci[1], lambda v: f'{v:.2f}x')})" if ci else "")


def fmt_cpus(cpus: Any) -> str:
    """CPU numbers as ranges, the way taskset and numactl write them: [0, 1, 2, 3, 8] -> '0-3,8'."""
    xs = sorted(set(int(c) for c in cpus or ()))
    if not xs:
        return "-"
    parts, start, prev = [], xs[0], xs[0]
    for c in xs[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if start != prev else str(start))
        if c is not None:
            start = prev = c
    return ",".join(parts)


def fmt_count(n: Any, noun: str, plural: str | None = None) -> str:
    """A count and its noun, singular for exactly one: "1 point", "3 points", "2 classes" (``plural``
    where +s is wrong), "1,200 runs"; the number as ``fmt_num`` writes it ("-" when missing)."""
    return f"{fmt_num(n)} {noun if n == 1 else plural or noun + 's'}"


def format_metric(name: str, value: Any, unit: str | None) -> str:
    """One metric value with its unit, formatted for a person."""
    if value is None:
        return MISSING
    if isinstance(value, list) and len(value) == 2 and name.endswith("ci95"):
        return fmt_ci(value[0], value[1]) + (f" {unit}" if unit else "")
    if isinstance(value, list):
        return ", ".join(fmt_num(v) for v in value[:8]) + (" ..." if len(value) > 8 else "")
    if unit == "s":
        return fmt_seconds(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "fraction":
        return fmt_pct(value)
    if unit in ("FLOP", "FLOP/s", "B/s", "bit/s"):
        return fmt_si(value, unit)
    if unit:
        return f"{fmt_num(value)} {unit}"
    return fmt_num(value)
