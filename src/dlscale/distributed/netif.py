"""Which network interface a rank's collectives use, and the address it advertises to the other ranks.

gloo binds each rank to the interface ``GLOO_SOCKET_IFNAME`` names, else to the address its host
name resolves to, and NCCL's sockets to ``NCCL_SOCKET_IFNAME``, else to an interface of its own
choosing. A host name that resolves to loopback (Debian's /etc/hosts puts the machine's own name on
127.0.1.1) then makes a rank advertise an address no other node can reach. Where the user set
neither, dlscale takes the interface from the route to the rendezvous address (``MASTER_ADDR``): the
local address a connected UDP socket gets towards it (no packet is sent), and the interface that
owns that address. On the master's own node that route is loopback when its name resolves there to
127.0.1.1; ``peers`` then takes the route to a rank of another node instead. The user's own setting
always wins. The address recorded is the interface's first IPv4 address, else its first IPv6 one:
the one gloo advertises for an interface. No torch here.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

from dlscale.errors import UsageError

VARIABLES = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


@dataclass(frozen=True)
class Choice:
    """A rank's interface and advertised address, who chose them and how."""

    interface: str | None
    address: str | None
    set_by: str  # "user" (the backend's variable was set) or "dlscale" (from a route)
    how: str  # "GLOO_SOCKET_IFNAME=eth1", "route to MASTER_ADDR n0 (10.0.0.1)", ...

    @property
    def loopback(self) -> bool:
        return self.address is not None and ipaddress.ip_address(self.address).is_loopback

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def interfaces() -> dict[str, list[tuple[str, str | None]]]:
    """The interfaces that are up, each with its (address, netmask) pairs: IPv4 first, then IPv6,
    in the order the kernel lists them (getifaddrs, as gloo and NCCL read them)."""
    import psutil

    up = {name for name, st in psutil.net_if_stats().items() if st.isup}
    out: dict[str, list[tuple[str, str | None]]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        if name not in up:
            continue
        v4 = [(a.address, a.netmask) for a in addrs if a.family == socket.AF_INET]
        v6 = [(a.address.split("%")[0], a.netmask) for a in addrs if a.family == socket.AF_INET6]
        if v4 or v6:
            out[name] = v4 + v6
    return out


def address_of(name: str, ifs: Mapping[str, list[tuple[str, str | None]]]) -> str | None:
    """The address a rank bound to interface ``name`` advertises: its first address (IPv4 first)."""
    addrs = ifs.get(name) or []
    return addrs[0][0] if addrs else None


def owner(address: str, ifs: Mapping[str, list[tuple[str, str | None]]]) -> str | None:
    """The interface that holds ``address`` (a loopback address: the loopback interface whose network
    holds it, e.g. 127.0.1.1 in lo's 127.0.0.0/8)."""
    ip = ipaddress.ip_address(address)
    for name, addrs in ifs.items():
        if any(ipaddress.ip_address(a) == ip for a, _ in addrs):
            return name
    for name, addrs in ifs.items():
        for a, mask in addrs:
            if ip.is_loopback and mask and ipaddress.ip_address(a).is_loopback:
                if ip in ipaddress.ip_network(f"{a}/{mask}", strict=False):
                    return name
    return None


def resolve(host: str) -> str:
    """``host``'s address as this node resolves it (IPv4 first, as torch's store connects)."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return str(infos[0][4][0])


def route_source(address: str) -> str:
    """The local address the kernel's routing picks towards ``address`` (a connected UDP socket's own
    address; connecting a UDP socket sends nothing). OSError where there is no route."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))
        return str(s.getsockname()[0])


def towards(address: str, how: str, ifs: Mapping[str, list[tuple[str, str | None]]] | None = None) -> Choice:
    """The interface of the route to ``address`` and the address that interface advertises."""
    ifs = interfaces() if ifs is None else ifs
    try:
        name = owner(route_source(address), ifs)
    except OSError as e:
        return Choice(None, None, "dlscale", f"no route to {address} ({e.strerror or e}): the backend's own default")
    if name is None:
        return Choice(None, None, "dlscale", f"{how}: no interface holds its local address; the backend's own default")
    return Choice(name, address_of(name, ifs), "dlscale", how)


def derive(master_addr: str, ifs: Mapping[str, list[tuple[str, str | None]]] | None = None) -> Choice:
    """The interface of the route to the rendezvous address ``master_addr``."""
    try:
        ip = resolve(master_addr)
    except OSError as e:
        return Choice(None, None, "dlscale", f"MASTER_ADDR {master_addr} does not resolve here ({e}): the backend's "
                                             "own default")
    shown = master_addr if master_addr == ip else f"{master_addr} ({ip})"
    return towards(ip, f"route to MASTER_ADDR {shown}", ifs)


def user_interface(variable: str, value: str, ifs: Mapping[str, list[tuple[str, str | None]]]) -> str:
    """The interface the user's ``variable`` names here: for gloo the first of a comma list (gloo uses
    every one, in turn; the first is the one tried and recorded); NCCL reads prefixes, ``=name`` for an
    exact name and ``^`` to exclude, and takes the first match. A value that names no interface with an
    address here is a UsageError."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if variable == VARIABLES["gloo"]:
        found = names[0] if names and names[0] in ifs else None
    else:
        exclude = value.startswith("^")
        specs = [n.lstrip("^") for n in names]

        def matches(name: str) -> bool:
            hit = any(name == s[1:] if s.startswith("=") else name.startswith(s) for s in specs)
            return hit != exclude

        found = next((name for name in ifs if matches(name)), None)
    if found is None:
        raise UsageError(f"{variable}={value} names no interface with an address on {socket.gethostname()} "
                         f"(here: {', '.join(ifs) or 'none'}); set it to this node's interface towards the "
                         "other nodes, or unset it for dlscale to take the route to MASTER_ADDR")
    return found


def choose(backend: str, master_addr: str, environ: Mapping[str, str] | None = None,
           ifs: Mapping[str, list[tuple[str, str | None]]] | None = None) -> Choice:
    """This rank's interface for ``backend``: the user's variable where set, else the route to the
    rendezvous address."""
    e = os.environ if environ is None else environ
    ifs = interfaces() if ifs is None else ifs
    variable = VARIABLES.get(backend, VARIABLES["gloo"])
    value = e.get(variable)
    if value:
        name = user_interface(variable, value, ifs)
        return Choice(name, address_of(name, ifs), "user", f"{variable}={value}")
    return derive(master_addr, ifs)


def apply(choice: Choice, environ: MutableMapping[str, str] | None = None) -> None:
    """Set gloo's and NCCL's interface variables to the derived interface where the user set none
    (before the process group is made: gloo reads its variable then, NCCL at its first communicator).
    NCCL's gets ``=name``, NCCL's exact match (a bare name is a prefix there: eth1 would take eth10 too)."""
    e = os.environ if environ is None else environ
    if choice.set_by != "dlscale" or choice.interface is None:
        return
    for backend, variable in VARIABLES.items():
        if not e.get(variable):
            e[variable] = f"={choice.interface}" if backend == "nccl" else choice.interface
