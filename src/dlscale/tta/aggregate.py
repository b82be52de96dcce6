"""Figures over several time-to-accuracy runs: MLPerf's olympic mean and the speed-up split.

Olympic mean (MLPerf training rules, image classification: 5 runs): sort the times to target,
drop the fastest and the slowest, average the rest. A run that never reached the target counts
as infinitely slow: one such run is dropped as the slowest, two leave no result.

Speed-up of an N-node run over the single-node run of the same config, and its two causes
(seed 003: 4.9x on 8 nodes while converging in 81 epochs instead of 61):

    speedup            = T_1 / T_N                 (time to target, run start to the target)
    throughput_speedup = X_N / X_1                 (training samples/s)
    epochs_ratio       = E_1 / E_N                 (fewer than 1: the N-node run needed more epochs)

With ``T_train = E * S / X`` (S samples per epoch), ``T_1,train / T_N,train = throughput_speedup
* epochs_ratio`` exactly; the remainder of ``speedup`` is evaluation and set-up time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dlscale.analysis.formulas import speedup


def olympic_mean(times: Sequence[float | None]) -> float | None:
    """Mean after dropping the fastest and the slowest; None (never reached) counts as infinite."""
    if len(times) < 3:
        raise ValueError(f"the olympic mean needs at least 3 runs, got {len(times)}")
    xs = sorted(math.inf if t is None else float(t) for t in times)
    kept = xs[1:-1]
    if any(math.isinf(x) for x in kept):
        return None
    return sum(kept) / len(kept)


def speedup_split(t_1: float, x_1: float, e_1: float, t_n: float, x_n: float, e_n: float) -> dict[str, float]:
    """speedup, throughput_speedup, epochs_ratio and their product (see the module docstring)."""
    tp = speedup(x_n, x_1)
    er = e_1 / e_n
    return {
        "speedup": t_1 / t_n,
        "throughput_speedup": tp,
        "epochs_ratio": er,
        "train_time_speedup": tp * er,
    }


def _nodes(config: dict[str, Any]) -> tuple[int, int]:
    """(nodes, ranks per node) of a tta record's config (the layout keys; older records' own fields)."""
    nodes = config.get("nodes") or config.get("emulate_nodes") or config.get("nnodes") or 1
    per_node = config.get("devices_per_node") or config.get("nproc_per_node") or 1
    return int(nodes), int(per_node)


def find_reference(store: Any, config: dict[str, Any]) -> Any | None:
    """The newest ok tta record of the same config on one node (the speed-up's reference).

    Same config: ``same_config_key(..., with_seed=False)`` equal. One node: for a multi-node
    run (``nnodes`` or emulated nodes > 1), a run on one node with the same ranks per node; for
    a one-node run with several ranks, a one-rank run. None if there is none.
    """
    from dlscale.tta.config import same_config_key

    key = same_config_key(config, with_seed=False)
    nodes, per_node = _nodes(config)
    for rec in store.query(kind="tta", workload=config["model"], status="ok"):
        c = rec.config
        if same_config_key(c, with_seed=False) != key or rec.metrics.get("time_to_target") is None:
            continue
        r_nodes, r_per_node = _nodes(c)
        if nodes > 1 and r_nodes == 1 and r_per_node == per_node:
            return rec
        if nodes == 1 and config.get("world_size", 1) > 1 and c.get("world_size", 1) == 1:
            return rec
    return None
