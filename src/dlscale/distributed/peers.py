"""The ranks of a job meet before their process group: addresses chosen, exchanged and tried; failures shared.

``env.init_process_group`` calls ``join`` on every rank, whatever started it (dlscale's torchrun per
node, emulated nodes, torchrun, srun or mpirun by hand), before the process group is made:

1. the rank takes the job's rendezvous store, the one ``env://`` would make (torchrun's agent store,
   or the TCPStore rank 0 hosts under srun and mpirun), and later hands it to the process group;
2. it chooses its interface and address (``netif``: the user's ``GLOO_SOCKET_IFNAME`` /
   ``NCCL_SOCKET_IFNAME``, else the route to ``MASTER_ADDR``), listens there and publishes them;
3. once every rank has: a rank whose route to the master was loopback in a job across nodes (the
   master's own name on 127.0.1.1 there, as Debian's /etc/hosts writes it) takes the route to a rank
   of another node instead and publishes again;
4. one rank per node and address connects to one listener of every other node and address, each
   within ``PROBE_S``; every rank waits for every rank's result, and a pair that could not connect
   ends every rank at once with one line (``Unreachable``) naming the pair, the cause and the
   address every node advertised, instead of gloo's ranks waiting out their timeout.

While they wait, a rank that failed (``publish_failure``: from rank.py's failure handler, or in
place from ``job.run_in_place``) ends every other at once (``PeerFailed``). Then the variables
are set where the user set none (``netif.apply``) and ``JOINED`` holds every rank's choice for the
record. Keys live under ``dlscale/j<N>/``, N counting this process's joins.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from dlscale.distributed import faults, netif
from dlscale.errors import UsageError

PROBE_S = 10.0  # a connection between two nodes' addresses is made within this long, or they cannot reach
POLL_S = 0.2  # the longest pause between two looks at the store while waiting
FAILURE_IO_S = 5.0  # a failing rank's exchanges with the store: it waits no longer for them
SHOWN_NODES = 8  # nodes named in a line; the rest counted
JOINED: list[dict[str, Any]] = []  # every rank's interface and address, as the ranks joined (the record's)
_state: dict[str, Any] = {"store": None, "gen": 0}


class Unreachable(faults.Finding):
    """Ranks of the job cannot connect to each other's advertised addresses (the line names them)."""


class PeerFailed(faults.Finding):
    """Another rank of the job failed while this one waited for it (the line is that rank's)."""


def join(env: Any, backend: str, timeout_s: float) -> Any:
    """Meet the other ranks (the module doc) and return the rendezvous store for the process group."""
    import torch.distributed as dist

    _state["gen"] += 1
    JOINED.clear()  # this join's, not an earlier one's, in a record of its failure
    timeout = timedelta(seconds=timeout_s)
    store, _, _ = next(dist.rendezvous("env://", env.rank, env.world_size, timeout=timeout))
    store.set_timeout(timeout)
    _state["store"] = store
    room = _Room(store, env, time.monotonic() + timeout_s)
    choice = netif.choose(backend, env.master_addr)
    listener = _Listener(choice.address)
    try:
        room.publish("a", _entry(env, choice, listener))
        entries = room.gather("a", env.world_size)
        moved = _to_move(entries, env.nnodes)
        if moved:
            if env.rank in moved:
                choice = _moved_choice(env, entries[env.rank], moved[env.rank])
                listener.close()
                listener = _Listener(choice.address)
                room.publish("b", _entry(env, choice, listener))
            entries.update(room.gather("b", len(moved)))
        JOINED[:] = [_public(entries[r]) for r in sorted(entries)]
        room.publish("p", {"rank": env.rank, "failures": _probe(env.rank, entries)})
        failed = [f for r in room.gather("p", env.world_size).values() for f in r["failures"]]
    finally:
        listener.close()
    if failed:
        raise Unreachable(unreachable_line(failed, entries, backend))
    netif.apply(choice)
    return store


def publish_failure(env: Any, cause: str, kind: str) -> None:
    """Tell the job's other ranks that this one failed (they end at once where they wait in ``join``).
    Before this process joined, the store is reached the way ``join`` would; nothing is said where
    that fails within a few seconds (the others then end at their timeout, as before)."""
    import sys

    store = _state["store"]
    gen = _state["gen"] if store is not None else _state["gen"] + 1
    if store is None and "torch.distributed" in sys.modules:
        store = _connect(env)
    if store is None:
        return
    entry = {"rank": env.rank, "node": env.node_rank, "host": socket.gethostname(), "cause": cause, "kind": kind,
             "time": time.time()}
    try:
        with _briefly(store):
            store.append(_key(gen, "failed"), json.dumps(entry) + "\n")
            store.add(_key(gen, "failed#"), 1)  # answered: the entry is in before this rank's sockets close
    except Exception:  # noqa: BLE001 - the store is gone: the others see that instead
        pass


