"""Typed, validated configuration of a train-to-target (time to accuracy) run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from dlscale.config import check_choice
from dlscale.errors import UsageError
from dlscale.workloads.base import check_image_size

OPTIMIZERS = ("sgd", "lars", "adam", "adamw")
LATER_FIELDS = frozenset({"target", "seq_len", "tokenizer"})
CLASSIFICATION_DEFAULTS = {"max_epochs": 90, "batch_size": 32, "optimizer": "sgd", "lr": 0.1, "lr_scaling": "linear",
                           "lr_schedule": "cosine", "weight_decay": 1e-4}
PRECISIONS = ("fp32", "tf32", "bf16")
DEVICES = ("auto", "cpu", "cuda")

# Fields that say how a run is executed or recorded, not what it trains: two runs that differ
# only in these are "the same config" (the reference for speed-up and for --resume checks).
EXECUTION_FIELDS = frozenset({
    "tag", "mlperf_log", "force", "checkpoint_dir", "resume", "runs", "workers", "nproc_per_node", "nnodes",
    "emulate_nodes", "world_size", "nodes", "devices_per_node", "backend", "launcher", "emulated_nodes",
    "link_bandwidth", "link_latency", "threads_per_rank", "dist_timeout_s", "device_name", "threads",
    "node_link_bandwidth", "node_cpu_quota",
})


@dataclass(frozen=True)
class TTAConfig:
    model: str
    data: str | None = None  # a dataset directory; for reinforcement learning a gymnasium environment id
    target_top1: float | None = None  # image classification's target
    target_top5: float | None = None
    target: float | None = None  # other families: the target of their task's quality metric (None: its default)
    max_epochs: int | None = None  # None: 90 for classification, the task's default otherwise
    eval_every: int = 1
    batch_size: int | None = None  # per rank; None: 32 for classification, the task's default otherwise
    image_size: int | None = None  # None: the model's native size
    optimizer: str | None = None  # None: sgd for classification, the task's default otherwise
    lr: float | None = None  # classification: per 256 samples of global batch under --lr-scaling linear
    lr_scaling: str | None = None  # None: linear for classification, none otherwise
    lr_schedule: str | None = None  # None: cosine for classification, the task's default otherwise
    warmup_epochs: float = 0.0
    end_lr: float = 0.0
    poly_power: float = 2.0
    momentum: float = 0.9
    weight_decay: float | None = None  # None: 1e-4 for classification, the task's default otherwise
    lars_eta: float = 0.001
    label_smoothing: float = 0.0
    precision: str = "fp32"
    device: str = "auto"
    workers: int = 0
    threads: int | None = None  # torch intra-op threads; None: torch's default
    seed: int = 0
    runs: int = 1
    mlperf_log: str | None = None
    force: bool = False  # replace an existing --mlperf-log (never a database)
    checkpoint_dir: str | None = None
    resume: bool = False
    world_size: int = 1  # ranks of the job: set from its Layout (dlscale.layout) by api.tta
    seq_len: int | None = None  # LLM context length (None: the task's default)
    tokenizer: str | None = None  # a local tokenizer file (translation, LLM); None: DATA/tokenizer.json
    tag: str | None = None

    def __post_init__(self) -> None:
        from dlscale import workloads

        w = workloads.get(self.model)
        from dlscale import limits

        if self.force and not self.mlperf_log:
            raise UsageError("--force replaces an existing --mlperf-log: give --mlperf-log FILE, or drop --force")
        limits.fields(self, skip=("target", "target_top1", "target_top5"))  # refused below, naming the metric
        limits.at_most("--max-epochs", self.max_epochs, limits.EPOCHS, "epochs of one run")
        limits.limit("--batch-size", self.batch_size)
        limits.at_most("--runs", self.runs, limits.REPEAT, "runs of the test")
        limits.at_most("--seq-len", self.seq_len, limits.TOKENS, "tokens of a sequence")
        defaults = _classification_checks(self) if w.family == "classification" else _task_checks(self, w.family)
        for name, value in defaults.items():  # a frozen dataclass: fill the family's defaults in place
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        for opt, v in (("--max-epochs", self.max_epochs), ("--eval-every", self.eval_every),
                       ("--batch-size", self.batch_size), ("--runs", self.runs), ("world_size", self.world_size)):
            if v <= 0:
                raise UsageError(f"{opt} must be > 0, got {v}")
        if self.image_size is not None and w.family == "classification":
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
    def family(self) -> str:
        from dlscale import workloads

        return workloads.get(self.model).family

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def schedule(self):
        from dlscale.tta.schedules import build_schedule

        return build_schedule(self.lr_schedule, self.lr, self.global_batch, self.lr_scaling, self.max_epochs,
                              self.warmup_epochs, self.end_lr, self.poly_power)

    @property
    def peak_lr(self) -> float:
        """The LR the schedule peaks at, after --lr-scaling (what the optimizer starts from)."""
        return self.schedule().peak

    def lr_rule(self) -> str:
        """How ``peak_lr`` follows from --lr, --lr-scaling and the global batch, with the numbers."""
        from dlscale.tta.schedules import lr_rule

        return lr_rule(self.lr_schedule, self.lr, self.global_batch, self.lr_scaling)

    def resolve(self, device_type: str) -> "TTAConfig":
        from dlscale import workloads

        if device_type == "cpu" and self.precision == "tf32":
            raise UsageError("--precision tf32 needs a CUDA device; use fp32 or bf16 on CPU")
        w = workloads.get(self.model)
        if w.family != "classification":
            return replace(self, device=device_type)
        return replace(self, device=device_type, image_size=self.image_size or w.native_image_size)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["global_batch"] = self.global_batch
        return d


def _classification_checks(cfg: TTAConfig) -> dict[str, Any]:
    """Image classification trains to top-1 (and top-5) on an ImageNet-layout tree; its defaults."""
    if cfg.target is not None:  # --target is top-1 for a classifier
        if cfg.target_top1 is not None:
            raise UsageError("give --target-top1 or --target, not both")
        object.__setattr__(cfg, "target_top1", cfg.target)
        object.__setattr__(cfg, "target", None)
    if cfg.target_top1 is None:
        raise UsageError(f"{cfg.model} is an image classifier: give --target-top1 (a fraction, 0.759 for 75.9%)")
    if cfg.data is None:
        raise UsageError("--data is required: ROOT with ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg")
    for opt, v in (("--target-top1", cfg.target_top1), ("--target-top5", cfg.target_top5)):
        if v is not None and not 0 < v <= 1:
            raise UsageError(f"{opt} is a fraction in (0, 1] (0.759 for 75.9%), got {v}")
    for opt, v in (("--seq-len", cfg.seq_len), ("--tokenizer", cfg.tokenizer)):
        if v is not None:
            raise UsageError(f"{opt} does not apply to {cfg.model} (an image classifier)")
    if cfg.optimizer in ("adam", "adamw"):
        raise UsageError(f"--optimizer {cfg.optimizer}: image classifiers train with sgd or lars here")
    return dict(CLASSIFICATION_DEFAULTS)


def _task_checks(cfg: TTAConfig, family: str) -> dict[str, Any]:
    """Another family trains to its task's quality metric (domains/FAMILY/task.py); that task's defaults."""
    from dlscale.tta import tasks

    task = tasks.get(family)
    task.check_model(cfg.model)
    if cfg.target_top1 is not None or cfg.target_top5 is not None:
        raise UsageError(f"--target-top1/--target-top5 are for image classifiers; {cfg.model} ({family}) trains to "
                         f"{task.metric_label}: use --target (default {task.default_target:g})")
    if cfg.target is not None:
        task.check_target(cfg.target)
    if cfg.data is None and task.default_data is None:
        raise UsageError(f"--data is required for {family} (`dlscale dataset {family} DIR` makes a small one)")
    if cfg.optimizer == "lars":
        raise UsageError("--optimizer lars is for image classifiers; use sgd, adam or adamw")
    if cfg.lr_scaling not in (None, "none"):
        raise UsageError(f"--lr-scaling {cfg.lr_scaling}: {family} runs take --lr as the peak LR (--lr-scaling none)")
    if cfg.image_size is not None or cfg.label_smoothing:
        raise UsageError(f"--image-size and --label-smoothing are for image classifiers, not {cfg.model}")
    if cfg.seq_len is not None and (family != "llm" or cfg.seq_len <= 0):
        raise UsageError(f"--seq-len applies to LLMs and must be > 0 (got {cfg.seq_len} for a {family} model)")
    return {"data": task.default_data, "target": task.default_target, "max_epochs": task.default_max_epochs,
            "batch_size": task.default_batch_size, "optimizer": task.default_optimizer, "lr": task.default_lr,
            "lr_scaling": "none", "lr_schedule": task.default_lr_schedule,
            "weight_decay": task.default_weight_decay, "seq_len": getattr(task, "default_seq_len", None)}


def same_config_key(config: dict[str, Any], with_seed: bool = True) -> str:
    """A hash of what a run trains: TTAConfig's fields less EXECUTION_FIELDS (and less the seed for
    the speed-up reference, which may be any run of the same config)."""
    from dataclasses import fields

    from dlscale.record import config_hash

    keep = {f.name for f in fields(TTAConfig)} - EXECUTION_FIELDS - (set() if with_seed else {"seed"})
    # fields added for other families hash only when set, so classification keys stay as they were
    return config_hash({k: v for k, v in config.items() if k in keep and not (k in LATER_FIELDS and v is None)})
