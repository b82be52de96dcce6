"""Decode against its physical limit: the bytes a decode step must read, how fast a run read them, and
whether a generation fits the device at all.

A decode step of a dense decoder reads every weight that takes part in a matmul once (all but the
input embedding, whose b rows are a lookup) and, per sequence, the KV cache of every position it
attends over; it computes 2 FLOPs per weight per token, so at small batch it is bound by memory
bandwidth, not by compute. Per step at batch b (docs/METRICS.md, "Decode against its limit"):

    bytes per step  = W + b · K · C        W: weight bytes read (N x dtype bytes, ``param_counts``)
                                           K: KV bytes per position (2 · layers · KV heads · head dim · dtype bytes)
                                           C: mean positions attended, P + N/2 over the N - 1 steps
    achieved bytes/s = bytes per step x steps/s = (W + b·K·C) x decode tokens/s / b
                     (at batch 1: (W + K·C) x tokens/s)

and its fractions of two rates of the same device: the copy bandwidth measured here just before the
decode (``copy_bandwidth``: a device-to-device ``copy_`` on a GPU as ``micro memory`` d2d counts it,
read + write; STREAM's copy on a CPU), and the datasheet memory bandwidth (the GPU-facts table,
``dlscale.gpus``; none on a CPU, whose rate depends on the memory channels populated and the DIMMs'
speed, which the inventory does not read). A static cache that reads all its allocated positions
(masked) reads more than C: that is the mode's loss, so it counts against its fraction rather than
for it.

``check_fits`` refuses, in one line before anything is allocated, a generation whose weights, KV cache
and activations (``domains.llm.workload.inference_memory``) exceed the device's free memory.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import UsageError
from dlscale.format import fmt_bytes

COPY_WARMUP, COPY_REPS = 3, 10
# a CPU's copy: STREAM's arrays are 4x the last-level cache, which a VM may report as hundreds of MiB; a
# decode's reference stops at 256 MiB arrays (1 GiB moved per 2 calls) and says so where that is under the rule
CPU_COPY_MIB, CPU_COPY_REPS = 256, 5
NO_CPU_DATASHEET = ("no datasheet memory bandwidth for a CPU: dlscale's memory table covers GPUs, and a CPU's rate "
                    "depends on the memory channels populated and the DIMMs' speed, which the inventory does not read")
UNITS = {"decode_bytes_per_token_by_batch": "bytes", "decode_memory_gbps_by_batch": "GB/s",
         "decode_fraction_of_copy_by_batch": "fraction", "decode_fraction_of_datasheet_by_batch": "fraction",
         "decode_bytes_per_token": "bytes", "decode_memory_gbps": "GB/s", "decode_fraction_of_copy": "fraction",
         "decode_fraction_of_datasheet": "fraction", "reference_copy_gbps": "GB/s", "datasheet_memory_gbps": "GB/s"}


def step_bytes(weight_bytes: float, kv_per_position: float, batch: int, prompt_len: int, output_len: int) -> float:
    """Bytes one decode step reads on average: the weights once, and each of ``batch`` sequences' KV cache
    over the mean context P + N/2 (step j of N - 1 attends over P + j positions)."""
    return weight_bytes + batch * kv_per_position * (prompt_len + output_len / 2)


def figures(bytes_per_step: float, batch: int, tokens_per_s: float, copy_gbps: float | None,
            datasheet_gbps: float | None) -> dict[str, float | None]:
    """One batch size's limit figures from its decode tokens/s (pure arithmetic)."""
    gbps = bytes_per_step * tokens_per_s / batch / 1e9
    return {"decode_bytes_per_token": bytes_per_step / batch, "decode_memory_gbps": gbps,
            "decode_fraction_of_copy": gbps / copy_gbps if copy_gbps else None,
            "decode_fraction_of_datasheet": gbps / datasheet_gbps if datasheet_gbps else None}


def weight_bytes_read(fields: dict[str, Any], dtype_bytes: int) -> int:
    """W: the bytes of every weight a decode step's matmuls read (N of ``param_counts``)."""
    from dlscale.domains.llm.workload import param_counts

    return param_counts(fields)[0] * dtype_bytes