def failures_elsewhere(rank: int) -> list[dict[str, Any]]:
    """What the job's other ranks published of their failures in this process's join (rank, node, host,
    cause, kind, time), earliest first: the cause behind a lost connection, on another node. [] where
    none was, or the store is gone."""
    store = _state["store"]
    if store is None:
        return []
    key = _key(_state["gen"], "failed")
    try:
        with _briefly(store):
            text = store.get(key).decode() if store.check([key]) else ""
    except Exception:  # noqa: BLE001 - the store is gone with its host
        return []
    return sorted((f for f in _lines(text) if f["rank"] != rank), key=lambda f: f["time"])


def addresses(entries: Iterable[dict[str, Any]]) -> str:
    """Each node's advertised address and interface and who chose it, e.g. 'node 0 (n0) 10.0.0.1 on
    eth0 (route to MASTER_ADDR n0 (10.0.0.1)), node 1 (n1) ...' (ranks named where a node's differ)."""
    by_node: dict[int, list[dict[str, Any]]] = {}
    for e in sorted(entries, key=lambda e: e["rank"]):
        by_node.setdefault(e["node"], []).append(e)
    parts = []
    for node, es in sorted(by_node.items())[:SHOWN_NODES]:
        kinds = {(e["interface"], e["address"], e["how"]) for e in es}
        if len(kinds) == 1:
            parts.append(f"node {node} ({es[0]['host']}) {_where(es[0])}")
        else:
            parts.extend(f"rank {e['rank']} (node {node}, {e['host']}) {_where(e)}" for e in es)
    more = len(by_node) - SHOWN_NODES
    return ", ".join(parts) + (f" and {more} more node(s)" if more > 0 else "")


def unreachable_line(failed: list[dict[str, Any]], entries: dict[int, dict[str, Any]], backend: str) -> str:
    """One line: the first pair that could not connect and why, how many more, every node's address,
    and what to set."""
    f = min(failed, key=lambda f: (f["from"], f["to"]))
    a, b = entries[f["from"]], entries[f["to"]]
    more = f" (and {len(failed) - 1} more pair(s))" if len(failed) > 1 else ""
    variable = netif.VARIABLES.get(backend, netif.VARIABLES["gloo"])
    if any(e["set_by"] == "user" for e in entries.values()):
        hint = (f"{variable} as set names an interface the other nodes cannot reach: set it to each node's "
                "interface towards the others, or unset it for dlscale to take the route to MASTER_ADDR")
    else:
        hint = f"dlscale took each node's route to MASTER_ADDR: set {variable} to each node's interface towards the others"
    return (f"ranks cannot reach each other: rank {a['rank']} (node {a['node']}, {a['host']}) could not connect to "
            f"rank {b['rank']} (node {b['node']}, {b['host']}) at {f['at']}: {f['error']}{more}; "
            f"advertised: {addresses(entries.values())}; {hint}")


