"""Memory amounts as users write them: the one reader of every ``--max-memory``.

``dlscale infer --find-max-batch`` and ``dlscale tune`` take the same forms: bytes
(``8000000000``), binary multiples (``512K``, ``12000M``, ``16G``, ``1T``; ``16GB`` and ``16GiB``
read the same), or a share (``70%``) of a total the command names (the machine's memory, or a
GPU's). ``memory_spec`` checks a value where a config is built and keeps a share as its text,
since the total is known only once the device is; ``parse_memory`` turns either form into bytes.
"""

from __future__ import annotations

import math
import os
from typing import Any

from dlscale.errors import UsageError

BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _read(value: Any, option: str) -> tuple[float, bool]:
    """(bytes, or percent when the second item is True); any other form is a one-line UsageError."""
    bad = UsageError(f"{option} {value!r}: give bytes like 16G or 12000M, or a share of memory like 80%")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, (int, float)):
        number, share = float(value), False
    else:
        t = str(value).strip().upper().removesuffix("B").removesuffix("I")
        share = t.endswith("%")
        mult = 1 if share else BINARY.get(t[-1:], 1)
        digits = t[:-1] if share or mult > 1 else t
        try:
            number = float(digits) * mult
        except ValueError:
            raise bad from None
    if not math.isfinite(number):
        raise bad
    if number <= 0 or (share and number > 100) or (not share and number < 1):
        raise UsageError(f"{option} {value!r} is out of range: give at least 1 byte, or a share from 0% to 100%")
    return number, share


def memory_spec(value: Any, option: str = "--max-memory") -> int | str | None:
    """``value`` checked: an amount as whole bytes, a share as its text ('70%'); None stays None."""
    if value is None:
        return None
    number, share = _read(value, option)
    return f"{number:g}%" if share else int(number)


def parse_memory(value: Any, total: int | None, option: str = "--max-memory") -> int | None:
    """Bytes of ``value``: an amount as written, a share of ``total`` bytes; None stays None."""
    if value is None:
        return None
    number, share = _read(value, option)
    if not share:
        return int(number)
    if not total:
        raise UsageError(f"{option} {value!r}: this device's memory size is unknown, so give bytes like 16G")
    return max(1, int(number / 100 * total))


def total_memory() -> int | None:
    """The machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def available_memory() -> int | None:
    """Bytes the host can give a new allocation without swapping (Linux: /proc/meminfo's MemAvailable),
    else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