def datasheet_bandwidth(device: Any) -> tuple[float | None, str]:
    """(GB/s, source) of the device's datasheet memory bandwidth, or (None, why none)."""
    if getattr(device, "type", "cpu") != "cuda":
        return None, NO_CPU_DATASHEET
    from dlscale import gpus
    from dlscale.harness.device import device_name

    name = device_name(device)
    mem = gpus.memory(name)
    if mem is None:
        return None, f"no datasheet memory bandwidth for {name!r} in dlscale's GPU facts ({gpus.built_in_path().name})"
    return float(mem.value), mem.source


def copy_bandwidth(device: Any, timer: Any = None) -> tuple[float, str]:
    """(GB/s, how) of a copy on the device, measured now with the ``micro memory`` cases: a GPU's
    device-to-device ``copy_`` of ``GPU_MIB`` MiB (read + write counted, the median of ``COPY_REPS``
    windows), a CPU's STREAM copy of arrays 4x its last-level cache up to ``CPU_COPY_MIB`` (the mean of
    ``CPU_COPY_REPS`` calls).
    ``timer`` (``micro.harness.timed_reps`` by default) returns seconds per call."""
    from dlscale.micro import memory
    from dlscale.micro.harness import rates, timed_reps

    timer = timer or timed_reps
    if getattr(device, "type", "cpu") == "cuda":
        nbytes = memory.GPU_MIB * 2**20
        times = timer(memory.build_transfer("d2d", nbytes, device), COPY_WARMUP, COPY_REPS, device)
        gbps = rates(times, None, 2 * nbytes, None, center="median")["gbps"]
        how = (f"measured before the decode: device-to-device copy_ of {memory.GPU_MIB} MiB on {device}, read + write "
               f"counted (as micro memory's d2d), median of {len(times)} windows")
        _release(device)
        return gbps, how
    mib = min(memory.default_array_mib(), CPU_COPY_MIB)
    n = mib * 2**20 // 8
    times = timer(_stream_copy(n), 1, CPU_COPY_REPS, device)
    gbps = rates(times, None, memory.stream_bytes("copy", n), None)["gbps"]
    llc = memory.last_level_cache_bytes()
    short = (f"; arrays under STREAM's 4x the last-level cache ({llc / 2**20:.0f} MiB), so cache hits may raise it"
             if llc and mib * 2**20 < 4 * llc else "")
    return gbps, (f"measured before the decode: STREAM copy of {mib} MiB float64 arrays in host memory, read + write "
                  f"counted (as micro memory's copy), mean of {len(times)} calls{short}")


def _stream_copy(n: int) -> Any:
    """STREAM's copy c = a over n float64 (the two arrays it touches; micro memory's case also makes a third)."""
    import torch

    a = torch.full((n,), 1.0, dtype=torch.float64)
    c = torch.zeros(n, dtype=torch.float64)
    return lambda: c.copy_(a)


def _release(device: Any) -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def free_memory(device: Any) -> int | None:
    """Bytes free for a new allocation: the GPU's free memory (cudaMemGetInfo), or the host's MemAvailable."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    from dlscale.memsize import available_memory

    return available_memory()


def check_fits(model: str, need: dict[str, int], precision: str, shape: str, device: Any, free: int | None) -> None:
    """A ``UsageError`` (one line, exit 2) where the estimate ``need`` (``inference_memory``) exceeds ``free``."""
    if free is None or need["total"] <= free:
        return
    raise UsageError(f"{model} in {precision} at {shape} needs about {fmt_bytes(need['total'])} (weights "
                     f"{fmt_bytes(need['weights'])}, KV cache {fmt_bytes(need['kv_cache'])}, activations "
                     f"{fmt_bytes(need['activations'])}) but {device} has {fmt_bytes(free)} free; use a smaller "
                     f"model (e.g. llama_small), a smaller batch or shorter sequences, or a device with more memory")
