"""The collectives torch.distributed offers, each as nccl-tests defines it: what one call moves and
how its bus bandwidth is derived.

``size`` is the bytes nccl-tests prints for a collective: the whole buffer for all_reduce,
broadcast, reduce and send/recv; the gathered (output) buffer for all_gather; the input buffer
for reduce_scatter; one rank's send buffer for all_to_all. ``count`` is size / element size.
algbw = size / time; busbw = algbw * factor(n), the factor making busbw comparable to the
hardware's link bandwidth whatever the rank count (nccl-tests' doc/PERFORMANCE.md):
all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce and
send/recv 1.

Every rank fills its buffers with integer values (exact in fp32 far beyond any sum here), so the
expected result is known exactly and compared element for element. torch.distributed has no
out-of-place all_reduce, broadcast or reduce, and no in-place all_to_all or send/recv: those
columns read N/A.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ELEMENT = {"float": 4}  # the data type of the sweep and its size in bytes
VALUES = 31  # data values are 1..VALUES
PIECE = 1 << 26  # elements the fill and the check build at a time (256 MiB of float32), so a 16G sweep
# needs its buffers and a few pieces, not a full-size copy of the expected result per rank


def value(rank: int, idx: Any) -> Any:
    """The integer every rank puts at element ``idx``: ((7 idx + 13 rank) mod 31) + 1."""
    return (idx * 7 + rank * 13) % VALUES + 1


def values(rank: int, lo: int, hi: int, device: Any) -> Any:
    """``value(rank, i)`` for i in [lo, hi) as float32, built by tiling its period of 31 (fast)."""
    import torch

    period = value(rank, torch.arange(lo, lo + VALUES)).to(torch.float32).to(device)
    return period.repeat(-(-(hi - lo) // VALUES))[:hi - lo]


@dataclass(frozen=True)
class Collective:
    name: str
    redop: str  # "sum" or "none"
    rooted: bool  # has a root rank (prints it), else -1
    sharded: bool  # count must split evenly over the ranks
    factor: Callable[[int], float]  # busbw / algbw for n ranks
    modes: tuple[str, ...]  # which of "out-of-place", "in-place" torch.distributed offers

    def busbw(self, algbw: float, n: int) -> float:
        return algbw * self.factor(n)


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("all_reduce", "sum", False, False, lambda n: 2 * (n - 1) / n, ("in-place",)),
    Collective("all_gather", "none", False, True, lambda n: (n - 1) / n, ("out-of-place", "in-place")),
    Collective("reduce_scatter", "sum", False, True, lambda n: (n - 1) / n, ("out-of-place", "in-place")),
    Collective("broadcast", "none", True, False, lambda n: 1.0, ("in-place",)),
    Collective("reduce", "sum", True, False, lambda n: 1.0, ("in-place",)),
    Collective("all_to_all", "none", False, True, lambda n: (n - 1) / n, ("out-of-place",)),
    Collective("sendrecv", "none", False, False, lambda n: 1.0, ("out-of-place",)),
)}
MODES = ("out-of-place", "in-place")
DEFAULT_SIZES = "8:128M"


@dataclass(frozen=True)
class CollectiveOptions:
    """What ``dlscale micro collectives`` measures (validated at construction). How its ranks are
    laid out and started is the job's ``Layout`` (``dlscale.layout``), as for every family."""

    sizes: str = DEFAULT_SIZES
    ops: str | None = None  # comma list; None: every collective
    warmup: int = 5
    iters: int = 20
    min_duration_s: float | None = None  # a cell's timed iterations last at least this (harness/window.py), <= budget
    budget: float = 0.5  # seconds per (collective, size, mode)
    min_busbw: float | None = None  # GB/s, per collective
    plant_wrong: str | None = None  # a test hook: corrupt one element of this collective's result
    device: str = "auto"
    tag: str | None = None

    def __post_init__(self) -> None:
        from dlscale.errors import UsageError

        parse_sizes(self.sizes)
        for op in (self.ops or "").split(","):
            if op.strip() and op.strip() not in COLLECTIVES:
                raise UsageError(f"unknown collective {op.strip()!r} in --ops; choose from {', '.join(COLLECTIVES)}")
        if self.plant_wrong and self.plant_wrong not in COLLECTIVES:
            raise UsageError(f"--plant-wrong names no collective: {self.plant_wrong!r}")
        if self.iters < 1 or self.warmup < 0 or self.budget <= 0:
            raise UsageError("collectives need --iters >= 1, --warmup >= 0 and --budget > 0")
        from dlscale.harness.window import check_min_duration

        check_min_duration("--min-duration", self.min_duration_s)
        if self.min_duration_s is not None and self.min_duration_s > self.budget:
            raise UsageError(f"--min-duration {self.min_duration_s:g} s is more than --budget {self.budget:g} s, the "
                             "most a (collective, size, mode) may take: raise --budget or lower --min-duration")
        if self.min_busbw is not None and self.min_busbw < 0:
            raise UsageError(f"--min-busbw must be >= 0 GB/s, got {self.min_busbw}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"unknown --device {self.device!r}; choose one of auto, cpu, cuda")

    @property
    def op_list(self) -> list[str]:
        return [o.strip() for o in (self.ops or ",".join(COLLECTIVES)).split(",") if o.strip()]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def count_for(coll: Collective, size: int, n: int, elem: int = 4) -> int:
    """Elements for a requested size: size // elem, rounded down to a multiple of n if sharded."""
    count = size // elem
    return count - count % n if coll.sharded else count


class Buffers:
    """One rank's buffers for one (collective, count, mode), the call, and the exact check."""

    def __init__(self, coll: Collective, count: int, mode: str, rank: int, n: int, device: Any, root: int = 0):
        import torch

        self.coll, self.count, self.mode, self.rank, self.n, self.root = coll, count, mode, rank, n, root
        self.device = device
        c = count // n if coll.sharded else count
        self.shard = c
        out_len = {"all_gather": count, "reduce_scatter": c}.get(coll.name, count)
        in_len = {"all_gather": c}.get(coll.name, count)
        self.recv = torch.empty(out_len if mode == "out-of-place" else max(out_len, in_len),
                                dtype=torch.float32, device=device)
        self.whole = self.recv  # the whole receive allocation, whatever slot of it ``recv`` becomes
        if mode == "in-place":
            # nccl-tests' in-place layouts: all_gather sends from its own slot of the output,
            # reduce_scatter receives into its own slot of the input.
            if coll.name == "all_gather":
                self.send = self.recv[rank * c:(rank + 1) * c]
            elif coll.name == "reduce_scatter":
                self.send, self.recv = self.recv, self.recv[rank * c:(rank + 1) * c]
            else:
                self.send = self.recv
        else:
            self.send = torch.empty(in_len, dtype=torch.float32, device=device)
        self.reset()

    def reset(self) -> None:
        """Poison every element a result is read from (-1), then write this rank's input over it.

        In-place all_gather sends from this rank's slot of the output, so only that slot gets
        values: the other slots stay -1 and a call that does not fill them fails the check
        instead of finding the previous call's (correct) result there. A broadcast's non-root
        buffer is only received into, so it stays -1 as well.
        """
        self.whole.fill_(-1)
        if self.coll.name == "broadcast" and self.rank != self.root:
            return
        for lo, hi in pieces(self.send.numel()):
            self.send[lo:hi].copy_(values(self.rank, lo, hi, self.device))

    def call(self) -> None:
        import torch.distributed as dist

        name, s, r = self.coll.name, self.send, self.recv
        if name == "all_reduce":
            dist.all_reduce(s)
        elif name == "all_gather":  # *_single: the newer names of *_into_tensor / *_tensor
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(r, s)
        elif name == "reduce_scatter":
            (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(r, s)
        elif name == "broadcast":
            dist.broadcast(s, src=self.root)
        elif name == "reduce":
            dist.reduce(s, dst=self.root)
        elif name == "all_to_all":
            dist.all_to_all_single(r, s)
        elif name == "sendrecv":
            ops = [dist.P2POp(dist.isend, s, (self.rank + 1) % self.n), dist.P2POp(dist.irecv, r, (self.rank - 1) % self.n)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        else:
            raise ValueError(f"unknown collective {name}")

    def result(self) -> Any:
        """The tensor holding this rank's result, and None where the rank has none to check."""
        if self.coll.name in ("all_reduce", "broadcast"):
            return self.send
        if self.coll.name == "reduce":
            return self.send if self.rank == self.root else None
        return self.recv

    def expected(self, lo: int = 0, hi: int | None = None) -> Any:
        """Elements [lo, hi) of this rank's exact result (default: all of it)."""
        import torch

        n, rank, c, dev = self.n, self.rank, self.shard, self.device
        name = self.coll.name
        hi = ({"all_gather": self.count, "reduce_scatter": c}.get(name, self.count)) if hi is None else hi
        if name in ("all_reduce", "reduce"):
            return sum(values(r, lo, hi, dev) for r in range(n))
        if name == "broadcast":
            return values(self.root, lo, hi, dev)
        if name == "reduce_scatter":
            return sum(values(r, rank * c + lo, rank * c + hi, dev) for r in range(n))
        if name in ("all_gather", "all_to_all"):  # block r: rank r's shard, or rank r's block for this rank
            at = 0 if name == "all_gather" else rank * c
            return torch.cat([values(r, at + max(lo, r * c) - r * c, at + min(hi, (r + 1) * c) - r * c, dev)
                              for r in range(n) if r * c < hi and (r + 1) * c > lo])
        if name == "sendrecv":
            return values((rank - 1) % n, lo, hi, dev)
        raise ValueError(name)

    def wrong(self) -> int:
        """Elements of this rank's result that differ from the exact expected values (compared a
        ``PIECE`` at a time)."""
        got = self.result()
        if got is None:
            return 0
        return sum(int((got[lo:hi] != self.expected(lo, hi)).sum().item()) for lo, hi in pieces(got.numel()))


def pieces(n: int, piece: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) ranges of at most ``piece`` (default ``PIECE``) elements covering 0..n."""
    step = piece or PIECE
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def parse_size(text: str) -> int:
    """'8', '1K', '128M', '1G' -> bytes (binary multiples, as nccl-tests)."""
    from dlscale.errors import UsageError

    t = text.strip().upper().removesuffix("B")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    digits = t[:-1] if mult > 1 else t
    if not digits.isdigit() or int(digits) <= 0:
        raise UsageError(f"cannot read size {text!r}; use bytes like 8, 64K, 128M")
    return int(digits) * mult


def parse_sizes(spec: str) -> list[int]:
    """'MIN:MAX' (factor 2) or 'MIN:MAX:FACTOR' or a comma list '8,1K,1M' -> sizes in bytes."""
    from dlscale.errors import UsageError

    if ":" in spec:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise UsageError(f"--sizes {spec!r}: use MIN:MAX[:FACTOR] or a comma list")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else (2 if len(parts) == 2 else 0)
        if factor < 2 or lo > hi:
            raise UsageError(f"--sizes {spec!r}: need MIN <= MAX and an integer FACTOR >= 2")
        sizes = []
        s = lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    return [parse_size(p) for p in spec.split(",") if p.strip()]
