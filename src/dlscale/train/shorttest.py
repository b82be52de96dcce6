"""The throughput short test: warm-up steps, then measured steps on synthetic data.

``build_setup`` makes the model, optimizer and a device-resident batch and returns the training
step; ``run_short_test`` times it with the harness's ``timed_loop`` once per repeat and turns the
step times into the run's metrics. A distributed caller passes ``wrap_model`` (e.g. DDP) and
``sync``; everything else is shared.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlscale import workloads
from dlscale.config import TrainConfig
from dlscale.errors import UsageError
from dlscale.harness import device as dev
from dlscale.harness import energy_meter as energy
from dlscale.harness.device import device_name
from dlscale.harness.metrics import STEP_UNITS, mfu, summarize_steps
from dlscale.harness.runner import NonFiniteLoss, Outcome
from dlscale.harness.timing import StepCallback, timed_loop
from dlscale.harness.window import Window
from dlscale.peaks import resolve_peak
from dlscale.train.observe import RunObserver

UNITS = {  # the short test's figures besides the step statistics (STEP_UNITS)
    "flops_per_sample": "FLOP", "flops_per_sample_forward": "FLOP", "achieved_flops": "FLOP/s",
    "peak_flops": "FLOP/s", "peak_flops_isa_estimate": "FLOP/s", "mfu": "fraction",
    "peak_memory_bytes": "bytes", "loss_first": "nats", "loss_last": "nats", "world_size": "ranks",
}


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


@dataclass
class Measured:
    """What the measured windows of all repeats produced."""

    step_times: list[list[float]] = field(default_factory=list)  # seconds, one list per repeat
    losses: list[list[float]] = field(default_factory=list)  # the measured steps' losses, per repeat
    peak_memory: int = 0  # bytes, the largest over the repeats
    peak_memory_kind: str = ""
    window: list[dict[str, Any]] = field(default_factory=list)  # how each repeat's window was sized (with a target)


def build_setup(cfg: TrainConfig, device: Any, seed: int, wrap_model: Callable[[Any], Any] | None = None,
                feed: Any = None) -> TrainingSetup:
    """``feed`` (data.train_feed.DeviceFeed) supplies real batches; None: one synthetic device-resident batch.

    ``step`` is made of the same parts the instrumented steps time one by one.
    """
    import torch

    w = workloads.get(cfg.model)
    torch.manual_seed(seed)
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = w.build(cfg).to(device)
    if w.images_in:
        model = model.to(memory_format=memory_format)
    model.train()
    if cfg.activation_checkpointing:
        checkpoint_blocks(w, model)
    if wrap_model is not None:
        model = wrap_model(model)
    opt = _optimizer(cfg, model)
    fwd = torch.compile(model, mode=cfg.compile_mode) if cfg.compile else model  # mode None: "default"
    graphs = cfg.compile_mode == "reduce-overhead"  # CUDA graph trees: each step starts a new generation
    fetch, to_device, next_batch = _batches(w, cfg, device, seed, memory_format, feed)
    amp_dtype = dev.autocast_dtype(cfg.precision)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    def forward_loss(xb: Any, yb: Any) -> Any:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            return w.forward_loss(fwd, xb, yb)

    def backward(loss: Any) -> None:
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def optimizer_step() -> None:
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    def step() -> Any:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(*next_batch())
        backward(loss)
        optimizer_step()
        return loss.detach()

    return TrainingSetup(model=model, optimizer=opt, step=step, fetch=fetch, to_device=to_device,
                         forward_loss=forward_loss, backward=backward, optimizer_step=optimizer_step)


def checkpoint_blocks(w: Any, model: Any) -> None:
    """Recompute each repeated block's activations in backward instead of keeping them (activation checkpointing)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    blocks = w.block_types(model)
    if not blocks:
        raise UsageError(f"--activation-checkpointing needs a model made of repeated blocks; {w.name} names none")
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, blocks))


def _optimizer(cfg: TrainConfig, model: Any) -> Any:
    """SGD with momentum or AdamW; ``optimizer_impl`` picks torch's multi-tensor (foreach) or fused kernels
    (both run on CPU and CUDA in torch >= 2.4), "default" lets torch choose."""
    import torch

    lr = cfg.lr if cfg.lr is not None else workloads.get(cfg.model).default_lr
    impl = {cfg.optimizer_impl: True} if cfg.optimizer_impl != "default" else {}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **impl)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay, **impl)


def _batches(w: Any, cfg: TrainConfig, device: Any, seed: int, memory_format: Any,
             feed: Any) -> tuple[Callable[[], Any], Callable[[Any, Any], Any], Callable[[], Any]]:
    """(fetch a host batch, move it to the device, the next device batch): the feed's, or one synthetic batch."""
    if feed is not None:
        return feed.fetch, feed.to_device, feed
    x, y = w.make_batch(cfg, device, seed=seed)
    if w.images_in:
        x = x.contiguous(memory_format=memory_format)
    fetch = lambda: (x, y)  # noqa: E731 - already on the device: the same batch every step
    return fetch, (lambda a, b: (a, b)), fetch


