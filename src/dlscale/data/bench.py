"""``dlscale data DIR``: the input pipeline alone, stage by stage.

1. raw read (no decode): MB/s and files/s, cold (each file's pages dropped from the page cache
   with ``posix_fadvise(DONTNEED)``, which needs no privileges and touches only these files) and
   warm (read again at once);
2. decode+augment on one core: images per CPU-second of one thread;
3. the loader (``build_loader``) with 0, 1, 2, ... workers up to the cores, and the scaling
   efficiency of workers, ``X_w / (w · X_1)``;
4. the cores needed to feed a training rate (``--target-rate`` or a run's throughput).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from dlscale.analysis import breakdown as bd
from dlscale.analysis.formulas import scaling_efficiency
from dlscale.data import loader as ld
from dlscale.errors import UsageError
from dlscale.format import fmt_count
from dlscale.system import usable_cpus


@dataclass(frozen=True)
class DataBenchConfig:
    root: str
    split: str = "train"
    batch_size: int = 32
    image_size: int = 224
    max_workers: int | None = None  # None: the cores available
    images: int = 256  # images per stage (at most the dataset)
    cold: bool = True
    target_rate: float | None = None  # samples/s to feed; from a run when None and run_id is set
    seed: int = 0

    def __post_init__(self) -> None:
        for name, v in (("--batch-size", self.batch_size), ("--image-size", self.image_size), ("--images", self.images)):
            if v < 1:
                raise UsageError(f"{name} must be >= 1, got {v}")
        if self.max_workers is not None and self.max_workers < 0:
            raise UsageError(f"--max-workers must be >= 0, got {self.max_workers}")
        if self.target_rate is not None and not self.target_rate > 0:
            raise UsageError(f"--target-rate must be > 0 samples/s, got {self.target_rate}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fs_type(path: str) -> str | None:
    """The filesystem type of the mount holding ``path`` (longest matching mount point)."""
    import psutil

    path = os.path.realpath(path)
    best = None
    for p in psutil.disk_partitions(all=True):
        if path == p.mountpoint or path.startswith(p.mountpoint.rstrip("/") + "/"):
            if best is None or len(p.mountpoint) > len(best.mountpoint):
                best = p
    return best.fstype if best else None


def evict(paths: list[str]) -> str | None:
    """Drop these files from the page cache; None on success, else why a cold read is not possible."""
    if not hasattr(os, "posix_fadvise"):
        return "this platform has no posix_fadvise: cold reads not measured"
    fstype = fs_type(paths[0]) if paths else None
    if fstype in ("tmpfs", "ramfs"):
        return f"the dataset is on {fstype} (memory): there is no cold read"
    for p in paths:  # write back first: dirty pages (a freshly made dataset) are not dropped
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return None


def read_rate(paths: list[str]) -> dict[str, float]:
    """Read every file whole, no decode: MB/s (1e6 bytes) and files/s."""
    t0 = time.perf_counter()
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            total += len(f.read())
    dt = max(time.perf_counter() - t0, 1e-9)
    return {"MBps": total / dt / 1e6, "files_per_s": len(paths) / dt, "bytes": total}


def loader_rate(cfg: DataBenchConfig, workers: int, batches: int) -> float:
    """Images/s through ``build_loader`` with ``workers`` workers; the first batch (start-up) is not timed."""
    loader = ld.build_loader(cfg.root, cfg.split, cfg.batch_size, cfg.image_size, workers, train=True,
                             pin_memory=False, seed=cfg.seed)
    try:
        it = loader.forever()
        next(it)
        t0 = time.perf_counter()
        n = 0
        for _ in range(batches):
            x, _y = next(it)
            n += len(x)
        return n / (time.perf_counter() - t0)
    finally:
        loader.close()


def run_bench(cfg: DataBenchConfig, on_stage=None) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], list[str]]:
    """All stages; returns (metrics, units, raw, warnings)."""
    from dlscale.train.phases import decode_rate_per_core

    classes, samples = ld.scan(cfg.root, cfg.split)
    paths = [s.path for s in samples][: cfg.images]
    say = on_stage or (lambda _msg: None)
    m: dict[str, Any] = {"images_in_split": len(samples), "classes": len(classes)}
    u: dict[str, str] = {"images_in_split": "images", "classes": "classes"}
    warnings: list[str] = []
    note = evict(paths) if cfg.cold else "cold read not asked for (--no-cold)"
    if note is None:
        say("raw read, cold page cache")
        cold = read_rate(paths)
        m["read_MBps_cold"], m["read_files_per_s_cold"] = cold["MBps"], cold["files_per_s"]
        u["read_MBps_cold"], u["read_files_per_s_cold"] = "MB/s", "files/s"
    else:
        m["cold_read_note"] = note
        warnings.append(note)
        read_rate(paths)  # warm the cache for the warm figure
    say("raw read, warm page cache")
    warm = read_rate(paths)
    m.update({"read_MBps_warm": warm["MBps"], "read_files_per_s_warm": warm["files_per_s"],
              "mean_file_bytes": warm["bytes"] / len(paths)})
    u.update({"read_MBps_warm": "MB/s", "read_files_per_s_warm": "files/s", "mean_file_bytes": "bytes"})

    say("decode+augment, one core")
    ds = ld.JpegDataset(samples[: cfg.images], cfg.image_size, train=True, strict=False, normalize=True)
    per_core = decode_rate_per_core(ds, cfg.images)
    m["decode_rate_per_core"], u["decode_rate_per_core"] = per_core, "images/s/core"

    cores = usable_cpus()
    top = cores if cfg.max_workers is None else cfg.max_workers
    batches = max(2, math.ceil(cfg.images / cfg.batch_size))
    if len(samples) < cfg.batch_size:
        raise UsageError(f"{cfg.root}/{cfg.split} has {fmt_count(len(samples), 'image')}, fewer than one --batch-size {cfg.batch_size}")
    workers, rates = [], []
    for w in range(0, top + 1):
        say(f"loader, {fmt_count(w, 'worker')}")
        workers.append(w)
        rates.append(loader_rate(cfg, w, batches))
    eff = [scaling_efficiency(r, rates[1], w) if w >= 1 and len(rates) > 1 else None for w, r in zip(workers, rates)]
    m.update({"cores_available": cores, "loader_workers": workers, "loader_rates": rates,
              "loader_rate_best": max(rates), "worker_scaling_efficiency": eff})
    u.update({"cores_available": "cores", "loader_workers": "processes", "loader_rates": "images/s",
              "loader_rate_best": "images/s", "worker_scaling_efficiency": "fraction"})
    if cfg.target_rate:
        need = bd.cores_needed(cfg.target_rate, per_core)
        enough = [w for w, r in zip(workers, rates) if r >= cfg.target_rate]
        m.update({"target_rate": cfg.target_rate, "cores_needed": need,
                  "workers_needed": min(enough) if enough else None})
        u.update({"target_rate": "images/s", "cores_needed": "cores", "workers_needed": "processes"})
        if not enough:
            warnings.append(f"no measured worker count reaches {cfg.target_rate:.4g} images/s "
                            f"(best {max(rates):.4g}); about {fmt_count(math.ceil(need), 'core')} of decoding {'is' if math.ceil(need) == 1 else 'are'} needed")
    return m, u, {"loader_rates": [[w, r] for w, r in zip(workers, rates)]}, warnings
