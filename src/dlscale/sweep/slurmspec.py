"""The ``slurm:`` block of a sweep file (``sweep.spec``'s doc shows it): what each point's job asks
Slurm for (``SlurmOptions``), each value checked where the file gives it, the error naming the
field and its line (``check_slurm``); and a Slurm time limit, minutes or ``[D-]H:MM[:SS]``, in whole
minutes (``minutes``). Whether ``nodes`` agrees with each point's ``nnodes`` is checked with the
points (``spec.check``). ``dlscale accept --executor slurm`` (``accept.slurm``) builds its
``SlurmOptions`` from its command line with ``minutes``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from dlscale.yamlfile import Lines

SLURM_TEXT = ("partition", "account", "constraint", "qos", "mem")  # slurm: fields given as text


@dataclass(frozen=True)
class SlurmOptions:
    """The ``slurm:`` block: what each point's job asks Slurm for (None: the cluster's default)."""

    partition: str | None = None
    nodes: int | None = None
    gpus_per_node: int | str | None = None  # a count, or "auto": one per rank
    cpus_per_task: int | None = None
    time_min: int | None = None
    account: str | None = None
    constraint: str | None = None
    qos: str | None = None
    mem: str | None = None
    setup: tuple[str, ...] = ()


def check_slurm(block: Any, lines: Lines) -> SlurmOptions | None:
    """The ``slurm:`` block, each value checked where the file gives it."""
    if block is None:
        return None
    if not isinstance(block, dict):
        raise lines.fail(("slurm",), "must be a mapping (partition:, nodes:, gpus_per_node:, time:, ...)")
    known = (*SLURM_TEXT, "nodes", "gpus_per_node", "cpus_per_task", "time", "setup")
    out: dict[str, Any] = {}
    for key, value in block.items():
        path = ("slurm", key)
        if key not in known:
            raise lines.fail(path, f"unknown field {key!r}; known: {', '.join(known)}")
        if key in SLURM_TEXT:
            if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
                raise lines.fail(path, f"must be a name, got {value!r}")
            out[key] = str(value)
        elif key == "time":
            out["time_min"] = _minutes(value, lines, path)
        elif key == "setup":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise lines.fail(path, "must be a list of shell lines (run in the job before the point)")
            out[key] = tuple(value)
        elif key == "gpus_per_node" and value == "auto":
            out[key] = value
        elif isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "gpus_per_node" else 1):
            least = "0 or auto" if key == "gpus_per_node" else "1"
            raise lines.fail(path, f"must be an integer >= {least}, got {value!r}")
        else:
            out[key] = value
    return SlurmOptions(**out)


def _minutes(value: Any, lines: Lines, path: tuple) -> int:
    try:
        return minutes(value)
    except ValueError as e:
        raise lines.fail(path, str(e)) from None


def minutes(value: Any) -> int:
    """A Slurm time limit in whole minutes: a number of minutes, or ``[D-]H:MM[:SS]`` (seconds round
    up); anything else is a ValueError saying so."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?", str(value).strip()) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"must be minutes (an integer >= 1) or [D-]H:MM[:SS], got {value!r}")
    days, hours, mins, secs = (int(g or 0) for g in m.groups())
    total = days * 1440 + hours * 60 + mins + math.ceil(secs / 60)
    if total < 1:
        raise ValueError(f"must be at least one minute, got {value!r}")
    return total
