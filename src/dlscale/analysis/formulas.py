"""The papers' comparison arithmetic, as pure functions (derived in docs/METRICS.md).

Scaling efficiency (seed 001, Figs. 26 and 28): measured throughput on N devices divided by N
times the single-device throughput. % difference (seed 001, Tables 5-6): (A - B) / B.
Relative score (MLPerf v0.5, seed 000): the reference system's time over the system's time,
equivalently the system's throughput over the reference's.
"""

from __future__ import annotations


def speedup(throughput_n: float, throughput_1: float) -> float:
    """Throughput on N devices over throughput on one."""
    if throughput_1 <= 0:
        raise ValueError("the single-device throughput must be > 0")
    return throughput_n / throughput_1


def ideal_throughput(throughput_1: float, devices: int) -> float:
    """N times the single-device throughput (the papers' 'ideal')."""
    if devices < 1:
        raise ValueError("devices must be >= 1")
    return throughput_1 * devices


def scaling_efficiency(throughput_n: float, throughput_1: float, devices: int) -> float:
    """measured / (N x single-device throughput); 1.0 is linear scaling."""
    return throughput_n / ideal_throughput(throughput_1, devices)


def pct_difference(a: float, b: float) -> float:
    """(A - B) / B, as a fraction (multiply by 100 for %). Positive: A is faster."""
    if b == 0:
        raise ValueError("the baseline B must be non-zero")
    return (a - b) / b


def relative_score(value: float, reference: float, higher_is_better: bool = True) -> float:
    """Speed-up over a reference: throughput ratio, or reference time / time for times."""
    if value <= 0 or reference <= 0:
        raise ValueError("both values must be > 0")
    return value / reference if higher_is_better else reference / value
