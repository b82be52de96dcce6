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
PARALLELS = ("ddp", "fsdp")  # data parallelism: replicated (DDP) or fully sharded (FSDP2)


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
    warmup_steps: int = 10
    steps: int = 100
    optimizer: str = "sgd"
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
    strict: bool = False  # an unreadable image fails the run instead of being skipped
    monitor_interval: float = 1.0  # seconds between resource samples; 0 turns the monitor off
    breakdown_steps: int = 10  # instrumented steps after the window (phase times); 0 turns them off
    profile: str | None = None  # directory for a torch.profiler trace of profile_steps steps
    profile_steps: int = 5
    # Parallelism of multi-rank runs (distributed/worker.py).
    parallel: str = "ddp"
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        from dlscale import workloads

        w = workloads.get(self.model)  # unknown model -> UsageError listing the known ones
        _positive("--batch-size", self.batch_size)
        _positive("--steps", self.steps)
        _positive("--repeat", self.repeat)
        if self.warmup_steps < 0:
            raise UsageError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        for opt, v in (("--image-size", self.image_size), ("--seq-len", self.seq_len),
                       ("--tokens-per-batch", self.tokens_per_batch), ("--max-table-rows", self.max_table_rows)):
            if v is not None:
                _positive(opt, v)
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
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        if self.workers is not None and self.workers < 0:
            raise UsageError(f"--workers must be >= 0, got {self.workers}")
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
        if device_type == "cpu" and self.precision == "tf32":
            raise UsageError("--precision tf32 needs a CUDA device (TF32 is a tensor-core format); use fp32 or bf16 on CPU")
        from dlscale.harness.device import default_channels_last

        channels_last = self.channels_last
        if channels_last is None:
            channels_last = default_channels_last(device_type, self.precision)
        if self.parallel == "fsdp" and self.channels_last:
            raise UsageError("--parallel fsdp shards contiguous parameters only; drop --channels-last")
        if not w.images_in or self.parallel == "fsdp":
            channels_last = False  # a memory format of 4-D image tensors; nothing to lay out otherwise
        return replace(self, device=device_type, channels_last=channels_last,
                       lr=self.lr if self.lr is not None else w.default_lr, **w.resolve(self))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    """A value outside its choices is a usage error that lists them."""
    if value not in choices:
        raise UsageError(f"unknown {option} {value!r}; choose one of {', '.join(choices)}")


def _positive(option: str, value: int) -> None:
    if value <= 0:
        raise UsageError(f"{option} must be > 0, got {value}")
