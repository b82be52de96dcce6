"""The one-line hint of ``dlscale train``: a precision or memory format measured much faster here.

After a run (so nothing it measures changes), the store is asked for this model's successful short
tests on the same host and device, with the same batch and shape, that differ only in precision or
memory format; the fastest of them, when it is at least ``FACTOR`` times this run's throughput,
becomes one line naming the options and the run that showed it. No torch at import time.
"""

from __future__ import annotations

from typing import Any

FACTOR = 1.5  # "much faster": below this, load noise on a shared machine could make the hint wrong
SAME = ("batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "compile",
        "compile_mode", "optimizer", "optimizer_impl", "device", "device_name", "parallel", "data")
DEFAULTS = {"optimizer_impl": "default"}  # what a record made before the field existed ran with
LOOKED_AT = 500  # newest records of the model read from the store


def hint_for(rec: Any, store: Any) -> str | None:
    """The hint line for ``rec`` (a finished train record), or None."""
    if rec.kind != "train" or rec.status != "ok" or not rec.metrics.get("throughput"):
        return None
    mine, best = rec.config, None
    for other in store.query(kind="train", workload=rec.workload, status="ok", limit=LOOKED_AT):
        c = other.config
        if other.run_id == rec.run_id or other.hostname != rec.hostname or other.imported:
            continue
        if any(c.get(k, DEFAULTS.get(k)) != mine.get(k, DEFAULTS.get(k)) for k in SAME) or \
                other.metrics.get("world_size", 1) != rec.metrics.get("world_size", 1):
            continue
        if (c.get("precision"), c.get("channels_last")) == (mine.get("precision"), mine.get("channels_last")):
            continue
        thr = other.metrics.get("throughput") or 0.0
        if best is None or thr > best.metrics["throughput"]:
            best = other
    if best is None or best.metrics["throughput"] < FACTOR * rec.metrics["throughput"]:
        return None
    ratio = best.metrics["throughput"] / rec.metrics["throughput"]
    flags = f"--precision {best.config.get('precision')}"
    if best.config.get("channels_last") != mine.get("channels_last"):
        flags += " --channels-last" if best.config.get("channels_last") else " --no-channels-last"
    return (f"hint: {rec.workload} ran {ratio:.1f}x faster on this machine with {flags} (run {best.run_id}); "
            f"`dlscale tune {rec.workload}` searches every knob")
