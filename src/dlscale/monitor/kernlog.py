"""The kernel's log since a mark: its NVIDIA Xid lines, from the first source readable here.

Sources, in order: ``$DLSCALE_KERNEL_LOG`` (a saved kernel log, for a machine whose own log this
process may not read), ``/dev/kmsg`` (each record "PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;TEXT",
readable by root, or by anyone where ``kernel.dmesg_restrict`` is 0), ``journalctl -k -b 0 -o json``
(the journal's copy of this boot's kernel log: the systemd-journal or adm group), ``dmesg`` ("[
SECONDS] TEXT"). Every source stamps a line with the time since boot, which a mark holds with the
boot's id (``/proc/sys/kernel/random/boot_id``): a read keeps the lines of this boot after the
mark's time, or every line of this boot where the mark is another boot's (a reboot starts a new
log) or there is none. Where no source can be read, ``read`` says why in ``unread``, never an
empty history.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

from dlscale.monitor import xid

KERNEL_LOG_ENV = "DLSCALE_KERNEL_LOG"
KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
TIMEOUT_S = 5.0  # per command: level 1's health check has 30 s in all
MAX_APPLICATION = 200  # application Xids kept in a record (a flood of another program's 13s); every other Xid is kept
KMSG_RECORD = re.compile(r"^\d+,(\d+),(\d+),[^;]*;(.*)$")
DMESG_LINE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def boot_id(path: str = BOOT_ID) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def parse_line(line: str) -> tuple[float, str] | None:
    """(seconds since boot, text) of one /dev/kmsg record or one dmesg line; None for anything else
    (a record's continuation lines, which begin with a space)."""
    m = KMSG_RECORD.match(line)
    if m:
        return int(m.group(2)) / 1e6, m.group(3)
    m = DMESG_LINE.match(line)
    return (float(m.group(1)), m.group(2)) if m else None


def _file(path: str) -> list[tuple[float, str]]:
    with open(path, errors="replace") as f:
        return [p for p in (parse_line(ln.rstrip("\n")) for ln in f) if p is not None]


def _kmsg(path: str = KMSG) -> list[tuple[float, str]]:
    """Every record the kernel's ring buffer still holds (a non-blocking read ends at EAGAIN; EPIPE says
    records were overwritten before they were read, and reading goes on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                chunk = os.read(fd, 16384)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
            if not chunk:
                break
            out.extend(p for p in map(parse_line, chunk.decode(errors="replace").split("\n")) if p is not None)
    finally:
        os.close(fd)
    return out


def _run(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, errors="replace")
    if res.returncode != 0:
        raise OSError((res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1])
    return res.stdout


def _journal() -> list[tuple[float, str]]:
    out = []
    for ln in _run(["journalctl", "-k", "-b", "0", "-o", "json", "--no-pager", "-q"]).splitlines():
        try:
            doc = json.loads(ln)
        except ValueError:
            continue
        msg = doc.get("MESSAGE")
        text = bytes(msg).decode(errors="replace") if isinstance(msg, list) else str(msg or "")
        usec = doc.get("_SOURCE_MONOTONIC_TIMESTAMP") or doc.get("__MONOTONIC_TIMESTAMP")
        if usec is not None:
            out.append((int(usec) / 1e6, text))
    if not out:  # a boot always logs: an empty answer is a journal this user may not read
        raise OSError("journalctl -k gave no line for this boot")
    return out


def _dmesg() -> list[tuple[float, str]]:
    return [p for p in (parse_line(ln) for ln in _run(["dmesg"]).splitlines()) if p is not None]


def sources() -> list[tuple[str, Any]]:
    """(name, reader) in the order they are tried."""
    saved = os.environ.get(KERNEL_LOG_ENV)
    if saved:
        return [(saved, lambda: _file(saved))]
    return [(KMSG, _kmsg), ("journalctl -k", _journal), ("dmesg", _dmesg)]


def read(since: dict[str, Any] | None = None) -> dict[str, Any]:
    """The kernel's Xid lines after ``since`` (a mark: ``{"boot_id", "t_s"}``, a previous read's
    ``until``; None: this whole boot): ``{"source", "since", "until", "window", "events", "unread"}``,
    each event with its time since boot and its line; ``until`` is the mark the next read starts from
    (the last line read)."""
    boot = boot_id()
    start = since.get("t_s") if since and since.get("boot_id") == boot and boot else None
    why = []
    for name, reader in sources():
        try:
            lines = reader()
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            why.append(f"{name}: {e.strerror if isinstance(e, OSError) and e.strerror else e}")
            continue
        last = max((t for t, _ in lines), default=start or 0.0)
        events = [{**ev, "t_s": round(t, 6), "line": text.strip()[:300]} for t, text in lines
                  if (start is None or t > start) and (ev := xid.parse(text)) is not None]
        apps = [id(e) for e in events if xid.classify(e["xid"]) == xid.APPLICATION]
        drop = set(apps[:-MAX_APPLICATION]) if len(apps) > MAX_APPLICATION else set()
        kept = [e for e in events if id(e) not in drop]  # the newest application Xids, and every other
        return {"source": name, "since": since, "until": {"boot_id": boot, "t_s": round(last, 6)},
                "window": window(since, boot, start), "events": kept, "dropped": len(events) - len(kept),
                "unread": None}
    return {"source": None, "since": since, "until": None, "window": window(since, boot, start), "events": [],
            "unread": "; ".join(why)}


def window(since: dict[str, Any] | None, boot: str | None, start: float | None) -> str:
    """The history's span in words."""
    if start is not None:
        where = f", {since['acceptance']}" if since and since.get("acceptance") else ""
        return f"in the kernel log since {start:.0f} s after boot (the last sound read{where})"
    if since:
        return "in the kernel log since this boot (the last sound read was another boot's)"
    return "in the kernel log since this boot"
