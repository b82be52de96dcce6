"""The throughput short test: warm-up steps, then measured steps on synthetic data.

``build_setup`` makes the model, optimizer and a device-resident batch and returns the training
step; ``run_short_test`` times it with the harness's ``timed_loop`` once per repeat and turns the
step times into the run's metrics. A distributed caller passes ``wrap_model`` (e.g. DDP) and
``sync``; everything else is shared.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlscale import workloads
from dlscale.config import TrainConfig
from dlscale.harness import device as dev
from dlscale.harness.metrics import STEP_UNITS, mfu, summarize_steps
from dlscale.harness.runner import NonFiniteLoss, Outcome
from dlscale.harness.timing import StepCallback, timed_loop
from dlscale.train.observe import RunObserver


@dataclass
class TrainingSetup:
    model: Any
    optimizer: Any
    step: Callable[[], Any]  # one training step; returns the loss tensor (not synchronised)
    # The step's parts, for the instrumented steps after the window (train/phases.py).
    fetch: Callable[[], Any] | None = None  # the next host batch (x, y)
    to_device: Callable[[Any, Any], Any] | None = None
    forward_loss: Callable[[Any, Any], Any] | None = None
    backward: Callable[[Any], None] | None = None
    optimizer_step: Callable[[], None] | None = None


def build_setup(cfg: TrainConfig, device: Any, seed: int, wrap_model: Callable[[Any], Any] | None = None,
                feed: Any = None) -> TrainingSetup:
    """``feed`` (data.feed.DeviceFeed) supplies real batches; None: one synthetic device-resident batch."""
    import torch

    w = workloads.get(cfg.model)
    torch.manual_seed(seed)
    model = w.build().to(device)
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    model.train()
    if wrap_model is not None:
        model = wrap_model(model)
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    fwd = torch.compile(model) if cfg.compile else model
    if feed is None:
        x, y = w.make_batch(cfg.batch_size, cfg.image_size, device, seed=seed)
        x = x.contiguous(memory_format=memory_format)
        fetch, to_device = (lambda: (x, y)), (lambda a, b: (a, b))
        next_batch = fetch
    else:
        fetch, to_device, next_batch = feed.fetch, feed.to_device, feed
    amp_dtype = dev.autocast_dtype(cfg.precision)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    loss_fn = w.loss

    def forward_loss(xb: Any, yb: Any) -> Any:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            return loss_fn(fwd(xb), yb)

    def backward(loss: Any) -> None:
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def optimizer_step() -> None:
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        xb, yb = next_batch()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(fwd(xb), yb)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.detach()

    return TrainingSetup(model=model, optimizer=opt, step=step, fetch=fetch, to_device=to_device,
                         forward_loss=forward_loss, backward=backward, optimizer_step=optimizer_step)


def _peak_memory(device: Any) -> tuple[int, str]:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_peak_rss"


def _peak_flops(device: Any, precision: str, system: dict[str, Any]) -> tuple[float | None, str, float | None]:
    """(peak FLOP/s, its source, ISA estimate) for MFU; (None, reason, None) when unknown."""
    from dlscale import peaks

    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
        p = peaks.gpu_peak(name, precision)
        if p is None:
            return None, f"no known {precision} peak for {name!r}: MFU left empty", None
        return p.flops, p.source, None
    p = peaks.measured_cpu_gemm_peak(precision)
    cpu = system.get("cpu", {})
    isa = peaks.cpu_isa_peak(cpu.get("isa", {}), cpu.get("physical_cores"), cpu.get("nominal_ghz"))
    return p.flops, p.source, (isa.flops if isa and precision == "fp32" else None)


def run_short_test(
    cfg: TrainConfig,
    device: Any,
    system: dict[str, Any],
    on_step: StepCallback | None = None,
    wrap_model: Callable[[Any], Any] | None = None,
    sync: Callable[[], None] | None = None,
    world_size: int = 1,
) -> Outcome:
    """Time ``cfg.repeat`` independent repeats and return the run's figures.

    Samples per step are ``batch_size * world_size`` (per-device batch times data-parallel
    ranks); a distributed caller passes per-rank step times through its own aggregation.
    """
    import torch

    from dlscale.flops import workload_flops

    dev.set_matmul_precision(cfg.precision, device)
    repeats: list[list[float]] = []
    losses: list[list[float]] = []
    peak_mem, peak_kind = 0, ""
    obs = RunObserver(cfg, device, world_size)  # monitor + real-data feed; closed whatever happens
    try:
        for r in range(cfg.repeat):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            setup = build_setup(cfg, device, seed=cfg.seed + r, wrap_model=wrap_model, feed=obs.feed)
            times, outs = timed_loop(setup.step, cfg.warmup_steps, cfg.steps, device, on_step, sync)
            obs.end_window(times)
            step_losses = torch.stack(outs).float().cpu()
            if not torch.isfinite(step_losses).all():
                bad = int((~torch.isfinite(step_losses)).nonzero()[0])
                raise NonFiniteLoss(f"loss became {step_losses[bad].item()} at measured step {bad + 1} of repeat {r + 1}")
            repeats.append(times)
            losses.append(step_losses.tolist())
            mem, peak_kind = _peak_memory(device)
            peak_mem = max(peak_mem, mem)
            if r == cfg.repeat - 1:
                obs.explain(setup)  # phase breakdown, loader rate, verdict, profile: after the window
            del setup
    finally:
        obs.close()

    metrics, warnings = summarize_steps(cfg.batch_size * world_size, repeats)
    units = dict(STEP_UNITS)
    w = workloads.get(cfg.model)
    fl = workload_flops(w, cfg.image_size)
    achieved = fl["train"] * metrics["throughput"]
    peak, peak_source, isa_peak = _peak_flops(device, cfg.precision, system)
    metrics.update({
        "flops_per_sample": fl["train"],
        "flops_per_sample_forward": fl["forward"],
        "achieved_flops": achieved,
        "peak_flops": peak,
        "peak_flops_source": peak_source,
        "peak_flops_isa_estimate": isa_peak,
        "mfu": mfu(achieved / world_size, peak),
        "peak_memory_bytes": peak_mem,
        "peak_memory_kind": peak_kind,
        "loss_first": losses[0][0],
        "loss_last": losses[-1][-1],
        "world_size": world_size,
    })
    units.update({
        "flops_per_sample": "FLOP", "flops_per_sample_forward": "FLOP", "achieved_flops": "FLOP/s",
        "peak_flops": "FLOP/s", "peak_flops_isa_estimate": "FLOP/s", "mfu": "fraction",
        "peak_memory_bytes": "bytes", "loss_first": "nats", "loss_last": "nats", "world_size": "ranks",
    })
    if cfg.compile and cfg.warmup_steps == 0:
        warnings.append("--compile with --warmup-steps 0: compilation time is inside the measured window")
    if metrics["mfu"] is None and peak is None:
        warnings.append(peak_source)
    x_metrics, x_units, x_raw, x_warnings = obs.outcome()
    metrics.update(x_metrics)
    units.update(x_units)
    warnings.extend(x_warnings)
    return Outcome(
        metrics=metrics,
        units=units,
        raw={"step_times_s": repeats, "loss": losses, **x_raw},
        warnings=warnings,
        config={"device_name": _device_name(device), "sample_unit": w.sample_unit,
                "data_source": cfg.data or "synthetic"},
    )


def _device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from dlscale.system import cpu_info

    return cpu_info().get("model") or "cpu"
