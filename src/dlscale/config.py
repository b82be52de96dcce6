"""Typed, validated configuration of a training short test.

``TrainConfig`` is built from CLI options (or a sweep file) and validated at construction:
a bad value raises ``UsageError`` whose message names the option and what to do. Values that
depend on the device ("auto") are resolved by ``resolve()`` once the device is known, and the
resolved config is what the run record stores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from dlscale.errors import UsageError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adamw")
# data parallelism: replicated (DDP) or fully sharded (FSDP2); "none": every rank trains its own model alone
# (no gradient exchange), the short test on every device at once
PARALLELS = ("ddp", "fsdp", "none")
# torch.compile modes; reduce-overhead records CUDA graphs (a GPU feature), max-autotune also does on CUDA.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OPTIMIZER_IMPLS = ("default", "foreach", "fused")  # torch.optim's implementations: for-loop choice, multi-tensor, fused
DDP_FIELDS = (("ddp_bucket_mb", "--ddp-bucket-mb"), ("ddp_grad_as_bucket_view", "--ddp-grad-as-bucket-view"),
              ("ddp_static_graph", "--ddp-static-graph"), ("ddp_broadcast_buffers", "--ddp-broadcast-buffers"))
# dlscale's DDP defaults where none is given (docs/PERFORMANCE.md, "Data-parallel efficiency"): gradients are
# views into the all-reduce buckets (no copy back out of them) and buffers are not re-broadcast every step
# (every rank builds the model from the same seed, and DDP syncs them when it wraps the model)
DDP_DEFAULTS = {"ddp_grad_as_bucket_view": True, "ddp_broadcast_buffers": False}


@dataclass(frozen=True)
class TrainConfig:
    model: str
    batch_size: int = 32
    image_size: int | None = None  # image families; None: the model's native size
    seq_len: int | None = None  # token families (llm, translation); None: the model's default
    tokens_per_batch: int | None = None  # translation: target tokens per rank's batch; None: the default
    model_config: str | None = None  # llm: a local Llama-family config.json instead of a named size
    max_table_rows: int | None = None  # recommendation: cap on the rows of each embedding table; None: the model's
    precision: str = "fp32"
    channels_last: bool | None = None  # None: the fast default for the device
    compile: bool = False
    compile_mode: str | None = None  # a torch.compile mode (COMPILE_MODES); giving one implies compile
    cudnn_benchmark: bool = True  # cuDNN's autotuner: a step's shapes are fixed (harness.device.run_flags)
    warmup_steps: int = 10
    steps: int = 100
    min_duration_s: float | None = None  # the measured window lasts at least this (steps from a probe; harness/window.py)
    optimizer: str = "sgd"
    optimizer_impl: str = "default"  # default | foreach | fused (torch.optim's foreach=True / fused=True)
    lr: float | None = None  # None: the model's default (0.01 for most; Workload.default_lr)
    momentum: float = 0.9
    weight_decay: float = 1e-4
    device: str = "auto"
    repeat: int = 1
    seed: int = 0
    tag: str | None = None
    # Input pipeline, monitoring and the step breakdown (dlscale/data, dlscale/monitor).
    data: str | None = None  # ImageNet-layout JPEG tree; None: synthetic device-resident batch
    workers: int | None = None  # DataLoader workers; None: one per core left (data.loader.default_workers)
    pin_memory: bool | None = None  # --data: page-locked host batches; None: on with CUDA (refused on CPU)
    prefetch_factor: int | None = None  # --data: batches each worker loads ahead; None: torch's default (2)
    strict: bool = False  # an unreadable image fails the run instead of being skipped
    monitor_interval: float = 1.0  # seconds between resource samples; 0 turns the monitor off
    breakdown_steps: int = 10  # instrumented steps after the window (phase times); 0 turns them off
    profile: str | None = None  # directory for a torch.profiler trace of profile_steps steps
    profile_steps: int = 5
    # Parallelism of multi-rank runs (distributed/worker.py).
    parallel: str = "ddp"
    activation_checkpointing: bool = False
    ddp_bucket_mb: float | None = None  # DDP's bucket_cap_mb (gradients all-reduced per bucket); None: torch's 25
    ddp_grad_as_bucket_view: bool | None = None  # DDP gradient_as_bucket_view; None: dlscale's True (DDP_DEFAULTS)
    ddp_static_graph: bool = False  # DDP static_graph: the same parameters are used every step
    ddp_broadcast_buffers: bool | None = None  # DDP re-broadcasts buffers every forward; None: dlscale's False
    # The data-parallel efficiency's reference (distributed/dpref.py): None finds one in the store, "none"
    # asks for none, else the run id (or a prefix) of the same training alone
    dp_reference: str | None = None

    def __post_init__(self) -> None:
        from dlscale import workloads

        w = workloads.get(self.model)  # unknown model -> UsageError listing the known ones
        from dlscale import limits

        limits.fields(self)  # NaN/inf floats, whole numbers past any option (--lr inf would fail at step 1)
        _positive("--batch-size", self.batch_size)
        _positive("--steps", self.steps)
        _positive("--repeat", self.repeat)
        if self.warmup_steps < 0:
            raise UsageError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        for opt, v in (("--image-size", self.image_size), ("--seq-len", self.seq_len),
                       ("--tokens-per-batch", self.tokens_per_batch), ("--max-table-rows", self.max_table_rows)):
            if v is not None:
                _positive(opt, v)
        self._check_limits()
        w.check(self)  # shape fields that do not apply to the family, sizes it cannot take
        check_choice("--parallel", self.parallel, PARALLELS)
        if self.data is not None and w.family != "classification":
            raise UsageError(f"--data reads an ImageNet-layout tree for classification models; {self.model} is a "
                             f"{w.family} model and trains on synthetic batches here")
        check_choice("--precision", self.precision, PRECISIONS)
        check_choice("--device", self.device, DEVICES)
        check_choice("--optimizer", self.optimizer, OPTIMIZERS)
        if self.lr is not None and not self.lr > 0:
            raise UsageError(f"--lr must be > 0, got {self.lr}")
        self._check_knobs()
        self._check_pipeline()

    def _check_limits(self) -> None:
        """Counts past any real run (``limits``): a slip, refused before anything runs."""
        from dlscale import limits

        for opt, v in (("--steps", self.steps), ("--warmup-steps", self.warmup_steps),
                       ("--breakdown-steps", self.breakdown_steps), ("--profile-steps", self.profile_steps)):
            limits.at_most(opt, v, limits.STEPS, "steps of one short test")
        limits.at_most("--repeat", self.repeat, limits.REPEAT, "repeats of the short test")
        limits.limit("--batch-size", self.batch_size)
        from dlscale.harness.window import check_min_duration

        check_min_duration("--min-duration", self.min_duration_s)
        limits.at_most("--seq-len", self.seq_len, limits.TOKENS, "tokens of a sequence")

    def _check_knobs(self) -> None:
        """Compile mode, optimizer implementation and DDP options: known values, the right parallelism."""
        if self.compile_mode is not None:
            check_choice("--compile-mode", self.compile_mode, COMPILE_MODES)
            object.__setattr__(self, "compile", True)  # a mode is a way of compiling
        check_choice("--optimizer-impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        if self.ddp_bucket_mb is not None and not self.ddp_bucket_mb > 0:
            raise UsageError(f"--ddp-bucket-mb must be > 0 (MiB per gradient bucket), got {self.ddp_bucket_mb}")
        if self.parallel != "ddp":
            for name, flag in DDP_FIELDS:
                if getattr(self, name) not in (None, False):
                    raise UsageError(f"{flag} is a DistributedDataParallel option; --parallel {self.parallel} has no "
                                     "buckets: drop it or use --parallel ddp")
        if self.parallel == "none" and self.dp_reference not in (None, "none"):
            raise UsageError("--dp-reference is the training alone a data-parallel run is held to; --parallel none "
                             "trains alone: drop it")

    def _check_pipeline(self) -> None:
        if self.workers is not None and self.workers < 0:
            raise UsageError(f"--workers must be >= 0, got {self.workers}")
        for flag, v in (("--pin-memory", self.pin_memory), ("--prefetch-factor", self.prefetch_factor)):
            if v is not None and self.data is None:
                raise UsageError(f"{flag} is an input-pipeline option of --data (synthetic batches are made on the "
                                 "device); drop it or give --data DIR")
        if self.prefetch_factor is not None:
            _positive("--prefetch-factor", self.prefetch_factor)
            if self.workers == 0:
                raise UsageError("--prefetch-factor needs --workers >= 1 (worker processes load batches ahead; "
                                 "--workers 0 decodes in the training process)")
        if self.monitor_interval < 0:
            raise UsageError(f"--monitor-interval must be >= 0 seconds (0 turns the monitor off), got {self.monitor_interval}")
        if self.breakdown_steps < 0:
            raise UsageError(f"--breakdown-steps must be >= 0, got {self.breakdown_steps}")
        _positive("--profile-steps", self.profile_steps)
        if self.data is not None:
            from pathlib import Path

            if not (Path(self.data) / "train").is_dir():
                raise UsageError(f"--data {self.data}: no {Path(self.data) / 'train'} directory; expected the ImageNet "
                                 "layout DIR/train/<class>/*.jpg (make one with `dlscale dataset make DIR`)")
            object.__setattr__(self, "data", str(Path(self.data).resolve()))  # the record names the tree wherever it ran

    def resolve(self, device_type: str) -> "TrainConfig":
        """Fill the 'auto' values for a device type ('cpu' or 'cuda') and check the precision."""
        from dlscale import workloads

        w = workloads.get(self.model)
        if device_type == "cpu":
            self._check_cpu()
        from dlscale.harness.device import default_channels_last

        channels_last = self.channels_last
        if channels_last is None:
            channels_last = default_channels_last(device_type, self.precision)
        if self.parallel == "fsdp" and self.channels_last:
            raise UsageError("--parallel fsdp shards contiguous parameters only; drop --channels-last")
        self._require_features()
        if not w.images_in or self.parallel == "fsdp":
            channels_last = False  # a memory format of 4-D image tensors; nothing to lay out otherwise
        pin = self.pin_memory if self.pin_memory is not None or self.data is None else device_type == "cuda"
        return replace(self, device=device_type, channels_last=channels_last, pin_memory=pin,
                       lr=self.lr if self.lr is not None else w.default_lr, **self._ddp_resolved(), **w.resolve(self))

    def _ddp_resolved(self) -> dict[str, Any]:
        """DDP's switches as the run records them: the given ones, else dlscale's (``DDP_DEFAULTS``) under
        --parallel ddp; off where nothing is wrapped in DDP."""
        return {k: (getattr(self, k) if getattr(self, k) is not None else v) if self.parallel == "ddp" else False
                for k, v in DDP_DEFAULTS.items()}

    def _require_features(self) -> None:
        """Options the installed torch cannot serve: one line naming the release they need (compat)."""
        from dlscale import compat

        if self.parallel == "fsdp":
            compat.require("fsdp2", "--parallel fsdp")
        if self.compile:
            compat.require("compile", "--compile")

    def _check_cpu(self) -> None:
        """Options that need a GPU are refused on CPU rather than silently doing nothing there."""
        if self.precision == "tf32":
            raise UsageError("--precision tf32 needs a CUDA device (TF32 is a tensor-core format); use fp32 or bf16 on CPU")
        if self.compile_mode == "reduce-overhead":
            raise UsageError("--compile-mode reduce-overhead records CUDA graphs and needs a CUDA device (on CPU "
                             "torch.compile skips them); use --compile-mode default or max-autotune on CPU")
        if self.pin_memory:
            raise UsageError("--pin-memory needs a CUDA device (page-locked host memory speeds copies to a GPU; "
                             "a CPU run has no copy); drop it on CPU")

    def check_layout(self, distributed: bool) -> None:
        """DDP's options and the efficiency's reference apply to runs of several ranks (DDP wraps the model
        only there)."""
        if distributed:
            return
        for name, flag in (*DDP_FIELDS, ("dp_reference", "--dp-reference")):
            if getattr(self, name) not in (None, False, "none"):
                raise UsageError(f"{flag} applies to data-parallel runs of several ranks (DDP wraps the model only "
                                 "there); add --nproc-per-node N or drop it")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    """A value outside its choices is a usage error that lists them."""
    if value not in choices:
        raise UsageError(f"unknown {option} {value!r}; choose one of {', '.join(choices)}")


def _positive(option: str, value: int) -> None:
    if value <= 0:
        raise UsageError(f"{option} must be > 0, got {value}")
