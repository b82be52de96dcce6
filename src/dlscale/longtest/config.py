"""Typed, validated configuration of a train-to-target (time to accuracy) run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from dlscale.config import check_choice
from dlscale.workloads.base import check_image_size
from dlscale.errors import UsageError

OPTIMIZERS = ("sgd", "lars")
PRECISIONS = ("fp32", "tf32", "bf16")
DEVICES = ("auto", "cpu", "cuda")

# Fields that say how a run is executed or recorded, not what it trains: two runs that differ
# only in these are "the same config" (the reference for speed-up and for --resume checks).
EXECUTION_FIELDS = frozenset({
    "tag", "mlperf_log", "checkpoint_dir", "resume", "runs", "workers", "nproc_per_node", "nnodes",
    "emulate_nodes", "world_size", "nodes", "devices_per_node", "backend", "launcher", "emulated_nodes",
    "link_bandwidth", "link_latency", "threads_per_rank", "dist_timeout_s", "device_name", "threads",
})


@dataclass(frozen=True)
class TTAConfig:
    model: str
    data: str
    target_top1: float
    target_top5: float | None = None
    max_epochs: int = 90
    eval_every: int = 1
    batch_size: int = 32  # per rank
    image_size: int | None = None  # None: the model's native size
    optimizer: str = "sgd"
    lr: float = 0.1  # per 256 samples of global batch under --lr-scaling linear
    lr_scaling: str = "linear"
    lr_schedule: str = "cosine"
    warmup_epochs: float = 0.0
    end_lr: float = 0.0
    poly_power: float = 2.0
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lars_eta: float = 0.001
    label_smoothing: float = 0.0
    precision: str = "fp32"
    device: str = "auto"
    workers: int = 0
    threads: int | None = None  # torch intra-op threads; None: torch's default
    seed: int = 0
    runs: int = 1
    mlperf_log: str | None = None
    checkpoint_dir: str | None = None
    resume: bool = False
    world_size: int = 1  # ranks of the job: set from its Layout (dlscale.layout) by api.tta
    tag: str | None = None

    def __post_init__(self) -> None:
        from dlscale import workloads

        w = workloads.get(self.model)
        if w.family != "classification":
            raise UsageError(f"dlscale tta trains image classifiers to a top-1 target; {self.model} is a {w.family} "
                             "model (its short test runs with `dlscale train`)")
        for opt, v in (("--target-top1", self.target_top1), ("--target-top5", self.target_top5)):
            if v is not None and not 0 < v <= 1:
                raise UsageError(f"{opt} is a fraction in (0, 1] (0.759 for 75.9%), got {v}")
        for opt, v in (("--max-epochs", self.max_epochs), ("--eval-every", self.eval_every),
                       ("--batch-size", self.batch_size), ("--runs", self.runs), ("world_size", self.world_size)):
            if v <= 0:
                raise UsageError(f"{opt} must be > 0, got {v}")
        if self.image_size is not None:
            check_image_size(w, self.image_size)
        check_choice("--optimizer", self.optimizer, OPTIMIZERS)
        check_choice("--precision", self.precision, PRECISIONS)
        check_choice("--device", self.device, DEVICES)
        if not self.lr > 0:
            raise UsageError(f"--lr must be > 0, got {self.lr}")
        if self.threads is not None and self.threads <= 0:
            raise UsageError(f"--threads must be > 0, got {self.threads}")
        if self.momentum < 0 or self.weight_decay < 0 or self.workers < 0:
            raise UsageError("--momentum, --weight-decay and --workers must be >= 0")
        if not 0 <= self.label_smoothing < 1:
            raise UsageError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.resume and not self.checkpoint_dir:
            raise UsageError("--resume needs --checkpoint-dir (where the run's checkpoints are)")
        if self.runs > 1 and self.resume:
            raise UsageError("--resume continues one run; it cannot be combined with --runs > 1")
        self.schedule()  # validates the schedule options

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def schedule(self):
        from dlscale.longtest.schedules import build_schedule

        return build_schedule(self.lr_schedule, self.lr, self.global_batch, self.lr_scaling, self.max_epochs,
                              self.warmup_epochs, self.end_lr, self.poly_power)

    @property
    def peak_lr(self) -> float:
        """The LR the schedule peaks at, after --lr-scaling (what the optimizer starts from)."""
        return self.schedule().peak

    def lr_rule(self) -> str:
        """How ``peak_lr`` follows from --lr, --lr-scaling and the global batch, with the numbers."""
        from dlscale.longtest.schedules import lr_rule

        return lr_rule(self.lr_schedule, self.lr, self.global_batch, self.lr_scaling)

    def resolve(self, device_type: str) -> "TTAConfig":
        from dlscale import workloads

        if device_type == "cpu" and self.precision == "tf32":
            raise UsageError("--precision tf32 needs a CUDA device; use fp32 or bf16 on CPU")
        native = workloads.get(self.model).native_image_size
        return replace(self, device=device_type, image_size=self.image_size or native)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["global_batch"] = self.global_batch
        return d


def same_config_key(config: dict[str, Any], with_seed: bool = True) -> str:
    """A hash of what a run trains: TTAConfig's fields less EXECUTION_FIELDS (and less the seed for
    the speed-up reference, which may be any run of the same config)."""
    from dataclasses import fields

    from dlscale.record import config_hash

    keep = {f.name for f in fields(TTAConfig)} - EXECUTION_FIELDS - (set() if with_seed else {"seed"})
    return config_hash({k: v for k, v in config.items() if k in keep})