def _peak_memory(device: Any) -> tuple[int, str]:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_peak_rss"


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

    Samples per step are ``units_per_batch * world_size`` (sample units of a rank's batch times data-parallel
    ranks); a distributed caller passes per-rank step times through its own aggregation.
    """
    with dev.run_flags(cfg.precision, device, cfg.cudnn_benchmark):  # restored after the run
        obs = RunObserver(cfg, device, world_size)  # monitor + real-data feed; closed whatever happens
        try:
            done = _measure(cfg, device, obs, on_step, wrap_model, sync)
        finally:
            obs.close()
        flags = dev.backend_flags()  # as the run ran: the config records them

    w = workloads.get(cfg.model)
    metrics, warnings = summarize_steps(w.units_per_batch(cfg) * world_size, done.step_times)
    units = {**STEP_UNITS, **UNITS}
    flops, peak_note = _flops_figures(cfg, device, system, metrics["throughput"], world_size)
    metrics.update(flops)
    metrics.update({"peak_memory_bytes": done.peak_memory, "peak_memory_kind": done.peak_memory_kind,
                    "loss_first": done.losses[0][0], "loss_last": done.losses[-1][-1], "world_size": world_size})
    if cfg.compile and cfg.warmup_steps == 0:
        warnings.append("--compile with --warmup-steps 0: compilation time is inside the measured window")
    if peak_note:
        warnings.append(peak_note)
    x_metrics, x_units, x_raw, x_warnings = obs.outcome()
    metrics.update(x_metrics)
    units.update(x_units)
    warnings.extend(x_warnings)
    reading = obs.meter.reading(_rank_label(device, world_size))
    if sync is None:  # a process of its own: its reading is the run's
        e_metrics, e_units, e_raw = energy.figures(reading, metrics["samples_per_step"] * metrics["measured_steps"],
                                                   w.sample_unit)
        metrics.update(e_metrics)
        units.update(e_units)
        x_raw.update(e_raw)
    else:  # a rank of a job (one rank too): rank 0 sums the ranks' readings (distributed/worker.py) and drops this
        x_raw["energy_reading"] = reading
    return Outcome(
        metrics=metrics,
        units=in_sample_unit(units, w.sample_unit),
        raw={"step_times_s": done.step_times, "loss": done.losses, **x_raw,
             **({"window": done.window} if done.window else {})},
        warnings=warnings,
        config={"device_name": device_name(device), "sample_unit": w.sample_unit, "family": w.family,
                "units_per_batch": w.units_per_batch(cfg), "data_source": cfg.data or "synthetic",
                "backend_flags": flags},
    )


def _rank_label(device: Any, world_size: int) -> str:
    """How a rank's devices are named in a job's energy reading ("" for a one-process run)."""
    if world_size == 1:
        return ""
    import socket

    import torch.distributed as dist

    return f"rank {dist.get_rank()}" if device.type == "cuda" else f"host {socket.gethostname()}"


def in_sample_unit(units: dict[str, str], sample_unit: str) -> dict[str, str]:
    """The units with generic 'samples' named in the family's unit (images/s, tokens/s, samples/s)."""
    named = {"samples/s": f"{sample_unit}/s", "samples": sample_unit}
    return {k: named.get(v, v) for k, v in units.items()}


def _measure(cfg: TrainConfig, device: Any, obs: RunObserver, on_step: StepCallback | None,
             wrap_model: Callable[[Any], Any] | None, sync: Callable[[], None] | None) -> Measured:
    """Each repeat: a fresh setup seeded ``seed + r``, warm-up then measured steps; the last is explained."""
    import torch

    done = Measured()
    window = Window(cfg.min_duration_s, agree=_agree(device) if sync is not None else None)
    for r in range(cfg.repeat):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        setup = build_setup(cfg, device, seed=cfg.seed + r, wrap_model=wrap_model, feed=obs.feed)
        times, outs = timed_loop(setup.step, cfg.warmup_steps, cfg.steps, device, on_step, sync, obs.meter, window)
        obs.end_window(times)
        losses = _finite_losses(outs, r)
        done.step_times.append(times)
        done.losses.append(losses)
        mem, done.peak_memory_kind = _peak_memory(device)
        done.peak_memory = max(done.peak_memory, mem)
        if r == cfg.repeat - 1:
            obs.explain(setup)  # phase breakdown, loader rate, verdict, profile: after the window
        del setup
    done.window = window.sizings
    return done


def _agree(device: Any) -> Callable[[int], int]:
    """The ranks' one count: the largest any rank chose (every rank runs the same steps, each window long enough)."""
    import torch
    import torch.distributed as dist

    def agree(count: int) -> int:
        on = device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([count], dtype=torch.int64, device=on)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    return agree


def _finite_losses(outs: list[Any], repeat: int) -> list[float]:
    """The measured steps' losses as floats; a NonFiniteLoss naming the first bad step."""
    import torch

    step_losses = torch.stack(outs).float().cpu()
    if not torch.isfinite(step_losses).all():
        bad = int((~torch.isfinite(step_losses)).nonzero()[0])
        raise NonFiniteLoss(f"loss became {step_losses[bad].item()} at measured step {bad + 1} of repeat {repeat + 1}")
    return step_losses.tolist()


def _flops_figures(cfg: TrainConfig, device: Any, system: dict[str, Any], throughput: float,
                   world_size: int) -> tuple[dict[str, Any], str | None]:
    """FLOPs per sample, achieved FLOP/s and MFU against the device's peak; the note when MFU is left empty."""
    fl = workloads.get(cfg.model).flops(cfg) or {"train": None, "forward": None, "method": "not counted"}
    achieved = fl["train"] * throughput if fl["train"] is not None else None
    resolved = resolve_peak(device, cfg.precision, system)  # GPUs: datasheet; CPUs: measured GEMM
    peak, peak_source, isa_peak = resolved.flops, resolved.source, resolved.isa_flops
    metrics = {
        "flops_per_sample": fl["train"],
        "flops_per_sample_forward": fl["forward"],
        "flops_method": fl["method"],
        "achieved_flops": achieved,
        "peak_flops": peak,
        "peak_flops_source": peak_source,
        "peak_kind": resolved.kind,
        "peak_flops_isa_estimate": isa_peak,
        "mfu": mfu(achieved / world_size, peak) if achieved is not None else None,
    }
    return metrics, (peak_source if metrics["mfu"] is None and peak is None else None)
