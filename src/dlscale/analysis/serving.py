"""Serving runs read back: each load point's throughput per server and per user, and the Pareto front.

A serving point trades the two: more requests in flight raise the server's output tokens/s and
lower each user's. A point is on the front when no other point of the same run is at least as good
on both and better on one (docs/METRICS.md, "LLM serving"). Reads records only; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def front(xs: Sequence[float | None], ys: Sequence[float | None]) -> list[bool]:
    """For each point whether it is Pareto-optimal when both x and y are to be maximised (None: never)."""
    pts = list(zip(xs, ys))

    def dominated(i: int) -> bool:
        x, y = pts[i]
        return any(j != i and a is not None and b is not None and a >= x and b >= y and (a > x or b > y)
                   for j, (a, b) in enumerate(pts))

    return [x is not None and y is not None and not dominated(i) for i, (x, y) in enumerate(pts)]


def points_of(rec: Any) -> list[dict[str, Any]]:
    """One dict per load point of a serving record: load, the figures kept per point, on the front or not."""
    m = rec.metrics
    loads = m.get("loads_by_point") or []
    at = lambda k: list(m.get(f"{k}_by_point") or [None] * len(loads)) + [None] * len(loads)  # noqa: E731
    server, user = at("output_throughput")[: len(loads)], at("tokens_per_s_per_user")[: len(loads)]
    on = front(server, user)
    met = list(m.get("slo_met_by_point") or []) + [None] * len(loads)
    keys = ("request_throughput", "ttft_p99_s", "tpot_p99_s", "goodput", "energy_per_unit_j")
    cols = {k: at(k) for k in keys}
    return [{"load": load, "server": server[i], "user": user[i], "front": on[i], "met": met[i],
             **{k: cols[k][i] for k in keys}} for i, load in enumerate(loads)]
