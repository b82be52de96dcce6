"""Who a figure is about across acceptances: a GPU by its NVML UUID and serial, a machine by its id.

A GPU's NVML UUID (and board serial) follow it from server to server; a CPU machine has neither,
so its figures (and every figure of the system as a whole: the collectives in a node, training on
all devices, host STREAM) are keyed by the machine's ``/etc/machine-id`` (``system.machine_id``),
else its host name. ``identities`` maps the device keys an acceptance's verdicts name (``cuda:3``;
``gpu07 cuda:3`` on several hosts; ``""`` and ``cpu``: the machine) to those identities; the
acceptance record keeps the map as ``raw.devices``. ``class_of`` names the part a figure speaks
for: GPU, HBM, host or network. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.record import RunRecord


def class_of(check: str, figure: str, on_gpu: bool) -> str:
    """GPU, HBM, network or host: the part a figure's movement points at."""
    if check in ("p2p", "collectives", "collectives_nodes", "links"):
        return "network"
    if check == "memory":
        return "HBM" if figure == "d2d" and on_gpu else "host"
    return "GPU" if on_gpu else "host"


CLASSES = ("GPU", "HBM", "host", "network")


def identities(records: Sequence[RunRecord]) -> dict[str, dict[str, Any]]:
    """Device key -> identity ({uuid, serial, name, host} of a GPU; {machine_id, host, name} of the machine)."""
    from dlscale.accept.figures.collect import node_hosts

    several = bool(node_hosts(records))
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        sys_ = r.system or {}
        host = str(sys_.get("hostname") or "?")
        machine = {"machine_id": sys_.get("machine_id"), "host": host, "name": (sys_.get("cpu") or {}).get("model")}
        for key in ((host, f"{host} cpu") if several else ("", "cpu")):
            out.setdefault(key, machine)
        topo = ((sys_.get("accelerators") or {}).get("topology") or {})
        for g in topo.get("gpus") or []:
            if g.get("index") is None or not (g.get("uuid") or g.get("serial")):
                continue
            key = f"{host} cuda:{g['index']}" if several else f"cuda:{g['index']}"
            out.setdefault(key, {"uuid": g.get("uuid"), "serial": g.get("serial"), "name": g.get("name"), "host": host})
    return out


def ident_id(ident: dict[str, Any]) -> str:
    """The id a device is known by: its UUID, else its serial, else machine-ID, else host-NAME."""
    if ident.get("uuid") or ident.get("serial"):
        return str(ident.get("uuid") or ident.get("serial"))
    return f"machine-{ident['machine_id']}" if ident.get("machine_id") else f"host-{ident.get('host')}"


def ident_matches(ident: dict[str, Any], want: str) -> bool:
    """Does ``want`` name this device: its UUID, serial, machine id or id, or a prefix of one (4+ characters)?"""
    w = want.strip().casefold()
    names = [str(ident.get(k) or "").casefold() for k in ("uuid", "serial", "machine_id")] + [ident_id(ident).casefold()]
    return any(n and (n == w or (len(w) >= 4 and n.startswith(w))) for n in names)


def row_device(row: dict[str, Any]) -> str | None:
    """The device key a verdict row is about: its one device, "" for the system; None for a pair or a link."""
    devs = row.get("devices") or []
    if len(devs) == 1:
        return str(devs[0])
    return "" if row.get("subject_key") is None else None