class _Room:
    """The store's keys of one join: entries appended under a phase, a counter per phase, failures."""

    def __init__(self, store: Any, env: Any, deadline: float):
        self.store, self.env, self.deadline = store, env, deadline
        self.gen = _state["gen"]

    def publish(self, phase: str, entry: dict[str, Any]) -> None:
        self._op(self.store.append, _key(self.gen, phase), json.dumps(entry) + "\n")
        self._op(self.store.add, _key(self.gen, phase + "#"), 1)

    def gather(self, phase: str, count: int) -> dict[int, dict[str, Any]]:
        """The entries of ``phase`` once ``count`` ranks published theirs; a failed rank, a lost store or
        the deadline ends the wait."""
        pause = 0.005
        while self._op(self.store.add, _key(self.gen, phase + "#"), 0) < count:
            self._check_failed()
            if time.monotonic() > self.deadline:
                seen = self._read(phase) if self._op(self.store.check, [_key(self.gen, phase)]) else {}
                missing = sorted(set(range(self.env.world_size)) - set(seen)) if phase != "b" else []
                who = f"ranks {_ranks(missing)}" if missing else "the other ranks"
                raise TimeoutError(f"timed out waiting for {who} to join the job (hung, or ended without a word)")
            time.sleep(pause)
            pause = min(POLL_S, pause * 2)
        self._check_failed()
        return self._read(phase)

    def _read(self, phase: str) -> dict[int, dict[str, Any]]:
        return {e["rank"]: e for e in _lines(self._op(self.store.get, _key(self.gen, phase)).decode())}

    def _check_failed(self) -> None:
        key = _key(self.gen, "failed")
        if not self._op(self.store.check, [key]):
            return
        others = [f for f in _lines(self._op(self.store.get, key).decode()) if f["rank"] != self.env.rank]
        if others:
            f = min(others, key=lambda f: f["time"])
            if f["kind"] == "usage":
                raise UsageError(f"rank {f['rank']} (node {f['node']}, {f['host']}): {f['cause']}")
            cause = f["cause"] if f["kind"] == "finding" else f"rank {f['rank']} (node {f['node']}, {f['host']}) failed: {f['cause']}"
            raise PeerFailed(cause)

    def _op(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the store's host ended: the job is over
            raise PeerFailed(f"rank {self.env.rank} lost the job's store at {self.env.master_addr}:{self.env.master_port} "
                             f"({' '.join(str(e).split())[:200]}): rank 0 or node 0's launcher ended") from None


class _Listener:
    """A socket on the rank's advertised address that answers each connection with its token."""

    def __init__(self, address: str | None):
        self.sock: socket.socket | None = None
        self.port: int | None = None
        self.token = secrets.token_hex(8)
        self.stop = threading.Event()
        if address is None:
            return
        self.sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, name="dlscale-peers", daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(self.token.encode())
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        if self.sock is not None:
            self.sock.close()


def _entry(env: Any, choice: netif.Choice, listener: _Listener) -> dict[str, Any]:
    return {"rank": env.rank, "node": env.node_rank, "host": socket.gethostname(), **choice.to_dict(),
            "loopback": choice.loopback, "port": listener.port, "token": listener.token}


def _public(e: dict[str, Any]) -> dict[str, Any]:
    return {k: e[k] for k in ("rank", "node", "host", "interface", "address", "set_by", "how")}


def _to_move(entries: dict[int, dict[str, Any]], nnodes: int) -> dict[int, dict[str, Any]]:
    """The ranks whose derived route to the master was loopback in a job across nodes, each with the
    lowest rank of another node whose address is not loopback (none such: loopback is right)."""
    if nnodes <= 1:
        return {}
    out = {}
    for r, e in entries.items():
        if e["set_by"] == "dlscale" and e["loopback"]:
            other = [o for o in entries.values() if o["node"] != e["node"] and o["address"] and not o["loopback"]]
            if other:
                out[r] = min(other, key=lambda o: o["rank"])
    return out


def _moved_choice(env: Any, mine: dict[str, Any], peer: dict[str, Any]) -> netif.Choice:
    how = f"route to rank {peer['rank']} ({peer['host']}, {peer['address']}); the {mine['how']} is loopback here"
    return netif.towards(peer["address"], how)


def _probe(rank: int, entries: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """This rank's tries, where it is the first rank of its (node, address): one connection to the first
    rank of every other (node, address) that listens."""
    first: dict[tuple[int, str | None], dict[str, Any]] = {}
    for r in sorted(entries):
        first.setdefault((entries[r]["node"], entries[r]["address"]), entries[r])
    me = entries[rank]
    if first[(me["node"], me["address"])]["rank"] != rank:
        return []
    targets = [e for e in first.values() if e["rank"] != rank and e["port"] is not None]
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
        errors = list(pool.map(_try, targets))
    return [{"from": rank, "to": t["rank"], "at": _at(t), "error": err} for t, err in zip(targets, errors) if err]


def _try(target: dict[str, Any]) -> str | None:
    """None where ``target``'s listener answered with its token, else why not."""
    try:
        with socket.create_connection((target["address"], target["port"]), timeout=PROBE_S) as s:
            got = b""
            while len(got) < len(target["token"]):
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk
    except socket.timeout:
        return f"no answer within {PROBE_S:g} s"
    except OSError as e:
        return e.strerror or type(e).__name__
    return None if got.decode(errors="replace") == target["token"] else f"another process answers there, not rank {target['rank']}"


def _connect(env: Any) -> Any:
    """The job's store as ``join`` reaches it, within a few seconds; None where it cannot be reached."""
    import torch.distributed as dist

    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    try:  # tcp:// makes the store as env:// does (torchrun's agent store, else rank 0's), from these arguments
        url = f"tcp://{host}:{env.master_port}"
        store, _, _ = next(dist.rendezvous(url, env.rank, env.world_size, timeout=timedelta(seconds=5)))
        return store
    except Exception:  # noqa: BLE001 - no store to tell: the others end at their timeout
        return None


def _where(e: dict[str, Any]) -> str:
    if e["address"] is None:
        return f"no address of its own ({e['how']})"
    who = f"set by the user: {e['how']}" if e["set_by"] == "user" else e["how"]
    return f"{e['address']} on {e['interface']} ({who})"


def _at(e: dict[str, Any]) -> str:
    return f"[{e['address']}]:{e['port']}" if ":" in e["address"] else f"{e['address']}:{e['port']}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:16])) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


@contextlib.contextmanager
def _briefly(store: Any) -> Iterator[None]:
    """The store's waits bounded by ``FAILURE_IO_S`` for the block (a failing rank does not wait out the
    job's timeout for a store whose host is gone), its own timeout back after."""
    before = store.timeout
    store.set_timeout(timedelta(seconds=FAILURE_IO_S))
    try:
        yield
    finally:
        store.set_timeout(before)


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _key(gen: int, name: str) -> str:
    return f"dlscale/j{gen}/{name}"
