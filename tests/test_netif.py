"""A rank's interface and address: the user's variable, else the route to the rendezvous address."""

import socket

import pytest

from dlscale.distributed import netif
from dlscale.errors import UsageError

# What psutil reports on a node as Debian sets it up: loopback, the cluster network, a docker bridge.
IFS = {
    "lo": [("127.0.0.1", "255.0.0.0"), ("::1", None)],
    "eth0": [("10.0.0.7", "255.255.255.0"), ("10.0.0.70", "255.255.255.0"), ("fe80::1", None)],
    "ib0": [("192.168.10.7", "255.255.255.0")],
    "docker0": [("172.17.0.1", "255.255.0.0")],
}


def test_the_owner_of_an_address_and_of_a_loopback_alias():
    assert netif.owner("10.0.0.70", IFS) == "eth0"  # a second address of eth0
    assert netif.owner("127.0.1.1", IFS) == "lo"  # Debian's own-hostname line: inside lo's 127.0.0.0/8
    assert netif.owner("10.9.9.9", IFS) is None


def test_an_interface_advertises_its_first_ipv4_address():
    assert netif.address_of("eth0", IFS) == "10.0.0.7"  # as gloo picks it, not the second one or the IPv6
    assert netif.address_of("wlan0", IFS) is None


def test_gloo_takes_the_first_name_of_its_list():
    assert netif.user_interface("GLOO_SOCKET_IFNAME", "ib0,eth0", IFS) == "ib0"


@pytest.mark.parametrize("value, expected", [
    ("eth", "eth0"),  # a prefix
    ("=ib0", "ib0"),  # an exact name
    ("^lo,docker", "eth0"),  # everything but these prefixes: the first left
    ("ib,eth", "eth0"),  # the first interface (in the kernel's order) that any prefix matches
])
def test_nccl_reads_prefixes_exact_names_and_exclusions(value, expected):
    assert netif.user_interface("NCCL_SOCKET_IFNAME", value, IFS) == expected


def test_a_variable_naming_no_interface_here_is_one_line_naming_it():
    with pytest.raises(UsageError, match=r"GLOO_SOCKET_IFNAME=eth9 names no interface .*here: lo, eth0, ib0, docker0"):
        netif.user_interface("GLOO_SOCKET_IFNAME", "eth9", IFS)
    with pytest.raises(UsageError, match="NCCL_SOCKET_IFNAME==eth"):
        netif.user_interface("NCCL_SOCKET_IFNAME", "=eth", IFS)


def test_the_users_variable_wins_for_its_backend():
    c = netif.choose("gloo", "10.0.0.1", {"GLOO_SOCKET_IFNAME": "ib0"}, IFS)
    assert (c.interface, c.address, c.set_by, c.how) == ("ib0", "192.168.10.7", "user", "GLOO_SOCKET_IFNAME=ib0")
    c = netif.choose("nccl", "10.0.0.1", {"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "ib0"}, IFS)
    assert (c.interface, c.set_by) == ("eth0", "user")


def test_without_a_variable_the_route_to_the_master_decides(monkeypatch):
    monkeypatch.setattr(netif, "route_source", lambda addr: {"10.0.0.1": "10.0.0.7"}[addr])
    c = netif.choose("gloo", "10.0.0.1", {"NCCL_SOCKET_IFNAME": "ib0"}, IFS)  # NCCL's says nothing for gloo
    assert (c.interface, c.address, c.set_by) == ("eth0", "10.0.0.7", "dlscale")
    assert c.how == "route to MASTER_ADDR 10.0.0.1" and not c.loopback


def test_the_route_on_this_machine_to_loopback_is_lo():
    ifs = netif.interfaces()
    lo = netif.owner("127.0.0.1", ifs)
    assert lo is not None, ifs  # every Linux machine has its loopback interface up
    c = netif.derive("127.0.0.1")
    assert (c.interface, c.address, c.loopback) == (lo, "127.0.0.1", True)


def test_a_master_without_route_or_name_leaves_the_backend_its_default(monkeypatch):
    def unreachable(addr):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(netif, "route_source", unreachable)
    c = netif.derive("10.0.0.1", IFS)
    assert c.interface is None and "no route to 10.0.0.1 (Network is unreachable)" in c.how
    c = netif.derive("no-such-host.invalid", IFS)
    assert c.interface is None and "MASTER_ADDR no-such-host.invalid does not resolve" in c.how


def test_resolve_prefers_ipv4(monkeypatch):
    infos = [(socket.AF_INET6, 1, 6, "", ("::1", 0, 0, 0)), (socket.AF_INET, 1, 6, "", ("127.0.0.1", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: list(infos))
    assert netif.resolve("localhost") == "127.0.0.1"


def test_apply_sets_both_variables_only_where_the_user_set_none():
    environ = {"NCCL_SOCKET_IFNAME": "ib0"}
    netif.apply(netif.Choice("eth0", "10.0.0.7", "dlscale", "route"), environ)
    assert environ == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "eth0"}
    environ = {"GLOO_SOCKET_IFNAME": "eth1"}
    netif.apply(netif.Choice("eth1", "10.0.0.7", "dlscale", "route"), environ)
    assert environ["NCCL_SOCKET_IFNAME"] == "=eth1"  # NCCL's exact match: a bare eth1 would take eth10 too
    assert netif.user_interface("NCCL_SOCKET_IFNAME", environ["NCCL_SOCKET_IFNAME"], {"eth10": [], "eth1": []}) == "eth1"
    environ = {}
    netif.apply(netif.Choice("ib0", "192.168.10.7", "user", "GLOO_SOCKET_IFNAME=ib0"), environ)
    netif.apply(netif.Choice(None, None, "dlscale", "no route"), environ)
    assert environ == {}  # the user's variable is theirs; no interface: the backends' own defaults
