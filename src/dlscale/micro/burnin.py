"""``dlscale micro burnin``: a seeded workload on every device at once, for a set time, whose results
are compared bit for bit (silent data corruption) while the devices run at full power (burn-in).

One *round* is a GEMM chain and a short LLM training run, both from fixed seeds:

- the GEMM chain: ``x_{i+1} = m_i / max|m_i|`` with ``m_i = x_i @ W_i`` for ``gemm_chain`` square
  matrices of ``gemm_size`` (bf16 on GPUs that have it, else fp32), operands drawn once from the
  seed; dividing by the largest magnitude keeps every value in [-1, 1] however long the chain, and
  a maximum is exact in any reduction order;
- the LLM: ``llama_tiny`` built from the seed, ``llm_steps`` AdamW steps on seeded token batches
  (fp32, the math attention kernel, the next-token loss as log-softmax and a gather: torch's
  ``nll_loss`` has no deterministic CUDA kernel), its losses and final weights kept.

Every round starts from the same seeds, so every round of every rank computes the same thing: a
healthy device gives the same bits in each round, and devices of one model with the same software
give each other's bits. Each rank burns rounds until ``duration`` seconds have passed (at least
one round), then sends rank 0 its first round's result, every later round that differed from it,
its timings, and what its monitor saw (power, clocks, temperature, clock-event reasons, energy).

A result is three digests: the GEMM chain's output, the LLM's final weights, and its losses
(each loss's exact float). A tensor's digest is two sums of its elements' bit patterns read as
integers, in Python's unbounded integers from 64-bit partial sums (``digest``): the plain sum
changes with any single flipped bit, the position-weighted one when values move; integer sums
are exact in any order, so the digest itself is deterministic on every device.

Bitwise equality is meaningful only where the same algorithms run on the same kind of device:
the same device model (GPUs) or the same CPU model and ISA with the same threads per rank (CPUs:
every rank of a job gets the same ``OMP_NUM_THREADS``), the same shapes and seeds, deterministic
algorithms (``torch.use_deterministic_algorithms``, ``CUBLAS_WORKSPACE_CONFIG``, cuDNN's
deterministic mode, TF32 off) and the same software (torch, CUDA, cuDNN). The record keeps all of
these (``comparable``). This module is pure (no torch); the ranks' part is ``micro/burn_worker.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dlscale.errors import UsageError

VERSION = 1  # the burn's algorithm: results of different versions are not compared
PARTS = {"gemm": "GEMM chain output", "llm": "LLM final weights", "losses": "LLM losses"}
GPU_SHAPE = {"gemm_size": 8192, "gemm_chain": 256, "llm_steps": 8, "seq_len": 256, "batch_size": 8}
CPU_SHAPE = {"gemm_size": 384, "gemm_chain": 8, "llm_steps": 4, "seq_len": 32, "batch_size": 2}
LLM_MODEL = "llama_tiny"
LLM_LR = 1e-3
MAX_CHANGED = 10  # later rounds that differed from the first, kept per rank
UNITS = {"rounds": "rounds", "rounds_min": "rounds", "burn_s": "s", "gemm_tflops_min": "TFLOP/s",
         "gemm_tflops_max": "TFLOP/s", "llm_tokens_per_s_min": "tokens/s", "mismatched_ranks": "ranks",
         "world_size": "ranks"}


@dataclass(frozen=True)
class BurninOptions:
    """What ``dlscale micro burnin`` runs (validated at construction); its ranks are a ``Layout``.
    A shape left None is the device's default (``GPU_SHAPE``, ``CPU_SHAPE``)."""

    duration: float = 60.0  # seconds of rounds on every rank (at least one round)
    gemm_size: int | None = None
    gemm_chain: int | None = None
    llm_steps: int | None = None
    seed: int = 0
    device: str = "auto"
    tag: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.duration <= 7 * 86400:
            raise UsageError(f"--duration must be > 0 seconds (at most a week), got {self.duration}")
        for name, v, top in (("--gemm-size", self.gemm_size, 32768), ("--gemm-chain", self.gemm_chain, 100000),
                             ("--llm-steps", self.llm_steps, 10000)):
            if v is not None and not 1 <= v <= top:
                raise UsageError(f"{name} must be in 1..{top}, got {v}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"unknown --device {self.device!r}; choose one of auto, cpu, cuda")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shape(self, device_type: str) -> dict[str, int]:
        """The round's shape on this kind of device: the options given, the device's defaults otherwise."""
        base = dict(GPU_SHAPE if device_type == "cuda" else CPU_SHAPE)
        given = {"gemm_size": self.gemm_size, "gemm_chain": self.gemm_chain, "llm_steps": self.llm_steps}
        return {**base, **{k: v for k, v in given.items() if v is not None}}


# -- one rank's rounds ------------------------------------------------------------------------------
def changed_parts(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The parts (``PARTS``) in which two results differ."""
    return [p for p in PARTS if a.get(p) != b.get(p)]


def key(result: dict[str, Any]) -> tuple:
    return tuple(str(result.get(p)) for p in PARTS)


def part_names(parts: Sequence[str]) -> str:
    return ", ".join(PARTS[p] for p in parts)


# -- ranks against each other -----------------------------------------------------------------------
def reference_ranks(ranks: Sequence[dict[str, Any]], known_good: dict[str, Any] | None = None) -> list[int] | None:
    """The ranks whose first-round result the others are held to: all of them where they agree; else
    the one largest group of at least two that agree; else (a tie, or every rank alone) the ranks
    that match ``known_good`` (a result of the same software on the same model); else None, and
    nothing tells which ranks are right."""
    groups: dict[tuple, list[int]] = {}
    for r in ranks:
        groups.setdefault(key(r["result"]), []).append(r["rank"])
    if len(groups) == 1:
        return next(iter(groups.values()))
    sizes = Counter(len(g) for g in groups.values())
    biggest = max(groups.values(), key=len)
    if len(biggest) >= 2 and sizes[len(biggest)] == 1:
        return biggest
    if known_good is not None:
        return groups.get(key(known_good))
    return None


def findings(ranks: Sequence[dict[str, Any]], known_good: dict[str, Any] | None = None) -> dict[int, list[str]]:
    """Rank -> what is wrong with its results (an empty list: nothing): a round that differed from
    its own first round, or a first round that differs from the reference ranks' (``reference_ranks``)."""
    ref = reference_ranks(ranks, known_good)
    by_rank = {r["rank"]: r for r in ranks}
    out: dict[int, list[str]] = {}
    for r in ranks:
        mine: list[str] = []
        changed = r.get("changed") or []
        if changed:
            first = changed[0]
            more = r.get("changed_rounds", len(changed)) - 1
            mine.append(f"its round {first['round']}{f' (and {more} more)' if more > 0 else ''} of "
                        f"{r['rounds']} gave another {part_names(first['parts'])} than its round 0")
        if ref is None:
            others = [o for o in by_rank if o != r["rank"]]
            mine.append(f"its results and those of rank(s) {', '.join(map(str, others))} disagree, and no majority "
                        "or known-good result tells which are right")
        elif r["rank"] not in ref:
            parts = changed_parts(r["result"], by_rank[ref[0]]["result"])
            mine.append(f"its {part_names(parts)} differ(s) bit for bit from that of rank(s) {', '.join(map(str, ref))}")
        out[r["rank"]] = mine
    return out


def device_words(r: dict[str, Any]) -> str:
    """'rank 1 (cuda:1, NVIDIA H100 80GB HBM3, GPU-8f3a...)' / 'rank 1 (cpu)': a rank by its device."""
    d = r.get("device") or {}
    bits = [str(d.get("device") or "?")]
    if str(d.get("device", "")).startswith("cuda"):
        bits += [str(x) for x in (d.get("device_name"), d.get("uuid")) if x]
    host = d.get("host")
    return f"rank {r['rank']} ({', '.join(bits)}{f' on {host}' if host else ''})"


def failure_line(ranks: Sequence[dict[str, Any]]) -> str | None:
    """One line naming every rank whose results are wrong, or None where all agree."""
    found = findings(ranks)
    bad = [f"{device_words(r)}: {'; '.join(found[r['rank']])}" for r in ranks if found[r["rank"]]]
    return f"silent data corruption: {' | '.join(bad)}" if bad else None


# -- the run's figures -------------------------------------------------------------------------------
def summarize(ranks: Sequence[dict[str, Any]], shape: dict[str, int]) -> dict[str, Any]:
    """The run's scalar figures: rounds (all ranks, the fewest on one rank), burn seconds, the slowest
    and fastest rank's GEMM rate (``gemm_chain x 2 n^3`` FLOPs per chain over its mean time), the
    slowest rank's LLM tokens/s, and how many ranks disagree."""
    flops = shape["gemm_chain"] * 2 * shape["gemm_size"] ** 3
    tokens = shape["llm_steps"] * shape["batch_size"] * shape["seq_len"]
    gemm = [flops / mean(r["gemm_s"]) / 1e12 for r in ranks if r.get("gemm_s")]
    llm = [tokens / mean(r["llm_s"]) for r in ranks if r.get("llm_s")]
    return {"rounds": sum(r["rounds"] for r in ranks), "rounds_min": min(r["rounds"] for r in ranks),
            "burn_s": max(r["burn_s"] for r in ranks), "gemm_tflops_min": min(gemm) if gemm else None,
            "gemm_tflops_max": max(gemm) if gemm else None, "llm_tokens_per_s_min": min(llm) if llm else None,
            "mismatched_ranks": sum(1 for v in findings(ranks).values() if v), "world_size": len(ranks)}


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)
